"""Tenancy and access against a real kvidxd over real HTTP: bearer tokens
(401 and 403 with their shapes and headers, open routes, trailers never
count), two tenants, a read-only token, an empty-salt token and an admin;
another tenant's keys indistinguishable from absent (byte for byte for GET,
and in listings, page tokens, lookups, prefetches, handles, loads and
stats); writes naming another salt 403 before and after the key exists;
quotas (eviction of the salt's own least recent copies only, 507, failed
loads); SIGHUP reloads (new token valid within 2 s, removed token 401, a
broken file keeps the old set); no token in logs or metrics; and the
refusal to listen off loopback without auth.
"""

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Conn, Daemon, kvidxd_path  # noqa: E402

SA, SB = "tenantA", "tenantB"


def tok():
    return "t" + secrets.token_urlsafe(30)


def key(h, salt=None, model="m", group=0, rank=0):
    k = {"model_name": model, "kv_rank": rank, "object_group_id": group, "chunk_hash_hex": h}
    if salt is not None:
        k["cache_salt"] = salt
    return k


def path_of(h, salt=None, model="m"):
    return "/v1/keys/%s@00000000@0@%s%s" % (model, h, "@" + salt if salt else "")


def auth(t):
    return {"Authorization": "Bearer " + t}


class Tenants(unittest.TestCase):
    """One daemon, these tokens, for every test of the class."""

    settings = {"log_level": "debug"}
    quota = 300

    def tokens_text(self):
        t = self.t
        return ("# tenants\n"
                "%s write salt=%s quota_bytes=%d\n"
                "%s write salt=%s\n"
                "%s read salt=%s\n"
                "%s read\n"
                "%s write salt=\n"
                "%s admin\n" % (t["A"], SA, self.quota, t["B"], SB, t["RA"], SA, t["R"],
                                t["E"], t["ADM"]))

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kvidx-auth-")
        self.t = {n: tok() for n in ("A", "B", "RA", "R", "E", "ADM")}
        self.tokens_path = os.path.join(self.tmp, "tokens")
        self.write_tokens(self.tokens_text())
        s = dict(self.settings)
        s["auth_tokens_file"] = self.tokens_path
        self.d = Daemon(settings=s)

    def tearDown(self):
        try:
            self.assertEqual(self.d.stop(), 0)
        finally:
            self.d.kill()

    def write_tokens(self, text, mode=0o600):
        tmp = self.tokens_path + ".new"
        with open(tmp, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, self.tokens_path)

    def req(self, who, method, path, body=b"", headers=None):
        h = dict(headers or {})
        if who:
            h.update(auth(self.t[who]))
        return self.d.request(method, path, body, h)

    def store(self, who, entries, tier="l1"):
        return self.req(who, "PUT", "/v1/keys", {"tier": tier, "entries": entries})

    def ok_store(self, who, entries, tier="l1"):
        r = self.store(who, entries, tier)
        self.assertEqual(r.status, 200, r)
        return r

    def info(self, h, salt):
        r = self.req("ADM", "GET", path_of(h, salt))
        return r.json() if r.status == 200 else None

    def listing(self, who, query=""):
        r = self.req(who, "GET", "/v1/keys" + query)
        self.assertEqual(r.status, 200, r)
        return r.json()

    def all_keys(self, who, query="?page_size=1"):
        out, q = [], query
        while True:
            j = self.listing(who, q)
            out += [e["key"] for e in j["entries"]]
            if j["next_page_token"] is None:
                return out
            q = query + "&page_token=" + j["next_page_token"]


def same_answer(test, a, b, what):
    """Status line, headers and body equal (no Date-like header is sent)."""
    test.assertEqual((a.version, a.status, a.reason), (b.version, b.status, b.reason), what)
    test.assertEqual(a.headers, b.headers, what)
    test.assertEqual(a.body, b.body, what)


class Access(Tenants):
    def test_401_shape_and_header(self):
        for path in ("/v1/keys", "/no/such/route", "/v1/stats", "/metrics", "/v1/layouts"):
            for h in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic eDp5"},
                      {"Authorization": "Bearer"}, {"Authorization": self.t["R"]}):
                r = self.d.request("GET", path, headers=h)
                self.assertEqual(r.status, 401, (path, h, r))
                self.assertEqual(r.headers.get("www-authenticate"), "Bearer")
                self.assertEqual(r.headers.get("content-type"), "application/problem+json")
                j = r.json()
                self.assertEqual(j["code"], "unauthorized")
                self.assertEqual(j["status"], 401)
        # An unknown path tells nothing without a token: the same answer.
        same_answer(self, self.d.request("GET", "/no/such/route"),
                    self.d.request("GET", "/v1/keys"), "401 of an unknown path")
        self.assertEqual(self.req("R", "GET", "/no/such/route").status, 404)
        # The scheme is case-insensitive.
        r = self.d.request("GET", "/v1/limits", headers={"Authorization": "bEaReR " + self.t["R"]})
        self.assertEqual(r.status, 200, r)

    def test_open_routes(self):
        self.assertEqual(self.d.request("GET", "/livez").status, 200)
        self.assertEqual(self.d.request("GET", "/readyz").status, 200)
        self.assertEqual(self.d.request("GET", "/livez",
                                        headers={"Authorization": "Bearer bad"}).status, 200)

    def test_a_trailer_is_no_authorization(self):
        body = json.dumps({"keys": [key("aa", SA)]}).encode()
        raw = (b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(body) + body +
               b"\r\n0\r\nAuthorization: Bearer " + self.t["ADM"].encode() + b"\r\n\r\n")
        with Conn(self.d) as c:
            c.send(raw)
            r = c.read_response()
        self.assertEqual(r.status, 401, r)
        self.assertEqual(r.headers.get("www-authenticate"), "Bearer")

    def test_403_by_role(self):
        entry = [{"key": key("aa", SA), "size_bytes": 1}]
        layout = {"model_name": "m", "shapes": [[4]], "dtypes": ["int32"]}
        cases = [
            ("R", "PUT", "/v1/keys", {"entries": entry}),
            ("RA", "PUT", "/v1/keys", {"entries": entry}),
            ("RA", "DELETE", path_of("aa", SA), b""),
            ("R", "POST", "/v1/prefetches", {"keys": [key("aa")]}),
            ("R", "DELETE", "/v1/prefetches/1", b""),
            ("R", "POST", "/v1/loads/1", {"loaded": [0]}),
            ("A", "PUT", "/v1/layouts", layout),
            ("B", "DELETE", "/v1/layouts?model_name=m", b""),
        ]
        for who, method, path, body in cases:
            r = self.req(who, method, path, body)
            self.assertEqual(r.status, 403, (who, method, path, r))
            self.assertEqual(r.headers.get("content-type"), "application/problem+json")
            self.assertEqual(r.json()["code"], "forbidden")
            self.assertNotIn(self.t[who].encode(), r.body)
        for who, method, path, body in [
                ("R", "GET", "/v1/keys", b""), ("R", "GET", path_of("aa"), b""),
                ("R", "POST", "/v1/lookup", {"keys": [key("aa")]}),
                ("R", "GET", "/metrics", b""), ("RA", "GET", "/metrics", b""),
                ("R", "GET", "/v1/layouts", b""), ("R", "GET", "/v1/loads", b""),
                ("E", "GET", "/v1/stats", b"")]:
            r = self.req(who, method, path, body)
            self.assertIn(r.status, (200, 404), (who, method, path, r))
        self.assertEqual(self.req("ADM", "PUT", "/v1/layouts", layout).status, 200)
        self.assertEqual(self.req("ADM", "DELETE", "/v1/layouts?model_name=m").status, 204)


class Isolation(Tenants):
    def test_another_tenants_key_is_byte_for_byte_a_key_never_stored(self):
        p = path_of("a1", SA)
        before = self.req("B", "GET", p)
        self.assertEqual(before.status, 404)
        self.ok_store("A", [{"key": key("a1", SA), "size_bytes": 10}])
        self.assertEqual(self.req("A", "GET", p).status, 200)
        self.assertEqual(self.req("RA", "GET", p).status, 200)
        after = self.req("B", "GET", p)
        same_answer(self, before, after, "GET of another tenant's key")
        never = self.req("B", "GET", path_of("a2", SA))
        same_answer(self, never, after, "GET of a key never stored")
        same_answer(self, self.req("E", "GET", p), never, "the empty-salt token")
        # HEAD too.
        h1 = self.req("B", "HEAD", p)
        h2 = self.req("B", "HEAD", path_of("a2", SA))
        same_answer(self, h1, h2, "HEAD")

    def test_listing(self):
        self.ok_store("ADM", [{"key": key("%02x" % i, s), "size_bytes": 1}
                              for i in range(5) for s in (SA, SB, None)])
        a = self.all_keys("A")
        self.assertEqual(len(a), 5)
        self.assertTrue(all(k["cache_salt"] == SA for k in a))
        self.assertEqual(self.all_keys("RA"), a)
        e = self.all_keys("E")
        self.assertEqual(len(e), 5)
        self.assertTrue(all(k["cache_salt"] == "" for k in e))
        self.assertEqual(len(self.all_keys("R")), 15)
        # Another salt's listing is an empty last page, whatever it holds.
        for q in ("?cache_salt=" + SB, "?cache_salt=", "?cache_salt=nosuch"):
            r = self.req("A", "GET", "/v1/keys" + q)
            self.assertEqual(r.status, 200)
            self.assertEqual(r.body, b'{"entries":[],"next_page_token":null}', q)
        self.assertEqual(len(self.all_keys("A", "?cache_salt=" + SA + "&page_size=2")), 5)

    def test_page_tokens_never_cross_salts(self):
        self.ok_store("ADM", [{"key": key("%02x" % i, s), "size_bytes": 1}
                              for i in range(6) for s in (SA, SB)])
        ta = self.listing("A", "?page_size=2")["next_page_token"]
        tadm = self.listing("ADM", "?page_size=2")["next_page_token"]
        self.assertIsNotNone(ta)
        for q in ("", "&cache_salt=" + SA, "&cache_salt=" + SB):
            r = self.req("B", "GET", "/v1/keys?page_size=2&page_token=" + ta + q)
            if r.status == 200:
                self.assertNotIn(SA.encode(), r.body, q)
            else:
                self.assertEqual(r.status, 400, r)
        r = self.req("B", "GET", "/v1/keys?page_size=2&page_token=" + ta)
        self.assertEqual(r.json()["code"], "page_token_mismatch")
        r = self.req("A", "GET", "/v1/keys?page_size=2&page_token=" + tadm)
        self.assertEqual(r.status, 400)
        self.assertEqual(r.json()["code"], "page_token_mismatch")
        r = self.req("B", "GET", "/v1/keys?page_size=2&page_token=" + tadm)
        self.assertEqual(r.status, 400)

    def lookup(self, who, body):
        r = self.req(who, "POST", "/v1/lookup", body)
        self.assertEqual(r.status, 200, r)
        return r

    def test_lookup_key_and_ipc_forms(self):
        # world_size 1, worker 0: kv_rank 1 << 24 | 1 << 8, as the ipc form expands.
        rank = (1 << 24) | (1 << 8)
        keys = [key("a1", SA, rank=rank), key("a2", SA, rank=rank), key("b1", SB, rank=rank),
                key("e1", rank=rank)]
        ipc = {"model_name": "m", "world_size": 1, "worker_id": 0, "cache_salt": SA,
               "chunk_hashes": ["a1", "a2"]}
        b_before = self.lookup("B", {"keys": keys}).body
        b_ipc_before = self.lookup("B", ipc).body
        keys_a = {"keys": keys[:2]}
        b_a_before = self.lookup("B", keys_a).body
        self.ok_store("ADM", [{"key": k, "size_bytes": 1} for k in keys])
        j = self.lookup("A", {"keys": keys}).json()
        self.assertEqual(j["found_indices"], [0, 1])
        self.assertEqual(self.lookup("A", ipc).json()["hit_chunks"], 2)
        j = self.lookup("B", {"keys": keys}).json()
        self.assertEqual(j["found_indices"], [2])
        self.assertEqual(self.lookup("E", {"keys": keys}).json()["found_indices"], [3])
        self.assertEqual(self.lookup("R", {"keys": keys}).json()["found_indices"], [0, 1, 2, 3])
        # The B view of A's keys is the one before they existed.
        self.assertEqual(self.lookup("B", keys_a).body, b_a_before)
        self.assertEqual(self.lookup("B", ipc).body, b_ipc_before)
        self.assertIn(b'"found_indices":[]', b_before)

    def test_prefetch_finds_pins_and_loads_nothing_of_another_salt(self):
        self.ok_store("ADM", [{"key": key("a1", SA), "size_bytes": 1}], tier="l1")
        self.ok_store("ADM", [{"key": key("a2", SA), "size_bytes": 1}], tier="l2")
        r = self.req("B", "POST", "/v1/prefetches",
                     {"keys": [key("a1", SA), key("a2", SA)]})
        self.assertEqual(r.status, 201, r)
        h = r.json()
        self.assertEqual(h["l1_found_indices"], [])
        self.assertEqual(h["l2_orig_indices"], [])
        r = self.req("B", "GET", "/v1/prefetches/%d?wait_ms=2000" % h["id"])
        self.assertEqual(r.json()["found_indices"], [])
        self.assertEqual(r.json()["pinned_keys"], 0)
        self.assertEqual(self.info("a1", SA)["l1"]["pins"], 0)
        self.assertIsNone(self.info("a2", SA)["l1"], "nothing was loaded")
        # ipc form too.
        r = self.req("B", "POST", "/v1/prefetches", {
            "model_name": "m", "world_size": 1, "worker_id": 0, "cache_salt": SA,
            "chunk_hashes": ["a1", "a2"]})
        self.assertEqual(r.json()["l1_found_indices"], [])
        self.assertEqual(r.json()["l2_orig_indices"], [])
        # The tenant itself finds, pins and loads.
        r = self.req("A", "POST", "/v1/prefetches", {"keys": [key("a1", SA), key("a2", SA)]})
        self.assertEqual(r.json()["l1_found_indices"], [0])
        self.assertEqual(r.json()["l2_orig_indices"], [1])

    def test_handles_belong_to_their_salt(self):
        self.ok_store("A", [{"key": key("a1", SA), "size_bytes": 1}])
        h = self.req("A", "POST", "/v1/prefetches", {"keys": [key("a1", SA)]}).json()
        hid = h["id"]
        for who in ("A", "RA", "R", "ADM"):
            self.assertEqual(self.req(who, "GET", "/v1/prefetches/%d" % hid).status, 200, who)
        for who in ("B", "E"):
            for method, path, body in (
                    ("GET", "/v1/prefetches/%d" % hid, b""),
                    ("GET", "/v1/prefetches/%d?wait_ms=10" % hid, b""),
                    ("POST", "/v1/prefetches/%d/release" % hid, b""),
                    ("POST", "/v1/prefetches/%d/extend" % hid, {"lease_ms": 1000}),
                    ("DELETE", "/v1/prefetches/%d" % hid, b"")):
                r = self.req(who, method, path, body)
                self.assertEqual(r.status, 404, (who, method, path, r))
                self.assertEqual(r.json()["code"], "not_found")
        # Still A's, still pinned.
        self.assertEqual(self.req("A", "GET", "/v1/prefetches/%d" % hid).json()["status"],
                         "completed")
        self.assertEqual(self.info("a1", SA)["l1"]["pins"], 1)
        # A handle made by a token without a salt is no tenant's.
        h2 = self.req("ADM", "POST", "/v1/prefetches", {"keys": [key("a1", SA)]}).json()
        self.assertEqual(self.req("A", "GET", "/v1/prefetches/%d" % h2["id"]).status, 404)
        self.assertEqual(self.req("R", "GET", "/v1/prefetches/%d" % h2["id"]).status, 200)

    def test_writes_naming_another_salt(self):
        other = [{"key": key("b1", SB), "size_bytes": 1}]
        mine = [{"key": key("a1", SA), "size_bytes": 1}]
        before = [self.store("A", other), self.req("A", "DELETE", path_of("b1", SB)),
                  self.req("A", "PUT", path_of("b1", SB), {"size_bytes": 1}),
                  self.req("A", "DELETE", "/v1/keys", {"keys": [key("b1", SB)]})]
        self.ok_store("B", other)
        after = [self.store("A", other), self.req("A", "DELETE", path_of("b1", SB)),
                 self.req("A", "PUT", path_of("b1", SB), {"size_bytes": 1}),
                 self.req("A", "DELETE", "/v1/keys", {"keys": [key("b1", SB)]})]
        for b, a in zip(before, after):
            self.assertEqual(b.status, 403, b)
            self.assertEqual(b.json()["code"], "forbidden")
            same_answer(self, b, a, "a write naming another salt")
        self.assertIsNotNone(self.info("b1", SB), "nothing was deleted")
        # A mixed batch stores nothing; a mixed delete deletes nothing.
        r = self.store("A", mine + other)
        self.assertEqual(r.status, 403)
        self.assertIsNone(self.info("a1", SA))
        self.ok_store("A", mine)
        r = self.req("A", "DELETE", "/v1/keys", {"keys": [key("a1", SA), key("b1", SB)]})
        self.assertEqual(r.status, 403)
        self.assertIsNotNone(self.info("a1", SA))
        # The ipc form of a store, and the empty salt.
        r = self.req("A", "PUT", "/v1/keys", {"model_name": "m", "world_size": 1,
                                               "worker_id": 0, "cache_salt": SB,
                                               "chunk_hashes": ["c1"], "size_bytes": 1})
        self.assertEqual(r.status, 403, r)
        self.assertEqual(self.store("A", [{"key": key("e1"), "size_bytes": 1}]).status, 403)
        self.assertEqual(self.store("E", [{"key": key("e1"), "size_bytes": 1}]).status, 200)
        self.assertEqual(self.store("E", [{"key": key("e2", ""), "size_bytes": 1}]).status,
                         200)
        self.assertEqual(self.store("E", mine).status, 403)
        self.assertEqual(self.req("A", "DELETE", path_of("a1", SA)).status, 204)

    def test_stats(self):
        self.ok_store("ADM", [{"key": key("a1", SA), "size_bytes": 10},
                              {"key": key("b1", SB), "size_bytes": 20}])
        j = self.req("ADM", "GET", "/v1/stats").json()
        salts = {s["cache_salt"]: s for s in j["salts"]}
        self.assertEqual(salts[SA]["l1_bytes"], 10)
        self.assertEqual(salts[SA]["quota_bytes"], self.quota)
        self.assertEqual(salts[SB]["l1_bytes"], 20)
        self.assertIn("keys", j)
        for who, salt, l1 in (("A", SA, 10), ("RA", SA, 10), ("B", SB, 20), ("E", "", 0)):
            j = self.req(who, "GET", "/v1/stats").json()
            self.assertEqual(j["salt"]["cache_salt"], salt)
            self.assertEqual(j["salt"]["l1_bytes"], l1)
            self.assertNotIn("salts", j)
            self.assertNotIn("keys", j)
        j = self.req("R", "GET", "/v1/stats").json()
        self.assertNotIn("salts", j)
        self.assertNotIn("salt", j)
        self.assertEqual(j["keys"]["total"], 2)


class Loads(Tenants):
    settings = {"log_level": "debug", "loader": "external"}

    def test_loads_of_another_salt_are_not_there(self):
        self.ok_store("ADM", [{"key": key("a1", SA), "size_bytes": 1}], tier="l2")
        h = self.req("A", "POST", "/v1/prefetches", {"keys": [key("a1", SA)]}).json()
        tasks = self.req("A", "GET", "/v1/loads").json()["tasks"]
        self.assertEqual(len(tasks), 1)
        task = tasks[0]["task"]
        self.assertEqual(self.req("B", "GET", "/v1/loads").json()["tasks"], [])
        self.assertEqual(self.req("R", "GET", "/v1/loads").json()["tasks"][0]["task"], task)
        r = self.req("B", "POST", "/v1/loads/%d" % task, {"loaded": [0]})
        self.assertEqual(r.status, 404, r)
        r = self.req("A", "POST", "/v1/loads/%d" % task, {"loaded": [key("a1", SA)]})
        self.assertEqual(r.status, 200, r)
        r = self.req("A", "GET", "/v1/prefetches/%d?wait_ms=2000" % h["id"])
        self.assertEqual(r.json()["found_indices"], [0])


class Quotas(Tenants):
    def test_eviction_takes_the_salts_own_least_recent_copies(self):
        A = [{"key": key("a%d" % i, SA), "size_bytes": 100} for i in range(6)]
        self.ok_store("A", A[0:1])
        self.ok_store("B", [{"key": key("b1", SB), "size_bytes": 100}])
        self.ok_store("A", A[1:2])
        self.ok_store("A", A[2:3])
        self.ok_store("A", A[0:1])  # a0 is now A's most recent: a1 its least
        self.ok_store("A", A[3:4])
        self.assertIsNone(self.info("a1", SA), "a1 was A's least recent")
        for i in (0, 2, 3):
            self.assertEqual(self.info("a%d" % i, SA)["l1"]["state"], "ready")
        self.assertEqual(self.info("b1", SB)["l1"]["state"], "ready",
                         "B's copy, the oldest of all, is another salt's")
        # Whoever stores: the admin is held to A's quota too.
        self.ok_store("ADM", A[4:5])
        self.assertIsNone(self.info("a2", SA))
        j = self.req("A", "GET", "/v1/stats").json()["salt"]
        self.assertEqual(j["l1_bytes"], 300)
        self.assertEqual(j["quota_evictions"], 2)

    def test_507_when_nothing_can_be_evicted_and_failed_loads(self):
        A = [{"key": key("a%d" % i, SA), "size_bytes": 100} for i in range(5)]
        self.ok_store("A", A[0:3])
        h = self.req("A", "POST", "/v1/prefetches", {"keys": [k["key"] for k in A[0:3]]})
        self.assertEqual(h.status, 201)
        for i in range(3):
            self.assertEqual(self.info("a%d" % i, SA)["l1"]["pins"], 1)
        before = self.req("ADM", "GET", "/v1/keys").body
        for who in ("A", "ADM"):
            r = self.store(who, A[3:4])
            self.assertEqual(r.status, 507, r)
            self.assertEqual(r.json()["code"], "quota_exceeded")
            r = self.store(who, [A[3], {"key": key("b9", SB), "size_bytes": 1}]
                           if who == "ADM" else A[3:5])
            self.assertEqual(r.status, 507, r)
        self.assertEqual(self.req("ADM", "GET", "/v1/keys").body, before, "nothing stored")
        # L2 is not affected.
        self.ok_store("A", [{"key": key("bb", SA), "size_bytes": 1 << 30}], tier="l2")
        # A load over the quota fails and is trimmed like any failed load.
        r = self.req("A", "POST", "/v1/prefetches", {"keys": [key("bb", SA)]})
        self.assertEqual(r.status, 201)
        hid = r.json()["id"]
        self.assertEqual(r.json()["l2_orig_indices"], [0])
        j = self.req("A", "GET", "/v1/prefetches/%d?wait_ms=2000" % hid).json()
        self.assertEqual(j["status"], "completed")
        self.assertEqual(j["found_indices"], [])
        self.assertIsNone(self.info("bb", SA)["l1"])
        # Once released, the pinned copies make room again.
        self.assertEqual(self.req("A", "DELETE", "/v1/prefetches/%d" % h.json()["id"]).status,
                         204)
        self.ok_store("A", A[3:4])


class Reload(Tenants):
    def wait_status(self, token, want, timeout=2.0):
        end = time.monotonic() + timeout
        while True:
            st = self.d.request("GET", "/v1/limits", headers=auth(token)).status
            if st == want or time.monotonic() > end:
                return st
            time.sleep(0.02)

    def test_sighup(self):
        new = tok()
        self.assertEqual(self.req("B", "GET", "/v1/limits").status, 200)
        text = self.tokens_text().replace("%s write salt=%s\n" % (self.t["B"], SB), "")
        self.write_tokens(text + "%s read\n" % new)
        t0 = time.monotonic()
        self.d.reload()
        self.assertEqual(self.wait_status(new, 200), 200)
        self.assertLess(time.monotonic() - t0, 2.0)
        self.assertEqual(self.wait_status(self.t["B"], 401), 401, "a removed token")
        self.assertEqual(self.req("A", "GET", "/v1/limits").status, 200)
        # A broken file keeps the tokens in force, and says where.
        mark = len(self.d.log())
        self.write_tokens("%s read\n%s superuser\n" % (tok(), tok()))
        self.d.reload()
        m = self.d.wait_log(r"line 2: the role must be read, write or admin", 3, mark)
        self.assertIsNotNone(m, self.d.log()[mark:])
        self.assertIsNotNone(self.d.wait_log("keeping the 6 bearer token", 3, mark))
        self.assertEqual(self.d.request("GET", "/v1/limits", headers=auth(new)).status, 200)
        self.assertEqual(self.req("A", "GET", "/v1/limits").status, 200)
        # Quotas follow the file.
        self.write_tokens(self.tokens_text().replace("quota_bytes=%d" % self.quota,
                                                     "quota_bytes=150"))
        self.d.reload()
        self.assertEqual(self.wait_status(self.t["B"], 200), 200)
        j = self.req("A", "GET", "/v1/stats").json()["salt"]
        self.assertEqual(j["quota_bytes"], 150)
        r = self.d.request("GET", "/metrics", headers=auth(self.t["R"]))
        self.assertIn(b"kvidx_auth_reload_failures_total 1", r.body)


class NoSecrets(Tenants):
    def test_no_token_in_the_log_or_metrics(self):
        wrong = tok()
        everyone = list(self.t.values())
        for t in everyone + [wrong]:
            h = auth(t)
            self.d.request("GET", "/v1/keys", headers=h)
            self.d.request("PUT", "/v1/keys", {"entries": [
                {"key": key("aa", SA), "size_bytes": 1}]}, headers=h)
            self.d.request("GET", "/no/such/path", headers=h)
            self.d.request("DELETE", "/v1/layouts?model_name=m", headers=h)
            self.d.request("GET", "/v1/stats", headers=h)
            self.d.request("GET", "/v1/keys?page_token=" + t, headers=h)
            self.d.request("GET", "/v1/keys?cache_salt=" + t[:20], headers=h)
        self.d.request("GET", "/v1/keys", headers={"Authorization": "Bearer " + wrong + ",x"})
        # A reload that fails, and one that works.
        self.write_tokens(self.tokens_text() + "%s root\n" % wrong)
        self.d.reload()
        self.d.wait_log("keeping the", 3)
        self.write_tokens(self.tokens_text())
        self.d.reload()
        time.sleep(0.3)
        metrics = self.d.request("GET", "/metrics", headers=auth(self.t["R"])).body.decode()
        stats = self.d.request("GET", "/v1/stats", headers=auth(self.t["ADM"])).body.decode()
        self.assertIn("kvidx_salt_l1_bytes{salt=", metrics)
        self.assertNotIn('salt="%s"' % SA, metrics, "salts appear as keyed hashes only")
        self.assertNotIn(SA, metrics)
        self.d.stop()
        log = self.d.log()
        self.assertIn("GET /v1/keys", log, "the run logged at debug level")
        for t in everyone + [wrong]:
            for text, what in ((log, "log"), (metrics, "metrics"), (stats, "stats")):
                for i in range(len(t) - 15):
                    self.assertNotIn(t[i:i + 16], text, "%s holds part of a token" % what)


class Startup(unittest.TestCase):
    def run_kvidxd(self, *sets, timeout=10):
        cmd = [kvidxd_path()]
        for s in sets:
            cmd += ["--set", s]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            return None, (out + err).decode()
        return p.returncode, (out + err).decode()

    def test_non_loopback_without_auth_is_refused(self):
        for listen in ("0.0.0.0:0", "[::]:0", "10.0.0.1:8077"):
            rc, text = self.run_kvidxd("listen=" + listen)
            self.assertEqual(rc, 2, text)
            self.assertIn("allow_unauthenticated_remote = yes", text)
            self.assertIn("auth_tokens_file", text)
            self.assertNotIn("listening on", text)

    def check_config(self, *sets):
        cmd = [kvidxd_path(), "--check-config"]
        for s in sets:
            cmd += ["--set", s]
        return subprocess.run(cmd, capture_output=True, timeout=10)

    def test_consent_or_auth_allow_any_address(self):
        # Checked without binding: the tests listen on loopback only.
        self.assertEqual(self.check_config("listen=0.0.0.0:8077").returncode, 2)
        self.assertEqual(self.check_config("listen=0.0.0.0:8077",
                                           "allow_unauthenticated_remote=yes").returncode, 0)
        tmp = tempfile.mkdtemp(prefix="kvidx-auth-")
        path = os.path.join(tmp, "tokens")
        with open(path, "w") as f:
            f.write("%s read\n" % tok())
        os.chmod(path, 0o600)
        self.assertEqual(self.check_config("listen=[::]:8077",
                                           "auth_tokens_file=" + path).returncode, 0)
        self.assertEqual(self.check_config("listen=[::1]:8077").returncode, 0)

    def test_a_token_file_readable_by_others_is_a_warning(self):
        tmp = tempfile.mkdtemp(prefix="kvidx-auth-")
        path = os.path.join(tmp, "tokens")
        t = tok()
        with open(path, "w") as f:
            f.write("%s read\n" % t)
        os.chmod(path, 0o644)
        d = Daemon(settings={"auth_tokens_file": path})
        try:
            self.assertEqual(d.request("GET", "/v1/keys").status, 401)
            self.assertEqual(d.request("GET", "/v1/keys", headers=auth(t)).status, 200)
            self.assertIn("can be read or written by others than its owner", d.log())
            self.assertEqual(d.stop(), 0)
        finally:
            d.kill()

    def test_a_bad_tokens_file_stops_the_start(self):
        tmp = tempfile.mkdtemp(prefix="kvidx-auth-")
        path = os.path.join(tmp, "tokens")
        secret = tok()
        with open(path, "w") as f:
            f.write("# ok\n%s read quota_bytes=1GiB\n" % secret)
        os.chmod(path, 0o600)
        rc, text = self.run_kvidxd("listen=127.0.0.1:0", "auth_tokens_file=" + path)
        self.assertEqual(rc, 2, text)
        self.assertIn("line 2", text)
        self.assertNotIn(secret[:16], text)
        rc, text = self.run_kvidxd("listen=127.0.0.1:0",
                                   "auth_tokens_file=" + os.path.join(tmp, "missing"))
        self.assertEqual(rc, 2, text)
        # --check-config reads the file too.
        p = self.check_config("auth_tokens_file=" + path)
        self.assertEqual(p.returncode, 2, p)
        self.assertIn(b"line 2", p.stderr)
        self.assertNotIn(secret[:16].encode(), p.stdout + p.stderr)
        with open(path, "w") as f:
            f.write("%s read salt=x quota_bytes=1GiB\n" % secret)
        self.assertEqual(self.check_config("auth_tokens_file=" + path).returncode, 0)


if __name__ == "__main__":
    unittest.main()
