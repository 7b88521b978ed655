"""Key catalogue over HTTP (docs/keys.md, docs/index.md, docs/api.md, docs/http.md):
PUT/DELETE /v1/keys (batch), GET/PUT/DELETE /v1/keys/{canonical},
the key rules of §1.1 as seen by a client, size_bytes bounds, tiers,
all-or-nothing batches, per-request key limits, sizes from layouts, L1
capacity eviction in LRU order, and the problem+json error shape.

Where the contract is silent the daemon's choices (daemon/api/keys.c) are tested
as documented there: a single-key DELETE takes ?tier= and ?force=.
"""

import json
import os
import sys
import unittest
from urllib.parse import quote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Conn, Daemon  # noqa: E402

PROBLEM = "application/problem+json"


def key(model, rank=0, h="ab", group=None, salt=None):
    k = {"model_name": model, "kv_rank": rank, "chunk_hash_hex": h}
    if group is not None:
        k["object_group_id"] = group
    if salt is not None:
        k["cache_salt"] = salt
    return k


def full(k):
    """The five-field output form of an input key (hash lowercased)."""
    return {"model_name": k["model_name"], "kv_rank": k["kv_rank"],
            "object_group_id": k.get("object_group_id", 0),
            "chunk_hash_hex": k["chunk_hash_hex"].lower(),
            "cache_salt": k.get("cache_salt", "")}


def canonical(k, rank_0x=False):
    f = full(k)
    rank = ("0x%08x" if rank_0x else "%08x") % f["kv_rank"]
    s = "%s@%s@%x@%s" % (f["model_name"], rank, f["object_group_id"], f["chunk_hash_hex"])
    if f["cache_salt"]:
        s += "@" + f["cache_salt"]
    return s


def path_of(k, raw=False, rank_0x=False):
    c = canonical(k, rank_0x)
    return "/v1/keys/" + (c if raw else quote(c, safe="@"))


class Base(unittest.TestCase):
    settings = {}

    @classmethod
    def setUpClass(cls):
        cls.d = Daemon(settings=cls.settings)

    @classmethod
    def tearDownClass(cls):
        cls.d.kill()

    # -- helpers -------------------------------------------------------
    def put(self, entries, tier=None):
        body = {"entries": entries}
        if tier is not None:
            body["tier"] = tier
        return self.d.request("PUT", "/v1/keys", body)

    def put_ok(self, entries, tier=None):
        r = self.put(entries, tier)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"stored": len(entries)})
        return r

    def get(self, k, **kw):
        return self.d.request("GET", path_of(k, **kw))

    def info(self, k):
        r = self.get(k)
        self.assertEqual(r.status, 200, r)
        return r.json()

    def assert_absent(self, k):
        r = self.get(k)
        self.assertEqual(r.status, 404, (k, r))
        self.assert_problem(r, 404, "not_found")

    def assert_problem(self, r, status, code=None):
        self.assertEqual(r.status, status, r)
        self.assertTrue(r.headers.get("content-type", "").startswith(PROBLEM), r.headers)
        j = r.json()
        for f in ("type", "title", "status", "detail", "code"):
            self.assertIn(f, j, j)
        self.assertEqual(j["status"], status)
        if code is not None:
            self.assertEqual(j["code"], code, j)
        return j

    def delete(self, keys, tier=None, force=None):
        body = {"keys": keys}
        if tier is not None:
            body["tier"] = tier
        if force is not None:
            body["force"] = force
        return self.d.request("DELETE", "/v1/keys", body)


class PutTest(Base):
    def test_stored_count_and_default_tier_l2(self):
        ks = [key("put-count", 0, "%02x" % i) for i in range(3)]
        self.put_ok([{"key": k, "size_bytes": 10 + i} for i, k in enumerate(ks)])
        for i, k in enumerate(ks):
            j = self.info(k)
            self.assertEqual(j["size_bytes"], 10 + i)
            self.assertIsNone(j["l1"])
            self.assertIs(j["l2"], True)

    def test_explicit_tier_l2(self):
        k = key("put-l2")
        self.put_ok([{"key": k, "size_bytes": 5}], tier="l2")
        j = self.info(k)
        self.assertIsNone(j["l1"])
        self.assertIs(j["l2"], True)

    def test_tier_l1(self):
        k = key("put-l1")
        self.put_ok([{"key": k, "size_bytes": 5}], tier="l1")
        j = self.info(k)
        self.assertEqual(j["l1"], {"state": "ready", "pins": 0, "temporary": False})
        self.assertIs(j["l2"], False)

    def test_bad_tier_rejected(self):
        k = key("put-badtier")
        for t in ("L1", "all", "l3", 1):
            with self.subTest(tier=t):
                r = self.put([{"key": k, "size_bytes": 5}], tier=t)
                self.assert_problem(r, 400)
        self.assert_absent(k)

    def test_empty_batch(self):
        r = self.put([])
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"stored": 0})

    def test_key_named_twice_is_stored_and_counted_once(self):
        a, b = key("twice", 0, "ab"), key("twice", 0, "cd")
        # the same key in other spellings: hash case, defaults spelt out
        a2 = dict(a, chunk_hash_hex="AB", object_group_id=0, cache_salt="")
        r = self.put([{"key": a, "size_bytes": 5}, {"key": a2, "size_bytes": 5}])
        self.assertEqual(r.json(), {"stored": 1}, r)
        # the last size wins, as for two PUTs one after the other
        r = self.put([{"key": a, "size_bytes": 5}, {"key": b, "size_bytes": 6},
                      {"key": a2, "size_bytes": 9}])
        self.assertEqual(r.json(), {"stored": 2}, r)
        self.assertEqual(self.info(a)["size_bytes"], 9)
        self.assertEqual(self.info(b)["size_bytes"], 6)
        r = self.d.request("GET", "/v1/keys?model_name=twice")
        self.assertEqual([e["size_bytes"] for e in r.json()["entries"]], [9, 6])

    def test_all_or_nothing_lists_every_bad_index(self):
        good = [key("aon", 0, "%02x" % i) for i in range(5)]
        entries = [{"key": k, "size_bytes": 100} for k in good]
        entries[1] = {"key": key("aon", 0, "abc"), "size_bytes": 100}          # odd hash
        entries[3] = {"key": key("a@b", 0, "ab"), "size_bytes": 100}          # '@' in model
        r = self.put(entries)
        j = self.assert_problem(r, 400, "invalid_key")
        names = [p["name"] for p in j.get("invalid_params", [])]
        self.assertTrue(any(n.startswith("entries[1]") for n in names), names)
        self.assertTrue(any(n.startswith("entries[3]") for n in names), names)
        self.assertFalse(any(n.startswith(("entries[0]", "entries[2]", "entries[4]"))
                             for n in names), names)
        for p in j["invalid_params"]:
            self.assertIn("reason", p)
        for i in (0, 2, 4):
            self.assert_absent(good[i])

    def test_all_or_nothing_bad_size(self):
        ks = [key("aon-size", 0, "%02x" % i) for i in range(3)]
        r = self.put([{"key": ks[0], "size_bytes": 1}, {"key": ks[1], "size_bytes": 0},
                      {"key": ks[2], "size_bytes": 1}])
        j = self.assert_problem(r, 400)
        self.assertTrue(any(p["name"].startswith("entries[1]") for p in j["invalid_params"]), j)
        for k in ks:
            self.assert_absent(k)

    def _reject(self, raw_key, label):
        """PUTs one entry whose key is the raw JSON text raw_key; expects
        400 invalid_key naming entries[0], and nothing stored."""
        body = '{"entries":[{"key":%s,"size_bytes":7}]}' % raw_key
        r = self.d.request("PUT", "/v1/keys", body, {"Content-Type": "application/json"})
        j = self.assert_problem(r, 400, "invalid_key")
        names = [p["name"] for p in j.get("invalid_params", [])]
        self.assertTrue(names and all(n.startswith("entries[0]") for n in names), (label, j))

    def _accept(self, raw_key):
        body = '{"entries":[{"key":%s,"size_bytes":7}]}' % raw_key
        r = self.d.request("PUT", "/v1/keys", body, {"Content-Type": "application/json"})
        self.assertEqual(r.status, 200, (raw_key, r))
        self.assertEqual(r.json(), {"stored": 1})

    def test_hash_rules(self):
        bad = {"odd": "abc", "empty": "", "129": "a" * 129, "130": "a" * 130,
               "nonhex": "zz", "nonhex2": "0g", "space_mid": "abcd ef0", "space_lead": " abc",
               "space_trail": "abc ", "0x": "0xab"}
        for label, h in bad.items():
            with self.subTest(label):
                self._reject(json.dumps(key("hash-rules", 0, h)), label)
        self._reject('{"model_name":"hash-rules","kv_rank":0,"chunk_hash_hex":12}', "number")
        self._reject('{"model_name":"hash-rules","kv_rank":0}', "missing")
        # nothing got in under that model
        r = self.d.request("GET", "/v1/keys?model_name=hash-rules")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["entries"], [])
        # bounds that are fine
        self._accept(json.dumps(key("hash-ok", 0, "f" * 128)))
        self._accept(json.dumps(key("hash-ok", 0, "00")))

    def test_uppercase_hash_normalized(self):
        k = key("hash-upper", 0, "ABCDEF09")
        self.put_ok([{"key": k, "size_bytes": 3}])
        j = self.info(key("hash-upper", 0, "abcdef09"))
        self.assertEqual(j["key"]["chunk_hash_hex"], "abcdef09")
        # same key: re-put in lowercase does not make a second one
        self.put_ok([{"key": key("hash-upper", 0, "abcdef09"), "size_bytes": 3}])
        r = self.d.request("GET", "/v1/keys?model_name=hash-upper")
        self.assertEqual([e["key"]["chunk_hash_hex"] for e in r.json()["entries"]], ["abcdef09"])

    def test_model_rules(self):
        bad = {"at": "a@b", "ctl": "a\x01b", "tab": "a\tb", "newline": "a\nb", "empty": "",
               "256": "m" * 256, "nul": "a\x00b"}
        for label, m in bad.items():
            with self.subTest(label):
                self._reject(json.dumps(key(m, 0, "ab")), label)
        self._reject('{"model_name":5,"kv_rank":0,"chunk_hash_hex":"ab"}', "number")
        self._reject('{"kv_rank":0,"chunk_hash_hex":"ab"}', "missing")
        # a lone surrogate is not UTF-8: invalid_key or invalid_json, 400 either way
        r = self.d.request("PUT", "/v1/keys", '{"entries":[{"key":{"model_name":"\\ud800",'
                           '"kv_rank":0,"chunk_hash_hex":"ab"},"size_bytes":7}]}',
                           {"Content-Type": "application/json"})
        self.assert_problem(r, 400)
        # invalid UTF-8 bytes in the body
        body = b'{"entries":[{"key":{"model_name":"a\xff","kv_rank":0,"chunk_hash_hex":"ab"},' \
               b'"size_bytes":7}]}'
        r = self.d.request("PUT", "/v1/keys", body, {"Content-Type": "application/json"})
        self.assertEqual(r.status, 400, r)
        m255 = "m" * 255
        self._accept(json.dumps(key(m255, 0, "ab")))
        self.assertEqual(self.info(key(m255, 0, "ab"))["key"]["model_name"], m255)
        self._accept(json.dumps(key("mod\u00e9le/x", 0, "ab")))
        self._accept(json.dumps(key("del\x7fok", 0, "ab")))     # only < 0x20 is forbidden

    def test_kv_rank_rules(self):
        for label, v in {"frac": "1.5", "string": '"1"', "true": "true", "neg": "-1",
                         "big": "4294967296", "null": "null", "neg_frac": "-0.5",
                         "big_frac": "4294967295.5", "inf": "1e400", "huge": "18446744073709551617",
                         "array": "[1]"}.items():
            with self.subTest(label):
                self._reject('{"model_name":"rank-rules","kv_rank":%s,"chunk_hash_hex":"ab"}'
                             % v, label)
        self._reject('{"model_name":"rank-rules","chunk_hash_hex":"ab"}', "missing")
        for i, v in enumerate(("2.0", "2e0")):
            self._accept('{"model_name":"rank-int%d","kv_rank":%s,"chunk_hash_hex":"ab"}' % (i, v))
            j = self.info(key("rank-int%d" % i, 2, "ab"))
            self.assertEqual(j["key"]["kv_rank"], 2)
            self.assertEqual(json.dumps(j["key"]["kv_rank"]), "2")
        self._accept('{"model_name":"rank-max","kv_rank":4294967295.0,"chunk_hash_hex":"ab"}')
        self.assertEqual(self.info(key("rank-max", 4294967295, "ab"))["key"]["kv_rank"], 4294967295)

    def test_group_rules(self):
        for label, v in {"big": "65536", "neg": "-1", "frac": "0.5", "string": '"0"',
                         "bool": "false"}.items():
            with self.subTest(label):
                self._reject('{"model_name":"grp","kv_rank":0,"chunk_hash_hex":"ab",'
                             '"object_group_id":%s}' % v, label)
        self._accept(json.dumps(key("grp-ok", 0, "ab", group=65535)))
        self.assertEqual(self.info(key("grp-ok", 0, "ab", group=65535))["key"]["object_group_id"],
                         65535)
        self._accept('{"model_name":"grp-ok","kv_rank":0,"chunk_hash_hex":"cd",'
                     '"object_group_id":3.0}')
        self.assertEqual(self.info(key("grp-ok", 0, "cd", group=3))["key"]["object_group_id"], 3)

    def test_salt_rules(self):
        for label, s in {"slash": "a/b", "backslash": "a\\b", "at": "a@b", "129": "s" * 129,
                         "nul": "a\x00b"}.items():
            with self.subTest(label):
                self._reject(json.dumps(key("salt-rules", 0, "ab", salt=s)), label)
        self._reject('{"model_name":"salt-rules","kv_rank":0,"chunk_hash_hex":"ab",'
                     '"cache_salt":1}', "number")
        r = self.d.request("GET", "/v1/keys?model_name=salt-rules")
        self.assertEqual(r.json()["entries"], [])
        s128 = "s" * 128
        self._accept(json.dumps(key("salt-ok", 0, "ab", salt=s128)))
        self.assertEqual(self.info(key("salt-ok", 0, "ab", salt=s128))["key"]["cache_salt"], s128)

    def test_nul_escape_not_truncated(self):
        # "al\u0000ice" must not arrive as "al" (another, valid key)
        self._reject('{"model_name":"nul","kv_rank":0,"chunk_hash_hex":"ab",'
                     '"cache_salt":"al\\u0000ice"}', "salt")
        self._reject('{"model_name":"nul\\u0000x","kv_rank":0,"chunk_hash_hex":"ab"}', "model")
        self.assert_absent(key("nul", 0, "ab", salt="al"))
        self.assert_absent(key("nul", 0, "ab"))

    def test_unknown_member_rejected(self):
        self._reject('{"model_name":"unk","kv_rank":0,"chunk_hash":"ab"}', "chunk_hash")
        self._reject('{"model_name":"unk","kv_rank":0,"chunk_hash_hex":"ab","chunk_hash":"cd"}',
                     "extra")
        self._reject('{"model_name":"unk","kv_rank":0,"chunk_hash_hex":"ab","salt":"x"}', "salt")
        self._reject('"unk@00000000@0@ab"', "string key")
        self.assert_absent(key("unk", 0, "ab"))

    def test_repeated_member_is_called_repeated(self):
        # a valid member name given twice is not an unknown member
        routes = (("PUT", "/v1/keys", '{"entries":[{"key":%s,"size_bytes":7}]}', "entries[0].key"),
                  ("DELETE", "/v1/keys", '{"keys":[%s]}', "keys[0]"),
                  ("POST", "/v1/lookup", '{"keys":[%s]}', "keys[0]"))
        for method, path, body, where in routes:
            with self.subTest(path=path, method=method):
                raw = body % ('{"model_name":"rep","kv_rank":0,"kv_rank":0,'
                              '"chunk_hash_hex":"ab"}')
                r = self.d.request(method, path, raw, {"Content-Type": "application/json"})
                j = self.assert_problem(r, 400, "invalid_key")
                params = j["invalid_params"]
                self.assertEqual([p["name"] for p in params], [where], j)
                self.assertIn("repeated member", params[0]["reason"], j)
                self.assertNotIn("unknown", params[0]["reason"], j)
        self.assert_absent(key("rep", 0, "ab"))

    def test_size_bounds(self):
        for label, v in {"zero": "0", "over": str((1 << 40) + 1), "neg": "-1", "frac": "1.5",
                         "string": '"5"', "over_float": "1099511627777.0",
                         "frac_big": "1099511627775.5"}.items():
            with self.subTest(label):
                k = key("size-" + label)
                r = self.d.request("PUT", "/v1/keys",
                                   '{"entries":[{"key":%s,"size_bytes":%s}]}' % (json.dumps(k), v),
                                   {"Content-Type": "application/json"})
                self.assert_problem(r, 400)
                self.assert_absent(k)
        k = key("size-max")
        self.put_ok([{"key": k, "size_bytes": 1 << 40}])
        self.assertEqual(self.info(k)["size_bytes"], 1 << 40)
        k = key("size-exp")
        r = self.d.request("PUT", "/v1/keys", '{"entries":[{"key":%s,"size_bytes":1e12}]}'
                           % json.dumps(k), {"Content-Type": "application/json"})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.info(k)["size_bytes"], 10 ** 12)
        self.assertEqual(json.dumps(self.info(k)["size_bytes"]), "1000000000000")
        k = key("size-min")
        self.put_ok([{"key": k, "size_bytes": 1}])
        self.assertEqual(self.info(k)["size_bytes"], 1)

    def test_unknown_entry_member_rejected(self):
        k = key("entry-unknown")
        r = self.put([{"key": k, "size_bytes": 5, "tier": "l1"}])
        self.assert_problem(r, 400)
        self.assert_absent(k)

    def test_reput_adds_tier_and_updates_size(self):
        k = key("reput")
        self.put_ok([{"key": k, "size_bytes": 100}], tier="l2")
        self.put_ok([{"key": k, "size_bytes": 250}], tier="l1")
        j = self.info(k)
        self.assertEqual(j["size_bytes"], 250)
        self.assertEqual(j["l1"], {"state": "ready", "pins": 0, "temporary": False})
        self.assertIs(j["l2"], True)
        # the other way round
        k2 = key("reput", 0, "cd")
        self.put_ok([{"key": k2, "size_bytes": 10}], tier="l1")
        self.put_ok([{"key": k2, "size_bytes": 20}])
        j = self.info(k2)
        self.assertEqual(j["size_bytes"], 20)
        self.assertIsNotNone(j["l1"])
        self.assertIs(j["l2"], True)

    def test_missing_size_without_layout_conflict(self):
        good = key("nolayout", 0, "01")
        nosize = key("nolayout", 0x01000000, "02")
        r = self.put([{"key": good, "size_bytes": 9}, {"key": nosize}])
        j = self.assert_problem(r, 409, "conflict")
        self.assertTrue(any(p["name"].startswith("entries[1]") for p in j.get("invalid_params", [])),
                        j)
        self.assert_absent(good)
        self.assert_absent(nosize)
        # the single-key form too
        r = self.d.request("PUT", path_of(nosize), {"tier": "l2"})
        self.assert_problem(r, 409, "conflict")
        self.assert_absent(nosize)

    def test_size_from_layout(self):
        model = "layout-model/x"
        # world size 2: 2*3*4 * 2 (bfloat16) + 5 * 4 (float32) = 48 + 20 = 68
        r = self.d.request("PUT", "/v1/layouts", {
            "model_name": model, "world_size": 2, "shapes": [[2, 3, 4], [5]],
            "dtypes": ["bfloat16", "float32"]})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["size_bytes"], 68)
        # world size 1 (default): 10 bytes
        r = self.d.request("PUT", "/v1/layouts", {"model_name": model, "shapes": [[10]],
                                                  "dtypes": ["uint8"]})
        self.assertEqual(r.status, 200, r)
        ws2 = key(model, 0x02010201, "aa")      # world 2, rank 1
        ws2b = key(model, 0x02000200, "bb")     # world 2, rank 0
        ws1 = key(model, 0x01000100, "aa")      # world 1
        self.put_ok([{"key": ws2}, {"key": ws1}, {"key": ws2b, "size_bytes": 3}])
        self.assertEqual(self.info(ws2)["size_bytes"], 68)
        self.assertEqual(self.info(ws1)["size_bytes"], 10)
        self.assertEqual(self.info(ws2b)["size_bytes"], 3)   # explicit size wins
        # world size 3 has no layout: 409, nothing stored
        ws3 = key(model, 0x03000300, "cc")
        ok = key(model, 0x02000200, "dd")
        r = self.put([{"key": ok}, {"key": ws3}])
        self.assert_problem(r, 409, "conflict")
        self.assert_absent(ok)
        self.assert_absent(ws3)
        # another model with the same world size has no layout either
        other = key("layout-other", 0x02000200, "aa")
        self.assert_problem(self.put([{"key": other}]), 409, "conflict")
        # single-key PUT without size_bytes uses the layout too
        single = key(model, 0x02010201, "ee")
        r = self.d.request("PUT", path_of(single), {"tier": "l1"})
        self.assertEqual(r.status, 200, r)
        j = self.info(single)
        self.assertEqual(j["size_bytes"], 68)
        self.assertIsNotNone(j["l1"])


class LimitTest(Base):
    settings = {"max_keys_per_request": 5}

    def test_too_many_keys_put(self):
        ks = [key("limit", 0, "%02x" % i) for i in range(6)]
        r = self.put([{"key": k, "size_bytes": 1} for k in ks])
        self.assert_problem(r, 413, "too_many_keys")
        for k in ks:
            self.assert_absent(k)
        self.put_ok([{"key": k, "size_bytes": 1} for k in ks[:5]])
        for k in ks[:5]:
            self.assertEqual(self.info(k)["size_bytes"], 1)

    def test_too_many_keys_delete(self):
        ks = [key("limit-del", 0, "%02x" % i) for i in range(6)]
        self.put_ok([{"key": k, "size_bytes": 1} for k in ks[:5]])
        r = self.delete(ks)
        self.assert_problem(r, 413, "too_many_keys")
        for k in ks[:5]:
            self.assertEqual(self.get(k).status, 200)
        r = self.delete(ks[:5])
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"deleted": 5, "not_found": 0, "skipped_pinned": 0, "skipped_source": 0})


class GetKeyTest(Base):
    def test_shape(self):
        k = key("org/shape", 0x01000100, "0A1b", group=7, salt="alice")
        self.put_ok([{"key": k, "size_bytes": 1234}], tier="l1")
        r = self.get(k)
        self.assertEqual(r.status, 200, r)
        self.assertTrue(r.headers.get("content-type", "").startswith("application/json"), r)
        j = r.json()
        self.assertEqual(set(j), {"key", "size_bytes", "l1", "l2", "l2_sources"})
        self.assertEqual(j["l2_sources"], [])
        self.assertEqual(j["key"], full(k))
        self.assertEqual(set(j["key"]), {"model_name", "kv_rank", "object_group_id",
                                         "chunk_hash_hex", "cache_salt"})
        self.assertEqual(j["size_bytes"], 1234)
        self.assertEqual(j["l1"], {"state": "ready", "pins": 0, "temporary": False})
        self.assertIs(j["l2"], False)

    def test_defaults_in_output(self):
        k = key("shape-defaults", 5, "ff")
        self.put_ok([{"key": k, "size_bytes": 1}])
        j = self.info(k)
        self.assertEqual(j["key"], {"model_name": "shape-defaults", "kv_rank": 5,
                                    "object_group_id": 0, "chunk_hash_hex": "ff",
                                    "cache_salt": ""})
        self.assertIsNone(j["l1"])
        self.assertIs(j["l2"], True)

    def test_absent_404(self):
        self.assert_absent(key("never-stored", 0, "ab"))
        # same model, other fields differ
        k = key("get-near", 1, "ab", group=1, salt="s")
        self.put_ok([{"key": k, "size_bytes": 1}])
        for other in (key("get-near", 1, "ab", group=1), key("get-near", 1, "ab", salt="s"),
                      key("get-near", 0, "ab", group=1, salt="s"),
                      key("get-near", 1, "abab", group=1, salt="s"),
                      key("get-near", 1, "ab", group=1, salt="t")):
            self.assert_absent(other)

    def test_path_spellings(self):
        k = key("org/model-x", 0x02010201, "7448f2", group=0x1f, salt="bob")
        self.put_ok([{"key": k, "size_bytes": 42}])
        c = canonical(k)
        self.assertEqual(c, "org/model-x@02010201@1f@7448f2@bob")
        for p in ("/v1/keys/" + quote(c, safe=""),          # %2F and %40
                  "/v1/keys/" + quote(c, safe="@"),         # %2F
                  "/v1/keys/" + c,                          # raw '/'
                  "/v1/keys/org/model-x@0x02010201@1f@7448f2@bob",
                  "/v1/keys/org%2Fmodel-x@0x02010201@1f@7448F2@bob"):
            with self.subTest(p):
                r = self.d.request("GET", p)
                self.assertEqual(r.status, 200, (p, r))
                self.assertEqual(r.json()["key"], full(k))
                self.assertEqual(r.json()["size_bytes"], 42)

    def test_salt_is_fifth_field(self):
        k1 = key("salted", 0, "ab")
        k2 = key("salted", 0, "ab", salt="carol")
        self.put_ok([{"key": k1, "size_bytes": 1}, {"key": k2, "size_bytes": 2}])
        self.assertEqual(self.info(k1)["size_bytes"], 1)
        self.assertEqual(self.info(k2)["size_bytes"], 2)
        self.assertEqual(self.info(k2)["key"]["cache_salt"], "carol")
        r = self.d.request("GET", "/v1/keys/salted@00000000@0@ab@carol")
        self.assertEqual(r.json()["size_bytes"], 2)

    def test_bad_canonical_400(self):
        for c in ("justone", "m@zz@0@ab", "m@00000000@0@abc", "m@00000000@0@zz",
                  "m@00000000@0", "m@00000000@10000@ab", "m@100000000@0@ab",
                  "m@00000000@0@ab@s@t", "@00000000@0@ab", "m@00000000@0@ab@",
                  "m@00000000@-1@ab", "m@00000000@0@ab@a%5Cb"):
            with self.subTest(c):
                r = self.d.request("GET", "/v1/keys/" + c)
                self.assert_problem(r, 400, "invalid_key")

    def test_encoded_nul_in_the_key_is_invalid_key(self):
        # %00 decodes to a NUL, which no key field may hold: the key is
        # invalid (not the generic invalid_argument of a bad escape), and a
        # key it would be cut to is never touched
        k = key("nulpath", 0, "ab", salt="s")
        self.put_ok([{"key": k, "size_bytes": 3}])
        for c in ("nulpath%00x@00000000@0@ab@s", "nulpath@00000000@0@ab@s%00",
                  "nulpath@00000000@0@ab%00cd@s", "nulpath@00000000@0@ab@s%00@t",
                  "%00@00000000@0@ab"):
            for method, body in (("GET", None), ("PUT", {"size_bytes": 9}), ("DELETE", None)):
                with self.subTest(c, method=method):
                    r = self.d.request(method, "/v1/keys/" + c, body)
                    j = self.assert_problem(r, 400, "invalid_key")
                    self.assertTrue(j.get("invalid_params"), j)
        self.assertEqual(self.info(k)["size_bytes"], 3)
        # a bad escape stays the router's invalid_argument
        self.assert_problem(self.d.request("GET", "/v1/keys/nulpath%zz@00000000@0@ab"), 400,
                            "invalid_argument")

    def test_single_put(self):
        k = key("single/put", 0x01000100, "beef", group=2, salt="z")
        r = self.d.request("PUT", path_of(k), {"size_bytes": 77, "tier": "l1"})
        self.assertEqual(r.status, 200, r)
        j = self.info(k)
        self.assertEqual(j["size_bytes"], 77)
        self.assertEqual(j["l1"]["state"], "ready")
        self.assertIs(j["l2"], False)
        r = self.d.request("PUT", path_of(k), {"size_bytes": 78})
        self.assertEqual(r.status, 200, r)
        j = self.info(k)
        self.assertEqual(j["size_bytes"], 78)
        self.assertIsNotNone(j["l1"])
        self.assertIs(j["l2"], True)
        # bad bodies
        for body in ({"size_bytes": 0}, {"size_bytes": 5, "tier": "l3"},
                     {"size_bytes": 5, "extra": 1}, [1]):
            with self.subTest(body=body):
                r = self.d.request("PUT", path_of(key("single/bad")), body)
                self.assert_problem(r, 400)
        self.assert_absent(key("single/bad"))
        r = self.d.request("PUT", "/v1/keys/m@zz@0@ab", {"size_bytes": 5})
        self.assert_problem(r, 400, "invalid_key")

    def test_single_delete(self):
        k = key("single/del", 0, "ab", salt="q")
        self.put_ok([{"key": k, "size_bytes": 1}])
        r = self.d.request("DELETE", path_of(k))
        self.assertEqual(r.status, 204, r)
        self.assertEqual(r.body, b"")
        self.assert_absent(k)
        r = self.d.request("DELETE", path_of(k))
        self.assert_problem(r, 404, "not_found")
        r = self.d.request("DELETE", "/v1/keys/m@zz@0@ab")
        self.assert_problem(r, 400, "invalid_key")

    def test_single_key_query_parameters(self):
        # DELETE takes tier and force, each at most once; GET and PUT take
        # none. Anything else is 400 invalid_argument naming the parameter:
        # a typo such as forse=true must not run a non-forced delete
        k = key("single/query", 0, "ab")
        self.put_ok([{"key": k, "size_bytes": 1}], tier="l1")
        self.put_ok([{"key": k, "size_bytes": 1}], tier="l2")
        cases = [("DELETE", "forse=true", "forse"), ("DELETE", "tier=l1&tier=l2", "tier"),
                 ("DELETE", "force=true&force=false", "force"), ("DELETE", "tier=l1&x", "x"),
                 ("DELETE", "Tier=l1", "Tier"), ("DELETE", "t%69er=l1", "query"),
                 ("DELETE", "a%22b=1", "query"), ("DELETE", "n" * 40 + "=1", "query"),
                 ("GET", "tier=l1", "tier"), ("GET", "x=1", "x"), ("HEAD", "x=1", None),
                 ("PUT", "tier=l1", "tier"), ("PUT", "size_bytes=5", "size_bytes")]
        for method, query, name in cases:
            with self.subTest(method=method, query=query):
                body = {"size_bytes": 9} if method == "PUT" else None
                r = self.d.request(method, path_of(k) + "?" + query, body)
                if method == "HEAD":
                    self.assertEqual(r.status, 400, r)
                    continue
                j = self.assert_problem(r, 400, "invalid_argument")
                self.assertEqual([p["name"] for p in j["invalid_params"]], [name], j)
        j = self.info(k)
        self.assertEqual(j["size_bytes"], 1, "nothing was stored")
        self.assertIsNotNone(j["l1"], "nothing was deleted")
        self.assertIs(j["l2"], True)
        # a value is compared whole: l1%00x is no tier l1
        for query in ("tier=l1%00x", "tier=l1%00", "force=true%00", "tier=", "force="):
            with self.subTest(query=query):
                r = self.d.request("DELETE", path_of(k) + "?" + query)
                self.assert_problem(r, 400, "invalid_argument")
        self.assertIsNotNone(self.info(k)["l1"])
        # empty pairs are nothing, as in the listing
        self.assertEqual(self.d.request("GET", path_of(k) + "?").status, 200)
        self.assertEqual(self.d.request("GET", path_of(k) + "?&&").status, 200)
        r = self.d.request("DELETE", path_of(k) + "?&tier=l1&&force=false&")
        self.assertEqual(r.status, 204, r)
        self.assertIsNone(self.info(k)["l1"])

    def test_single_delete_tier_l1(self):
        k = key("single/del-l1", 0, "ab")
        self.put_ok([{"key": k, "size_bytes": 1}])
        self.put_ok([{"key": k, "size_bytes": 1}], tier="l1")
        r = self.d.request("DELETE", path_of(k) + "?tier=l1")
        self.assertEqual(r.status, 204, r)
        j = self.info(k)
        self.assertIsNone(j["l1"])
        self.assertIs(j["l2"], True)
        # no L1 copy any more
        r = self.d.request("DELETE", path_of(k) + "?tier=l1")
        self.assertEqual(r.status, 404, r)
        r = self.d.request("DELETE", path_of(k) + "?tier=bogus")
        self.assert_problem(r, 400)
        self.assertEqual(self.get(k).status, 200)


class DeleteBatchTest(Base):
    def test_counts(self):
        ks = [key("del-counts", 0, "%02x" % i) for i in range(3)]
        self.put_ok([{"key": k, "size_bytes": 1} for k in ks])
        absent = key("del-counts", 0, "ff")
        r = self.delete([ks[0], ks[2], absent])
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"deleted": 2, "not_found": 1, "skipped_pinned": 0, "skipped_source": 0})
        self.assert_absent(ks[0])
        self.assert_absent(ks[2])
        self.assertEqual(self.get(ks[1]).status, 200)

    def test_key_named_twice_counts_once(self):
        # each key is counted once, by what happened to it: a key named
        # twice and deleted is one deleted key, not one deleted and one not
        # found
        a, b = key("del-twice", 0, "01"), key("del-twice", 0, "02")
        self.put_ok([{"key": a, "size_bytes": 1}, {"key": b, "size_bytes": 1}])
        absent = key("del-twice", 0, "ff")
        a2 = dict(a, chunk_hash_hex="01", object_group_id=0, cache_salt="")
        r = self.delete([a, absent, a2, absent, b])
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"deleted": 2, "not_found": 1, "skipped_pinned": 0, "skipped_source": 0})
        self.assert_absent(a)
        self.assert_absent(b)
        r = self.delete([a, a])
        self.assertEqual(r.json(), {"deleted": 0, "not_found": 1, "skipped_pinned": 0, "skipped_source": 0})

    def test_tier_l1_only(self):
        both = key("del-l1", 0, "01")
        only_l1 = key("del-l1", 0, "02")
        only_l2 = key("del-l1", 0, "03")
        self.put_ok([{"key": both, "size_bytes": 1}, {"key": only_l2, "size_bytes": 1}])
        self.put_ok([{"key": both, "size_bytes": 1}, {"key": only_l1, "size_bytes": 1}],
                    tier="l1")
        r = self.delete([both, only_l1, only_l2], tier="l1")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"deleted": 2, "not_found": 1, "skipped_pinned": 0, "skipped_source": 0})
        j = self.info(both)
        self.assertIsNone(j["l1"])
        self.assertIs(j["l2"], True)
        self.assert_absent(only_l1)    # in neither tier: forgotten
        j = self.info(only_l2)
        self.assertIs(j["l2"], True)

    def test_tier_l2_only(self):
        both = key("del-l2", 0, "01")
        self.put_ok([{"key": both, "size_bytes": 1}])
        self.put_ok([{"key": both, "size_bytes": 1}], tier="l1")
        r = self.delete([both], tier="l2")
        self.assertEqual(r.json(), {"deleted": 1, "not_found": 0, "skipped_pinned": 0, "skipped_source": 0})
        j = self.info(both)
        self.assertIsNotNone(j["l1"])
        self.assertIs(j["l2"], False)

    def test_tier_all_and_idempotent(self):
        ks = [key("del-all", 0, "%02x" % i) for i in range(4)]
        self.put_ok([{"key": k, "size_bytes": 1} for k in ks])
        self.put_ok([{"key": k, "size_bytes": 1} for k in ks[:2]], tier="l1")
        r = self.delete(ks, tier="all")
        self.assertEqual(r.json(), {"deleted": 4, "not_found": 0, "skipped_pinned": 0, "skipped_source": 0})
        for k in ks:
            self.assert_absent(k)
        r = self.delete(ks, tier="all")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"deleted": 0, "not_found": 4, "skipped_pinned": 0, "skipped_source": 0})
        r = self.delete(ks)     # default tier all
        self.assertEqual(r.json(), {"deleted": 0, "not_found": 4, "skipped_pinned": 0, "skipped_source": 0})

    def test_default_tier_is_all(self):
        k = key("del-default", 0, "01")
        self.put_ok([{"key": k, "size_bytes": 1}])
        self.put_ok([{"key": k, "size_bytes": 1}], tier="l1")
        r = self.delete([k])
        self.assertEqual(r.json(), {"deleted": 1, "not_found": 0, "skipped_pinned": 0, "skipped_source": 0})
        self.assert_absent(k)

    def test_bad_key_deletes_nothing(self):
        ks = [key("del-bad", 0, "%02x" % i) for i in range(3)]
        self.put_ok([{"key": k, "size_bytes": 1} for k in ks])
        r = self.delete([ks[0], key("del-bad", -1, "01"), ks[1], {"model_name": "x"}, ks[2]])
        j = self.assert_problem(r, 400, "invalid_key")
        names = [p["name"] for p in j.get("invalid_params", [])]
        self.assertTrue(any(n.startswith("keys[1]") for n in names), names)
        self.assertTrue(any(n.startswith("keys[3]") for n in names), names)
        for k in ks:
            self.assertEqual(self.get(k).status, 200)

    def test_bad_tier_or_force(self):
        k = key("del-badarg", 0, "01")
        self.put_ok([{"key": k, "size_bytes": 1}])
        for body in ({"keys": [k], "tier": "l3"}, {"keys": [k], "force": "yes"},
                     {"keys": [k], "extra": 1}, {"keys": "x"}, [k]):
            with self.subTest(body=body):
                self.assert_problem(self.d.request("DELETE", "/v1/keys", body), 400)
        self.assertEqual(self.get(k).status, 200)


class EvictionTest(unittest.TestCase):
    """l1_capacity_bytes=1000, keys of 400 bytes: at most two L1 copies."""

    def setUp(self):
        self.d = Daemon(settings={"l1_capacity_bytes": 1000})

    def tearDown(self):
        self.d.kill()

    def put(self, keys, tier):
        r = self.d.request("PUT", "/v1/keys", {"tier": tier, "entries": [
            {"key": k, "size_bytes": 400} for k in keys]})
        self.assertEqual(r.status, 200, r)

    def state(self, k):
        r = self.d.request("GET", path_of(k))
        self.assertEqual(r.status, 200, r)
        j = r.json()
        return (j["l1"] is not None, j["l2"])

    def test_lru_one_per_batch(self):
        a, b, c, d = (key("evict", 0, h) for h in ("0a", "0b", "0c", "0d"))
        self.put([a, b, c, d], "l2")
        self.put([a], "l1")
        self.put([b], "l1")
        self.assertEqual(self.state(a), (True, True))
        self.assertEqual(self.state(b), (True, True))
        self.put([c], "l1")                  # needs room: a (least recent) goes
        self.assertEqual(self.state(a), (False, True))
        self.assertEqual(self.state(b), (True, True))
        self.assertEqual(self.state(c), (True, True))
        self.put([d], "l1")                  # then b
        self.assertEqual(self.state(b), (False, True))
        self.assertEqual(self.state(c), (True, True))
        self.assertEqual(self.state(d), (True, True))

    def test_l1_only_copy_evicted_is_forgotten(self):
        a, b, c = (key("evict-l1only", 0, h) for h in ("0a", "0b", "0c"))
        self.put([a], "l1")
        self.put([b], "l1")
        self.put([c], "l1")
        r = self.d.request("GET", path_of(a))
        self.assertEqual(r.status, 404, r)
        self.assertEqual(self.state(b), (True, False))
        self.assertEqual(self.state(c), (True, False))

    def test_batch_tail_is_least_recent(self):
        x, y, z = (key("evict-batch", 0, h) for h in ("01", "02", "03"))
        self.put([x, y, z], "l2")
        self.put([x, y], "l1")               # one request: y (the tail) is older
        self.put([z], "l1")
        self.assertEqual(self.state(x), (True, True))
        self.assertEqual(self.state(y), (False, True))
        self.assertEqual(self.state(z), (True, True))

    def test_oversized_batch_keeps_heads(self):
        # three keys of 400 in one request to a 1000-byte L1: the head keys
        # are the most recent, so the tail is the one that cannot stay.
        ks = [key("evict-big", 0, h) for h in ("01", "02", "03")]
        self.put(ks, "l2")
        r = self.d.request("PUT", "/v1/keys", {"tier": "l1", "entries": [
            {"key": k, "size_bytes": 400} for k in ks]})
        if r.status == 200:
            self.assertEqual(self.state(ks[0]), (True, True))
            self.assertEqual(self.state(ks[1]), (True, True))
            self.assertEqual(self.state(ks[2]), (False, True))
        else:
            self.assertEqual(r.status, 507, r)

    def test_l1_size_above_capacity_507(self):
        k = key("evict-huge", 0, "01")
        r = self.d.request("PUT", "/v1/keys", {"tier": "l1", "entries": [
            {"key": k, "size_bytes": 1001}]})
        self.assertEqual(r.status, 507, r)
        self.assertEqual(r.json()["code"], "insufficient_capacity")
        self.assertEqual(self.d.request("GET", path_of(k)).status, 404)


class PinnedTest(Base):
    """Pins come from a LOOKUP prefetch handle (docs/lookup_and_prefetch.md)."""

    def pin(self, keys):
        r = self.d.request("POST", "/v1/prefetches", {"keys": keys, "mode": "LOOKUP"})
        self.assertEqual(r.status, 201, r)
        return r.json()["id"]

    def unpin(self, hid):
        r = self.d.request("DELETE", "/v1/prefetches/%s" % hid)
        self.assertEqual(r.status, 204, r)

    def test_batch_delete_skips_pinned(self):
        p, q = key("pin-del", 0, "01"), key("pin-del", 0, "02")
        self.put_ok([{"key": p, "size_bytes": 5}, {"key": q, "size_bytes": 5}], tier="l1")
        hid = self.pin([p])
        self.assertEqual(self.info(p)["l1"]["pins"], 1)
        r = self.delete([p, q], tier="l1")
        self.assertEqual(r.json(), {"deleted": 1, "not_found": 0, "skipped_pinned": 1, "skipped_source": 0})
        r = self.delete([p])
        self.assertEqual(r.json()["skipped_pinned"], 1, r)
        j = self.info(p)
        self.assertEqual(j["l1"]["pins"], 1)
        r = self.delete([p, p])
        self.assertEqual(r.json(), {"deleted": 0, "not_found": 0, "skipped_pinned": 1, "skipped_source": 0}, r)
        r = self.delete([p], force=True)
        self.assertEqual(r.json(), {"deleted": 1, "not_found": 0, "skipped_pinned": 0, "skipped_source": 0})
        self.assert_absent(p)
        self.d.request("DELETE", "/v1/prefetches/%s" % hid)

    def test_single_delete_pinned_409(self):
        p = key("pin-single", 0, "01")
        self.put_ok([{"key": p, "size_bytes": 5}])
        self.put_ok([{"key": p, "size_bytes": 5}], tier="l1")
        hid = self.pin([p])
        self.assert_problem(self.d.request("DELETE", path_of(p)), 409, "conflict")
        j = self.info(p)                        # nothing deleted, not even the L2 copy
        self.assertEqual(j["l1"]["pins"], 1)
        self.assertIs(j["l2"], True)
        r = self.d.request("DELETE", path_of(p) + "?tier=l2")
        self.assertEqual(r.status, 204, r)
        r = self.d.request("DELETE", path_of(p) + "?force=true")
        self.assertEqual(r.status, 204, r)
        self.assert_absent(p)
        self.d.request("DELETE", "/v1/prefetches/%s" % hid)

    def test_resize_pinned_409(self):
        p, q = key("pin-size", 0, "01"), key("pin-size", 0, "02")
        self.put_ok([{"key": p, "size_bytes": 5}], tier="l1")
        hid = self.pin([p])
        r = self.put([{"key": q, "size_bytes": 9}, {"key": p, "size_bytes": 6}])
        j = self.assert_problem(r, 409, "conflict")
        self.assertTrue(any(x["name"].startswith("entries[1]") for x in j.get("invalid_params", [])),
                        j)
        self.assert_absent(q)                   # all or nothing
        self.assertEqual(self.info(p)["size_bytes"], 5)
        self.put_ok([{"key": p, "size_bytes": 5}])          # same size is fine
        self.assertIs(self.info(p)["l2"], True)
        self.unpin(hid)
        self.assertEqual(self.info(p)["l1"]["pins"], 0)
        self.put_ok([{"key": p, "size_bytes": 6}])
        self.assertEqual(self.info(p)["size_bytes"], 6)


class PinnedEvictionTest(unittest.TestCase):
    def setUp(self):
        self.d = Daemon(settings={"l1_capacity_bytes": 1000})

    def tearDown(self):
        self.d.kill()

    def put(self, keys, tier="l1"):
        return self.d.request("PUT", "/v1/keys", {"tier": tier, "entries": [
            {"key": k, "size_bytes": 400} for k in keys]})

    def test_pinned_never_evicted(self):
        a, b, c = (key("pin-evict", 0, h) for h in ("0a", "0b", "0c"))
        self.assertEqual(self.put([a, b, c], "l2").status, 200)
        self.assertEqual(self.put([a]).status, 200)
        r = self.d.request("POST", "/v1/prefetches", {"keys": [a]})
        self.assertEqual(r.status, 201, r)
        self.assertEqual(self.put([b]).status, 200)
        self.assertEqual(self.put([c]).status, 200)    # a is LRU but pinned: b goes
        l1 = {h: self.d.request("GET", path_of(k)).json()["l1"] is not None
              for h, k in (("a", a), ("b", b), ("c", c))}
        self.assertEqual(l1, {"a": True, "b": False, "c": True})
        # pin c too: no room left for another 400 bytes
        r = self.d.request("POST", "/v1/prefetches", {"keys": [c]})
        self.assertEqual(r.status, 201, r)
        r = self.put([b])
        self.assertEqual(r.status, 507, r)
        self.assertEqual(r.json()["code"], "insufficient_capacity")
        self.assertIsNone(self.d.request("GET", path_of(b)).json()["l1"])


class ErrorShapeTest(Base):
    def test_wrong_content_type_415(self):
        body = json.dumps({"entries": [{"key": key("ct"), "size_bytes": 1}]})
        for ct in ("text/plain", "application/x-www-form-urlencoded", "application/jsonx"):
            with self.subTest(ct):
                r = self.d.request("PUT", "/v1/keys", body, {"Content-Type": ct})
                self.assert_problem(r, 415, "unsupported_media_type")
        r = self.d.request("PUT", "/v1/keys", body.encode(), {})
        self.assert_problem(r, 415, "unsupported_media_type")
        self.assert_absent(key("ct"))
        r = self.d.request("PUT", "/v1/keys", body,
                           {"Content-Type": "application/json; charset=utf-8"})
        self.assertEqual(r.status, 200, r)

    def test_invalid_json(self):
        for body in ('{"entries": [', "not json", '{"entries": []} x', "", "{'a':1}"):
            with self.subTest(body=body):
                r = self.d.request("PUT", "/v1/keys", body, {"Content-Type": "application/json"})
                self.assert_problem(r, 400, "invalid_json" if body else None)
        for method in ("DELETE",):
            r = self.d.request(method, "/v1/keys", "{", {"Content-Type": "application/json"})
            self.assert_problem(r, 400, "invalid_json")

    def test_depth_limit(self):
        deep = '{"entries":[],"x":' + "[" * 32 + "]" * 32 + "}"    # depth 33
        r = self.d.request("PUT", "/v1/keys", deep, {"Content-Type": "application/json"})
        self.assert_problem(r, 400, "invalid_json")
        ok = '{"entries":[],"x":' + "[" * 31 + "]" * 31 + "}"      # depth 32: parsed
        r = self.d.request("PUT", "/v1/keys", ok, {"Content-Type": "application/json"})
        j = self.assert_problem(r, 400)                            # unknown member x
        self.assertNotEqual(j["code"], "invalid_json", j)
        very = '{"entries":' + "[" * 5000 + "]" * 5000 + "}"
        r = self.d.request("PUT", "/v1/keys", very, {"Content-Type": "application/json"})
        self.assert_problem(r, 400)
        self.assertEqual(self.d.request("GET", "/livez").status, 200)

    def test_body_must_be_object(self):
        for body in ("[]", "1", '"x"', "null", '{"entries": {}}', '{"entries": null}', "{}"):
            with self.subTest(body=body):
                r = self.d.request("PUT", "/v1/keys", body, {"Content-Type": "application/json"})
                self.assert_problem(r, 400)

    def test_error_does_not_echo_unbounded(self):
        big = "z" * 100000
        r = self.put([{"key": key(big[:200], 0, big), "size_bytes": 1}])
        self.assert_problem(r, 400, "invalid_key")
        self.assertLess(len(r.body), 20000, len(r.body))

    def test_method_not_allowed(self):
        r = self.d.request("POST", "/v1/keys", {"entries": []})
        self.assert_problem(r, 405, "method_not_allowed")
        self.assertIn("PUT", r.headers.get("allow", ""))
        r = self.d.request("POST", "/v1/keys/m@00000000@0@ab", {"size_bytes": 1})
        self.assert_problem(r, 405, "method_not_allowed")

    def test_keep_alive_sequence(self):
        k = key("keepalive", 0, "ab")
        with Conn(self.d) as c:
            r = c.request("PUT", "/v1/keys", {"entries": [{"key": k, "size_bytes": 9}]})
            self.assertEqual(r.status, 200, r)
            r = c.request("GET", path_of(k))
            self.assertEqual(r.json()["size_bytes"], 9)
            r = c.request("DELETE", path_of(k))
            self.assertEqual(r.status, 204, r)
            r = c.request("GET", path_of(k))
            self.assertEqual(r.status, 404, r)


if __name__ == "__main__":
    unittest.main()
