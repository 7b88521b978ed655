"""The fleet directory over HTTP (LMCache's coordinator surface): several
emitters written the way LMCache's MP server emits store, access, delete,
restart, time out, replay and skip; after every step /directory/keys and
/directory/lookup must equal a reference model kept here. Also: the
tokens form against hashes computed with b3sum, 422 rules, instances, and
restarts with data_dir (clean and kill -9 under fsync=always)."""

import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon  # noqa: E402
from lmcache_emitter import Emitter, key, post_json  # noqa: E402


def ktuple(k):
    return (k["model_name"], k["kv_rank"], k.get("object_group_id", 0),
            k["chunk_hash_hex"].lower(), k.get("cache_salt", ""))


def kdict(t):
    return {"model_name": t[0], "kv_rank": t[1], "object_group_id": t[2],
            "chunk_hash_hex": t[3], "cache_salt": t[4]}


class Model:
    """LMCache's gate and key directory, as the contract states them."""

    def __init__(self):
        self.keys = {}      # ktuple -> {identity: placement}
        self.cursors = {}   # instance -> [incarnation, last_seq, gap]
        self.tokens = {}    # chunk hash hex -> token list

    @staticmethod
    def identity(b):
        if b["shared"]:
            return (True, "", b["tier"], b["backend"])
        return (False, b["instance_id"], b["tier"], b["backend"])

    def fence(self, inst):
        for kt in list(self.keys):
            pl = self.keys[kt]
            for ident in [i for i, p in pl.items()
                          if p["tier"] == "l1" and p["instance_id"] == inst]:
                del pl[ident]
            if not pl:
                self.forget(kt)

    def forget(self, kt):
        del self.keys[kt]
        if not any(k[3] == kt[3] for k in self.keys):
            self.tokens.pop(kt[3], None)

    def drop_instance(self, inst):
        self.fence(inst)
        self.cursors.pop(inst, None)

    def ingest(self, b):
        inst, inc, seq = b["instance_id"], b["incarnation"], b["seq"]
        c = self.cursors.get(inst)
        if c is not None and inc < c[0]:
            return "stale"
        if c is not None and inc > c[0]:
            self.fence(inst)
            c = None
        if c is None:
            c = self.cursors[inst] = [inc, 0, False]
        if seq <= c[1]:
            return "duplicate"
        if seq > c[1] + 1:
            c[2] = True
        c[1] = seq
        ident = self.identity(b)
        for e in b["entries"]:
            kt = ktuple(e["key"])
            if b["event_type"] == "store":
                self.keys.setdefault(kt, {})[ident] = {
                    "instance_id": inst, "incarnation": inc, "tier": b["tier"],
                    "backend": b["backend"], "size_bytes": e.get("size_bytes", 0),
                    "shared": b["shared"]}
                if e.get("token_ids"):
                    self.tokens[kt[3]] = list(e["token_ids"])
            elif b["event_type"] == "delete":
                pl = self.keys.get(kt)
                if pl is not None:
                    pl.pop(ident, None)
                    if not pl:
                        self.forget(kt)
        return "applied"

    def ingest_request(self, body):
        out = {"applied": 0, "duplicates": 0, "stale": 0}
        for b in body["batches"]:
            v = self.ingest(b)
            out[{"applied": "applied", "duplicate": "duplicates", "stale": "stale"}[v]] += 1
        return out

    def placements(self, kt):
        pl = self.keys.get(kt, {})
        return sorted(pl.values(), key=lambda p: (p["instance_id"], p["tier"], p["backend"],
                                                  p["shared"]))


class FleetBase(unittest.TestCase):
    settings = {}

    def setUp(self):
        self.d = Daemon(settings=self.settings)
        self.h, self.p = "127.0.0.1", self.d.port

    def tearDown(self):
        # A clean stop: exit 0 (in the sanitizer build, no leak and no error).
        try:
            self.assertEqual(self.d.stop(), 0, self.d.log()[-2000:])
        finally:
            self.d.kill()

    def call(self, method, path, body=None):
        return post_json(self.h, self.p, method, path, body)

    def emitter(self, inst, incarnation=1, **kw):
        return Emitter(self.h, self.p, inst, incarnation=incarnation, **kw)

    def all_keys(self, query=""):
        rows, offset = [], 0
        while True:
            st, ans = self.call("GET", "/directory/keys?limit=7&offset=%d%s" % (offset, query))
            self.assertEqual(st, 200, ans)
            rows += ans["keys"]
            offset += 7
            if offset >= ans["total"]:
                self.assertEqual(len(rows), ans["total"])
                return rows

    def check_model(self, m, probe=()):
        rows = self.all_keys()
        got = {ktuple(r["key"]): r for r in rows}
        self.assertEqual(set(got), set(m.keys))
        for kt, r in got.items():
            self.assertEqual(r["placements"], m.placements(kt), kt)
            self.assertEqual(r["num_tokens"], len(m.tokens.get(kt[3], [])), kt)
        # The lookup answers every key of the model and some it does not hold.
        ask = list(m.keys) + [ktuple(k) for k in probe]
        if ask:
            st, ans = self.call("POST", "/directory/lookup", {"keys": [kdict(t) for t in ask]})
            self.assertEqual(st, 200, ans)
            self.assertEqual(ans["chunks"], len(ask))
            for t, res in zip(ask, ans["results"]):
                self.assertEqual(ktuple(res["key"]), t)
                self.assertEqual(res["placements"], m.placements(t), t)
                self.assertEqual(res["token_ids"], m.tokens.get(t[3], []), t)
        # The streams are the model's cursors.
        st, ans = self.call("GET", "/directory/streams")
        self.assertEqual(st, 200)
        streams = {s["instance_id"]: s for s in ans["streams"]}
        self.assertEqual(set(streams), set(m.cursors))
        for inst, c in m.cursors.items():
            s = streams[inst]
            self.assertEqual((s["incarnation"], s["last_seq"], s["gap_detected"]),
                             (c[0], c[1], c[2]), inst)
        st, ans = self.call("GET", "/directory/stats")
        self.assertEqual(ans["num_keys"], len(m.keys))
        self.assertEqual(ans["num_placements"], sum(len(p) for p in m.keys.values()))


class TestFleetModel(FleetBase):
    def flush(self, m, e):
        batches = e._take()
        if not batches:
            return
        body = {"batches": batches}
        e.sent.append(body)
        st, ans = post_json(self.h, self.p, "POST", "/events", body)
        self.assertEqual(st, 200, ans)
        self.assertEqual(ans, m.ingest_request(body))

    def test_random_fleet_against_model(self):
        rnd = random.Random(7)
        m = Model()
        models = ["meta-llama/Llama-3.1-8B", "qwen"]
        hashes = ["%064x" % rnd.getrandbits(256) for _ in range(40)] + ["ab", "abcd" * 4]
        pool = [key(rnd.choice(models), h, kv_rank=rnd.choice([0, 0x01000100]),
                    salt=rnd.choice(["", "alice"])) for h in hashes]
        names = ["mp-a", "mp-b", "mp-c"]
        inc = {n: 1 for n in names}
        em = {n: self.emitter(n, inc[n]) for n in names}
        backends = [("l1", "dram", False), ("l2", "fs", False), ("l2", "s3", True),
                    ("l1", "cxl", True)]
        for step in range(260):
            n = rnd.choice(names)
            e = em[n]
            op = rnd.random()
            if op < 0.45:
                tier, be, shared = rnd.choice(backends)
                k = rnd.choice(pool)
                toks = [rnd.randrange(1 << 32) for _ in range(rnd.choice([0, 3, 16]))]
                e.store(tier, be, k, rnd.randrange(1, 1 << 30), token_ids=toks,
                        token_offset=0, shared=shared)
            elif op < 0.65:
                tier, be, shared = rnd.choice(backends)
                e.delete(tier, be, rnd.choice(pool), shared=shared)
            elif op < 0.70:
                e.access(rnd.choice(["l1", "l2"]), rnd.choice(pool))
            elif op < 0.85:
                self.flush(m, e)
                self.check_model(m, probe=rnd.sample(pool, 3))
            elif op < 0.90:
                # A restart: a higher incarnation, seq from 1 again.
                self.flush(m, e)
                inc[n] += 1
                em[n] = self.emitter(n, inc[n])
                em[n].sent = e.sent
            elif op < 0.95 and e.sent:
                # A replay of something already sent: duplicates, or stale
                # once the instance restarted.
                body = rnd.choice(e.sent)
                st, ans = post_json(self.h, self.p, "POST", "/events", body)
                self.assertEqual(st, 200)
                self.assertEqual(ans, m.ingest_request(body))
                self.assertEqual(ans["applied"], 0, ans)
            else:
                # A lost delivery: its seq numbers are skipped.
                e.skip_flush()
        for e in em.values():
            self.flush(m, e)
        self.check_model(m, probe=pool[:5])

    def test_restart_fences_l1_keeps_l2_and_shared_l1_of_reporter(self):
        m = Model()
        a, b = self.emitter("mp-a", 100), self.emitter("mp-b", 5)
        k1, k2, k3 = key("m", "01" * 32), key("m", "02" * 32), key("m", "03" * 32)
        a.store("l1", "dram", k1, 10)
        a.store("l2", "fs", k1, 10)
        a.store("l1", "cxl", k2, 20, shared=True)
        b.store("l1", "dram", k3, 30)
        b.store("l1", "cxl", k2, 20, shared=True)  # b is now the shared reporter
        self.flush(m, a)
        self.flush(m, b)
        self.check_model(m)
        a2 = self.emitter("mp-a", 101)
        a2.store("l1", "dram", k3, 5)
        self.flush(m, a2)
        self.check_model(m)
        st, ans = self.call("POST", "/directory/lookup", {"keys": [k1, k2]})
        self.assertEqual([p["tier"] for p in ans["results"][0]["placements"]], ["l2"])
        self.assertEqual(ans["results"][1]["placements"][0]["instance_id"], "mp-b")
        # The old incarnation's batches are stale now.
        st, ans = a.replay(0)
        self.assertEqual(ans, {"applied": 0, "duplicates": 0, "stale": 3})

    def test_gap_visible_in_streams(self):
        e = self.emitter("mp-g", 3)
        e.store("l1", "dram", key("m", "aa"), 1)
        e.flush()
        e.store("l1", "dram", key("m", "bb"), 1)
        e.skip_flush()
        st, ans = self.call("GET", "/directory/streams")
        self.assertFalse(ans["streams"][0]["gap_detected"])
        e.store("l1", "dram", key("m", "cc"), 1)
        self.assertEqual(e.flush(), (200, {"applied": 1, "duplicates": 0, "stale": 0}))
        st, ans = self.call("GET", "/directory/streams")
        s = ans["streams"][0]
        self.assertEqual((s["instance_id"], s["incarnation"], s["last_seq"], s["gap_detected"]),
                         ("mp-g", 3, 3, True))
        self.assertEqual(s["applied"], 2)


class TestFleetValidation(FleetBase):
    def batch(self, **kw):
        b = {"instance_id": "mp-v", "incarnation": 1, "seq": 1, "event_type": "store",
             "tier": "l1", "backend": "dram",
             "entries": [{"key": key("m", "aa"), "size_bytes": 1}]}
        b.update(kw)
        return b

    def test_invalid_batch_rejects_whole_request(self):
        bad = [dict(seq=0), dict(incarnation=-1), dict(tier="all"), dict(event_type="evict"),
               dict(backend=""), dict(instance_id=""), dict(shared="yes"), dict(ts=-1),
               dict(event_type="config"),
               dict(entries=[{"key": key("m", "zz"), "size_bytes": 1}]),
               dict(entries=[{"key": dict(key("m", "aa"), chunk_hash="aa")}]),
               dict(entries=[{"key": key("m", "aa"), "token_ids": [1.5]}]),
               dict(entries=[{"key": key("m", "aa"), "token_offset": -2}]),
               dict(entries=[{"key": key("m", "aa"), "size_bytes": -1}])]
        for kw in bad:
            second = self.batch(seq=2)
            second.update(kw)
            st, ans = self.call("POST", "/events", {"batches": [self.batch(seq=1), second]})
            self.assertEqual(st, 422, (kw, ans))
            self.assertEqual(ans["status"], 422)
            self.assertTrue(any(p["name"].startswith("batches[1]")
                                for p in ans["invalid_params"]), ans)
        st, ans = self.call("GET", "/directory/keys")
        self.assertEqual(ans, {"total": 0, "keys": []})
        self.assertEqual(self.call("GET", "/directory/streams")[1], {"streams": []})

    def test_defaults_and_tolerances(self):
        st, ans = self.call("POST", "/events", {})
        self.assertEqual((st, ans), (200, {"applied": 0, "duplicates": 0, "stale": 0}))
        b = self.batch(seq=2.0, future_field=1,
                       entries=[{"key": key("m", "AA"), "size_bytes": 3e0,
                                 "content_hash_hex": "", "token_ids": [-1, 2]}])
        st, ans = self.call("POST", "/events", {"batches": [b]})
        self.assertEqual((st, ans), (200, {"applied": 1, "duplicates": 0, "stale": 0}))
        st, ans = self.call("POST", "/directory/lookup", {"keys": [key("m", "aa")]})
        r = ans["results"][0]
        self.assertEqual(r["placements"][0]["size_bytes"], 3)
        self.assertEqual(r["token_ids"], [])  # ids outside uint32: the binding is not kept
        access = self.batch(seq=3, event_type="access", backend="")
        st, ans = self.call("POST", "/events", {"batches": [access]})
        self.assertEqual(ans["applied"], 1)

    def test_lookup_and_keys_validation(self):
        for body in ({}, {"keys": [key("m", "aa")], "token_ids": [1]}, {"token_ids": [1]},
                     {"keys": [dict(key("m", "aa"), kv_rank=-1)]},
                     {"token_ids": [1, "x"], "model_name": "m"},
                     {"token_ids": [1, 1 << 32], "model_name": "m"},
                     {"token_ids": [1], "model_name": "m", "world_size": 0}):
            st, ans = self.call("POST", "/directory/lookup", body)
            self.assertEqual(st, 422, (body, ans))
        st, ans = self.call("POST", "/directory/lookup",
                            {"token_ids": [1], "model_name": "m", "world_size": 256})
        self.assertEqual(st, 400, ans)
        st, ans = self.call("POST", "/directory/lookup",
                            {"token_ids": [1], "model_name": "m@x"})
        self.assertEqual(st, 400, ans)
        st, ans = self.call("POST", "/directory/lookup",
                            {"token_ids": [0] * 1000001, "model_name": "m"})
        self.assertEqual(st, 400, ans)
        for q in ("limit=0", "limit=10001", "offset=-1", "tier=l3", "limit=x"):
            st, ans = self.call("GET", "/directory/keys?" + q)
            self.assertEqual(st, 422, q)

    def test_filters_and_paging(self):
        e1, e2 = self.emitter("mp-1"), self.emitter("mp-2")
        for i in range(25):
            e1.store("l1", "dram", key("m", "%02x" % i), 1)
            if i % 2:
                e2.store("l2", "fs", key("m", "%02x" % i), 1)
        e1.flush()
        e2.flush()
        self.assertEqual(len(self.all_keys()), 25)
        self.assertEqual(len(self.all_keys("&tier=l2")), 12)
        self.assertEqual(len(self.all_keys("&instance_id=mp-1")), 25)
        self.assertEqual(len(self.all_keys("&backend=fs&instance_id=mp-2")), 12)
        rows = self.all_keys("&tier=l2")
        self.assertTrue(all(len(r["placements"]) == 1 for r in rows))
        st, ans = self.call("GET", "/directory/keys?offset=24&limit=5")
        self.assertEqual((ans["total"], len(ans["keys"])), (25, 1))


    def test_page_token_listing_exactly_once(self):
        e = self.emitter("mp-p")
        for i in range(0, 200, 2):
            e.store("l1", "dram", key("m", "%04x" % i), 1)
        e.flush()
        seen, tok, step = [], "", 0
        while True:
            st, ans = self.call("GET", "/directory/keys?limit=9&page_token=" + tok)
            self.assertEqual(st, 200, ans)
            self.assertNotIn("total", ans)
            seen += [r["key"]["chunk_hash_hex"] for r in ans["keys"]]
            # Changes between pages: new keys, and deletes of keys not yet listed
            # would be allowed to vanish; keys present throughout must come once.
            e.store("l1", "dram", key("m", "%04x" % (1 + 2 * step)), 1)
            e.flush()
            step += 1
            if ans["next_page_token"] is None:
                break
            tok = ans["next_page_token"]
        stayed = ["%04x" % i for i in range(0, 200, 2)]
        for h in stayed:
            self.assertEqual(seen.count(h), 1, h)
        self.assertEqual(len(seen), len(set(seen)))
        # A token is bound to its filters; a broken one is 400.
        st, ans = self.call("GET", "/directory/keys?limit=3&page_token=")
        tok = ans["next_page_token"]
        self.assertEqual(self.call("GET", "/directory/keys?limit=3&tier=l2&page_token=" + tok)[1]
                         ["code"], "page_token_mismatch")
        self.assertEqual(self.call("GET", "/directory/keys?page_token=AAAA")[0], 400)
        self.assertEqual(self.call("GET", "/directory/keys?page_token=%s&offset=3" % tok)[0], 422)


class TestInstances(FleetBase):
    settings = {"instance_timeout_s": 1, "health_check_interval_s": 1}

    def test_register_heartbeat_delete_list(self):
        st, ans = self.call("POST", "/instances", {"ip": " 10.0.0.1 ", "http_port": 8080,
                                                   "metadata": {"role": "mp"}})
        self.assertEqual(st, 200)
        gen = ans["instance_id"]
        self.assertRegex(gen, r"^mp-[0-9a-f]{32}$")
        self.assertFalse(ans["re_registered"])
        st, ans = self.call("POST", "/instances", {"instance_id": gen, "ip": "10.0.0.1",
                                                   "http_port": 8080})
        self.assertTrue(ans["re_registered"])
        st, ans = self.call("GET", "/instances")
        inst = ans["instances"][0]
        self.assertEqual((inst["instance_id"], inst["ip"], inst["http_port"]),
                         (gen, "10.0.0.1", 8080))
        self.assertIsInstance(inst["registration_time"], float)
        for bad in ({"ip": " ", "http_port": 1}, {"ip": "x", "http_port": 0},
                    {"ip": "x"}, {"ip": "x", "http_port": 1, "metadata": {"a": 1}},
                    {"ip": "x", "http_port": 1, "mq_port": 65536}):
            self.assertEqual(self.call("POST", "/instances", bad)[0], 422, bad)
        self.assertEqual(self.call("PUT", "/instances/%s/heartbeat" % gen),
                         (200, {"instance_id": gen}))
        self.assertEqual(self.call("PUT", "/instances/nobody/heartbeat")[0], 404)
        self.assertEqual(self.call("DELETE", "/instances/%s" % gen)[0], 204)
        self.assertEqual(self.call("DELETE", "/instances/%s" % gen)[0], 204)
        self.assertEqual(self.call("GET", "/instances")[1], {"instances": []})
        self.assertEqual(self.call("GET", "/healthz"), (200, {"status": "ok"}))

    def test_reregister_on_404_and_timeout_drops_instance(self):
        m = Model()
        live = self.emitter("mp-live", 1, heartbeat_interval=0.3)
        gone = self.emitter("mp-gone", 1, heartbeat_interval=0.3)
        self.assertEqual(live.heartbeat(), 404)  # not registered: registers again
        self.assertEqual(live.registrations, 1)
        gone.register()
        live.start_heartbeats()
        try:
            for e in (live, gone):
                e.store("l1", "dram", key("m", "11"), 1)
                e.store("l2", "fs", key("m", "22"), 2)
                body = {"batches": e._take()}
                post_json(self.h, self.p, "POST", "/events", body)
                m.ingest_request(body)
            self.check_model(m)
            deadline = time.time() + 8
            while time.time() < deadline:
                ids = [i["instance_id"] for i in self.call("GET", "/instances")[1]["instances"]]
                if ids == ["mp-live"]:
                    break
                time.sleep(0.2)
            self.assertEqual(ids, ["mp-live"])
            m.drop_instance("mp-gone")
            self.check_model(m)
            # The dropped instance's next batch opens a fresh cursor.
            gone.store("l1", "dram", key("m", "33"), 3)
            body = {"batches": gone._take()}
            self.assertEqual(post_json(self.h, self.p, "POST", "/events", body)[1],
                             m.ingest_request(body))
            self.check_model(m)
            # A deregistration drops the stream too.
            live.stop_heartbeats()
            self.assertEqual(live.deregister(), 204)
            m.drop_instance("mp-live")
            self.check_model(m)
        finally:
            live.stop_heartbeats()


class TestFleetAccess(unittest.TestCase):
    """With auth_tokens_file: roles per route, and a salt-bound token sees
    and reports only its salt's keys."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kvidx-fleet-auth-")
        self.tokens = {"W": "tW" + "w" * 30, "A": "tA" + "a" * 30, "RB": "tR" + "b" * 30}
        path = os.path.join(self.tmp, "tokens")
        with open(path, "w") as f:
            f.write("%s write\n%s write salt=alice\n%s read salt=bob\n"
                    % (self.tokens["W"], self.tokens["A"], self.tokens["RB"]))
        os.chmod(path, 0o600)
        self.d = Daemon(settings={"auth_tokens_file": path})

    def tearDown(self):
        try:
            self.assertEqual(self.d.stop(), 0, self.d.log()[-2000:])
        finally:
            self.d.kill()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def call(self, method, path, body=None, who=None):
        h = {"Authorization": "Bearer " + self.tokens[who]} if who else {}
        r = self.d.request(method, path, b"" if body is None else body, h)
        return r.status, (r.json() if r.body else None)

    def batch(self, seq, *salts):
        return {"batches": [{"instance_id": "mp-1", "incarnation": 1, "seq": seq,
                             "event_type": "store", "tier": "l1", "backend": "dram",
                             "entries": [{"key": key("m", "%02x" % i, salt=s), "size_bytes": 1}
                                         for i, s in enumerate(salts)]}]}

    def test_roles_and_salts(self):
        self.assertEqual(self.call("POST", "/events", self.batch(1, ""))[0], 401)
        self.assertEqual(self.call("POST", "/events", self.batch(1, ""), "RB")[0], 403)
        st, ans = self.call("POST", "/events", self.batch(1, "alice", "bob", ""), "W")
        self.assertEqual((st, ans["applied"]), (200, 1))
        # A salt-bound writer: another salt anywhere in the request is 403,
        # nothing applied (seq 2 stays free).
        self.assertEqual(self.call("POST", "/events", self.batch(2, "alice", "bob"), "A")[0], 403)
        st, ans = self.call("POST", "/events", self.batch(2, "alice"), "A")
        self.assertEqual((st, ans["applied"]), (200, 1))
        # The bob reader lists and finds bob's keys only.
        st, ans = self.call("GET", "/directory/keys", who="RB")
        self.assertEqual((st, ans["total"]), (200, 1))
        self.assertEqual([r["key"]["cache_salt"] for r in ans["keys"]], ["bob"])
        st, ans = self.call("GET", "/directory/keys?page_token=", who="RB")
        self.assertEqual([r["key"]["cache_salt"] for r in ans["keys"]], ["bob"])
        st, ans = self.call("GET", "/directory/keys", who="W")
        self.assertEqual(ans["total"], 3)
        ask = {"keys": [key("m", "00", salt="alice"), key("m", "01", salt="bob")]}
        st, ans = self.call("POST", "/directory/lookup", ask, "RB")
        self.assertEqual([len(r["placements"]) for r in ans["results"]], [0, 1])
        st, ans = self.call("POST", "/directory/score", ask, "RB")
        self.assertEqual([(s["instance_id"], s["any_chunks"]) for s in ans["scores"]],
                         [("mp-1", 0)])
        st, ans = self.call("POST", "/directory/lookup", ask, "W")
        self.assertEqual([len(r["placements"]) for r in ans["results"]], [1, 1])
        self.assertEqual(self.call("POST", "/instances", {"ip": "x", "http_port": 1}, "RB")[0],
                         403)
        self.assertEqual(self.call("POST", "/instances", {"ip": "x", "http_port": 1}, "A")[0],
                         200)


def b3(data):
    out = subprocess.run(["b3sum", "--no-names", "--raw"], input=data, capture_output=True,
                         check=True).stdout
    assert len(out) == 32
    return out


def chunk_hashes(tokens, chunk):
    h = b3(bytes(12))
    out = []
    for i in range(len(tokens) // chunk):
        h = b3(h + struct.pack(">%dI" % chunk, *tokens[i * chunk:(i + 1) * chunk]))
        out.append(h.hex())
    return out


class TestTokensForm(FleetBase):
    settings = {"chunk_size": 16}

    def test_tokens_form_key_count_is_bounded(self):
        # 40,000 chunks of 16 tokens at world size 8: 320,000 keys, over
        # max_keys_per_request (262,144): refused before hashing.
        st, ans = self.call("POST", "/directory/lookup",
                            {"token_ids": [0] * (16 * 40000), "model_name": "m",
                             "world_size": 8})
        self.assertEqual((st, ans["code"]), (413, "too_many_keys"))

    def test_tokens_form_matches_b3sum(self):
        rnd = random.Random(3)
        e = self.emitter("mp-t", 1)
        for n_tokens, ws, salt in ((16 * 3 + 5, 1, ""), (16 * 2, 2, "alice"), (15, 1, ""),
                                   (16 * 4 + 15, 8, "bob"), (16, 8, "")):
            tokens = [rnd.randrange(1 << 32) for _ in range(n_tokens)]
            hashes = chunk_hashes(tokens, 16)
            # Store every other chunk of rank 1 (when there is one).
            stored = []
            for c, h in enumerate(hashes):
                if c % 2 == 0:
                    r = 1 if ws > 1 else 0
                    k = key("mdl", h, kv_rank=(ws << 24) | (r << 16) | (ws << 8) | r, salt=salt)
                    e.store("l1", "dram", k, 7, token_ids=tokens[c * 16:(c + 1) * 16],
                            token_offset=c * 16)
                    stored.append((c, r))
            e.flush()
            st, ans = self.call("POST", "/directory/lookup",
                                {"token_ids": tokens, "model_name": "mdl", "world_size": ws,
                                 "cache_salt": salt})
            self.assertEqual(st, 200, ans)
            self.assertEqual(ans["chunks"], len(hashes))
            self.assertEqual(len(ans["results"]), len(hashes) * ws)
            for i, res in enumerate(ans["results"]):
                c, r = divmod(i, ws)
                k = res["key"]
                self.assertEqual(k["chunk_hash_hex"], hashes[c])
                self.assertEqual(k["kv_rank"], (ws << 24) | (r << 16) | (ws << 8) | r)
                self.assertEqual((k["object_group_id"], k["cache_salt"], k["model_name"]),
                                 (0, salt, "mdl"))
                self.assertEqual(len(res["placements"]), 1 if (c, r) in stored else 0)
                # Token ids are the chunk hash's, whatever the rank.
                want = tokens[c * 16:(c + 1) * 16] if c % 2 == 0 else []
                self.assertEqual(res["token_ids"], want)
            st, ans = self.call("POST", "/directory/score",
                                {"token_ids": tokens, "model_name": "mdl", "world_size": ws,
                                 "cache_salt": salt})
            self.assertEqual(st, 200, ans)
            self.assertEqual(ans["chunks"], len(hashes))
            best = {s["instance_id"]: s for s in ans["scores"]}
            if hashes and ws == 1:
                self.assertEqual(best["mp-t"]["l1_chunks"], 1)
            elif hashes:
                # Only one rank of each chunk: nothing is servable.
                self.assertEqual(best["mp-t"]["any_chunks"], 0)
            e.delete("l1", "dram", key("x", "00"))  # keeps the batch kinds alive
            e.flush()


class TestDurability(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvidx-fleet-")
        self.d = None

    def tearDown(self):
        if self.d:
            self.d.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, **kw):
        if self.d:
            self.d.kill()
        s = {"data_dir": self.dir}
        s.update(kw)
        self.d = Daemon(settings=s)
        return "127.0.0.1", self.d.port

    def state(self, h, p):
        keys = post_json(h, p, "GET", "/directory/keys?limit=10000", None)[1]
        streams = post_json(h, p, "GET", "/directory/streams", None)[1]
        inst = post_json(h, p, "GET", "/instances", None)[1]
        for s in streams["streams"]:
            s.pop("last_ts")
        return keys, streams, [(i["instance_id"], i["ip"], i["http_port"])
                               for i in inst["instances"]]

    def run_fleet(self, h, p, m):
        bodies = []
        for n in ("mp-1", "mp-2"):
            e = Emitter(h, p, n, incarnation=10)
            e.register()
            for i in range(30):
                e.store("l1", "dram", key("m", "%04x" % i), i + 1, token_ids=[i, i + 1])
                e.store("l2", "fs", key("m", "%04x" % i), i + 1)
                if i % 3 == 0:
                    e.delete("l1", "dram", key("m", "%04x" % (i // 2)))
                if i % 10 == 9:
                    body = {"batches": e._take()}
                    st, ans = post_json(h, p, "POST", "/events", body)
                    self.assertEqual(ans, m.ingest_request(body))
                    bodies.append(body)
        return bodies

    def check_restart(self, sig, snapshot=False):
        m = Model()
        extra = {"snapshot_journal_bytes": 4096} if snapshot else {}
        h, p = self.start(fsync="always", **extra)
        bodies = self.run_fleet(h, p, m)
        if snapshot:
            # A snapshot holds the directory; the journal after it the rest.
            snap = os.path.join(self.dir, "snapshot.kvs")
            deadline = time.time() + 10
            while not os.path.exists(snap) and time.time() < deadline:
                time.sleep(0.05)
            self.assertTrue(os.path.exists(snap))
            e = Emitter(h, p, "mp-3", incarnation=4)
            e.store("l1", "dram", key("m", "ffff"), 9, token_ids=[7])
            body = {"batches": e._take()}
            self.assertEqual(post_json(h, p, "POST", "/events", body)[1], m.ingest_request(body))
            bodies.append(body)
        before = self.state(h, p)
        if sig == signal.SIGKILL:
            self.d.send_signal(signal.SIGKILL)
            self.d.proc.wait(10)
        else:
            self.assertEqual(self.d.stop(), 0)
        h, p = self.start(fsync="always")
        self.assertEqual(self.state(h, p), before)
        for body in bodies:
            st, ans = post_json(h, p, "POST", "/events", body)
            self.assertEqual(st, 200)
            self.assertEqual(ans["applied"], 0, ans)
            self.assertEqual(ans["duplicates"], len(body["batches"]))
        after = self.state(h, p)
        self.assertEqual(after[0], before[0])
        self.assertEqual(after[2], before[2])
        for s_after, s_before in zip(after[1]["streams"], before[1]["streams"]):
            sent = sum(len(b["batches"]) for b in bodies
                       if b["batches"][0]["instance_id"] == s_after["instance_id"])
            self.assertEqual(s_after["duplicates"], s_before["duplicates"] + sent)
            for f in ("instance_id", "incarnation", "last_seq", "gap_detected", "applied"):
                self.assertEqual(s_after[f], s_before[f])
        # The restored instances are alive again from the restart on.
        e = Emitter(h, p, "mp-1")
        self.assertEqual(e.heartbeat(), 200)

    def test_restart_clean(self):
        self.check_restart(signal.SIGTERM)

    def test_restart_after_kill9(self):
        self.check_restart(signal.SIGKILL)

    def test_restart_after_snapshot_and_kill9(self):
        self.check_restart(signal.SIGKILL, snapshot=True)


if __name__ == "__main__":
    unittest.main()
