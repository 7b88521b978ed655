"""Listing over HTTP: GET /v1/keys (docs/page_tokens.md, docs/http.md).

Covers the KeyListPage shape, the exact order (cache_salt, model_name,
kv_rank, object_group_id, chunk_hash bytes), every filter, page_size rules,
paging to the end, page tokens (mismatch, tampering, garbage, another
process, expiry) and the listing guarantee under concurrent inserts and
deletes between pages.
"""

import os
import random
import sys
import time
import unittest
from urllib.parse import quote, urlencode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon  # noqa: E402

PROBLEM = "application/problem+json"
FIELDS = {"model_name", "kv_rank", "object_group_id", "chunk_hash_hex", "cache_salt"}


def mk(model, rank=0, h="ab", group=0, salt=""):
    return {"model_name": model, "kv_rank": rank, "object_group_id": group,
            "chunk_hash_hex": h, "cache_salt": salt}


def order_key(k):
    return (k["cache_salt"].encode(), k["model_name"].encode(), k["kv_rank"],
            k["object_group_id"], bytes.fromhex(k["chunk_hash_hex"]))


def ident(k):
    return (k["model_name"], k["kv_rank"], k["object_group_id"], k["chunk_hash_hex"],
            k["cache_salt"])


class Base(unittest.TestCase):
    settings = {}

    @classmethod
    def setUpClass(cls):
        cls.d = Daemon(settings=cls.settings)

    @classmethod
    def tearDownClass(cls):
        cls.d.kill()

    def put(self, keys, tier="l2", size=None, d=None):
        d = d or self.d
        for i in range(0, len(keys), 20000):
            part = keys[i:i + 20000]
            r = d.request("PUT", "/v1/keys", {"tier": tier, "entries": [
                {"key": k, "size_bytes": size or (1 + j % 1000)} for j, k in enumerate(part)]},
                timeout=30)
            self.assertEqual(r.status, 200, r)
            # A key named twice in one batch is stored and counted once.
            self.assertEqual(r.json(), {"stored": len({ident(k) for k in part})})

    def delete(self, keys):
        r = self.d.request("DELETE", "/v1/keys", {"keys": keys})
        self.assertEqual(r.status, 200, r)
        return r.json()

    def list(self, params=None, d=None, status=200):
        d = d or self.d
        q = urlencode(params or {}, quote_via=quote)
        r = d.request("GET", "/v1/keys" + ("?" + q if q else ""), timeout=30)
        self.assertEqual(r.status, status, r)
        return r

    def page(self, params=None, d=None):
        r = self.list(params, d)
        self.assertTrue(r.headers.get("content-type", "").startswith("application/json"), r)
        j = r.json()
        self.assertEqual(set(j), {"entries", "next_page_token"})
        self.assertIsInstance(j["entries"], list)
        tok = j["next_page_token"]
        self.assertTrue(tok is None or (isinstance(tok, str) and tok), tok)
        return j

    def list_all(self, params=None, page_size=None, max_pages=100000, sizes=None):
        """Every entry of a full listing; page sizes cycle through sizes."""
        params = dict(params or {})
        out, tok, n = [], None, 0
        while True:
            p = dict(params)
            ps = sizes[n % len(sizes)] if sizes else page_size
            if ps is not None:
                p["page_size"] = ps
            if tok:
                p["page_token"] = tok
            j = self.page(p)
            for e in j["entries"]:
                self.assertEqual(set(e), {"key", "size_bytes"}, e)
                self.assertEqual(set(e["key"]), FIELDS, e)
            out += j["entries"]
            tok = j["next_page_token"]
            n += 1
            if tok is None:
                return out
            self.assertLess(n, max_pages, "listing does not end")

    def problem(self, r, status, code=None):
        self.assertEqual(r.status, status, r)
        self.assertTrue(r.headers.get("content-type", "").startswith(PROBLEM), r.headers)
        j = r.json()
        self.assertEqual(j["status"], status)
        if code:
            self.assertEqual(j["code"], code, j)
        return j


class OrderAndFilterTest(Base):
    """One data set across salts, models, ranks, groups and hash lengths."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        rng = random.Random(20240601)
        salts = ["", "a", "ab", "b", "B", "a-b", "\u00e9"]
        models = ["m", "m/x", "M", "mm", "m-x", "n/\u00e9", "a"]
        ranks = [0, 1, 255, 256, 0x01000000, 0x02010201, 0xFFFFFFFF]
        groups = [0, 1, 15, 16, 256, 65535]
        hashes = ["00", "0000", "000000", "01", "0100", "0f", "10", "ff", "ff00", "fe" * 64,
                  "7f", "80", "8000"]
        keys = {}
        while len(keys) < 400:
            k = mk(rng.choice(models), rng.choice(ranks), rng.choice(hashes), rng.choice(groups),
                   rng.choice(salts))
            keys[ident(k)] = k
        cls.keys = list(keys.values())
        # tiers: first third only L1, second third both, rest only L2
        n = len(cls.keys)
        cls.l1 = cls.keys[: 2 * n // 3]
        cls.l2 = cls.keys[n // 3:]
        t = unittest.TestCase()
        for tier, ks in (("l1", cls.l1), ("l2", cls.l2)):
            r = cls.d.request("PUT", "/v1/keys", {"tier": tier, "entries": [
                {"key": k, "size_bytes": 7} for k in ks]}, timeout=30)
            t.assertEqual(r.status, 200, r)
        cls.l1_ids = {ident(k) for k in cls.l1}
        cls.l2_ids = {ident(k) for k in cls.l2}

    def expect(self, pred=lambda k: True):
        return [ident(k) for k in sorted(self.keys, key=order_key) if pred(k)]

    def got(self, params=None, **kw):
        return [ident(e["key"]) for e in self.list_all(params, **kw)]

    def test_entry_shape(self):
        j = self.page({"page_size": 3})
        self.assertEqual(len(j["entries"]), 3)
        e = j["entries"][0]
        self.assertEqual(set(e), {"key", "size_bytes"})
        self.assertEqual(set(e["key"]), FIELDS)
        self.assertEqual(e["size_bytes"], 7)
        self.assertIsInstance(e["key"]["kv_rank"], int)
        self.assertIsInstance(e["key"]["object_group_id"], int)
        self.assertIsInstance(e["key"]["cache_salt"], str)
        self.assertIsInstance(j["next_page_token"], str)

    def test_order_one_page(self):
        self.assertEqual(self.got(page_size=5000), self.expect())

    def test_order_many_pages(self):
        self.assertEqual(self.got(page_size=7), self.expect())

    def test_order_varying_page_size(self):
        self.assertEqual(self.got(sizes=[1, 13, 2, 50]), self.expect())

    def test_filter_model(self):
        for m in ("m", "m/x", "n/\u00e9", "absent-model", "m/"):
            with self.subTest(model=m):
                self.assertEqual(self.got({"model_name": m}, page_size=9),
                                 self.expect(lambda k: k["model_name"] == m))

    def test_filter_salt(self):
        for s in ("a", "ab", "\u00e9", "zzz"):
            with self.subTest(salt=s):
                self.assertEqual(self.got({"cache_salt": s}, page_size=11),
                                 self.expect(lambda k: k["cache_salt"] == s))

    def test_filter_empty_salt(self):
        # absent cache_salt = all salts
        got = [ident(e["key"]) for e in self.list_all({"model_name": "m"}, page_size=5000)]
        self.assertTrue(any(i[4] != "" for i in got))
        empties = self.expect(lambda k: k["cache_salt"] == "")
        self.assertTrue(empties)
        r = self.d.request("GET", "/v1/keys?cache_salt=&page_size=5000")
        self.assertEqual(r.status, 200, r)
        self.assertEqual([ident(e["key"]) for e in r.json()["entries"]], empties)
        self.assertEqual(self.got({"cache_salt": ""}, page_size=17), empties)

    def test_filter_salt_and_model(self):
        self.assertEqual(self.got({"cache_salt": "a", "model_name": "m/x"}, page_size=3),
                         self.expect(lambda k: k["cache_salt"] == "a"
                                     and k["model_name"] == "m/x"))

    def test_filter_rank(self):
        for spelling, v in (("0", 0), ("256", 256), ("0x100", 256), ("0x02010201", 0x02010201),
                            ("33620481", 0x02010201), ("0xffffffff", 0xFFFFFFFF),
                            ("4294967295", 0xFFFFFFFF), ("0xFFFFFFFF", 0xFFFFFFFF)):
            with self.subTest(spelling):
                self.assertEqual(self.got({"kv_rank": spelling}, page_size=5000),
                                 self.expect(lambda k: k["kv_rank"] == v))

    def test_filter_group(self):
        for spelling, v in (("0", 0), ("16", 16), ("0x10", 16), ("65535", 65535),
                            ("0xffff", 65535), ("2", 2)):
            with self.subTest(spelling):
                self.assertEqual(self.got({"object_group_id": spelling}, page_size=5000),
                                 self.expect(lambda k: k["object_group_id"] == v))

    def test_filter_combined(self):
        self.assertEqual(
            self.got({"model_name": "m", "kv_rank": "0x1", "object_group_id": "0",
                      "tier": "l1"}, page_size=2),
            self.expect(lambda k: k["model_name"] == "m" and k["kv_rank"] == 1
                        and k["object_group_id"] == 0 and ident(k) in self.l1_ids))

    def test_filter_tier(self):
        self.assertEqual(self.got({"tier": "l1"}, page_size=5000),
                         self.expect(lambda k: ident(k) in self.l1_ids))
        self.assertEqual(self.got({"tier": "l2"}, page_size=31),
                         self.expect(lambda k: ident(k) in self.l2_ids))
        self.assertEqual(self.got({"tier": "any"}, page_size=5000), self.expect())

    def test_bad_filters(self):
        for params in ({"kv_rank": "-1"}, {"kv_rank": "4294967296"}, {"kv_rank": "0x"},
                       {"kv_rank": "1.5"}, {"kv_rank": "abc"}, {"object_group_id": "65536"},
                       {"object_group_id": "-1"}, {"tier": "l3"}, {"tier": "all"},
                       {"model_name": "a@b"}, {"model_name": ""}, {"cache_salt": "a/b"},
                       {"cache_salt": "s" * 129}):
            with self.subTest(params=params):
                self.problem(self.list(params, status=400), 400)

    def test_unknown_parameter(self):
        for q in ("foo=1", "model=m", "page_size=5&pagesize=5", "model_name=m&model_name=m"):
            with self.subTest(q):
                r = self.d.request("GET", "/v1/keys?" + q)
                self.problem(r, 400)
        r = self.d.request("GET", "/v1/keys?foo=1")
        self.problem(r, 400, "invalid_argument")

    def test_page_size_errors(self):
        for v in ("-1", "abc", "1.5", "1e2", "0x10x", "+5 "):
            with self.subTest(v):
                r = self.list({"page_size": v}, status=400)
                self.problem(r, 400, "invalid_argument")

    def test_page_size_may_change_and_filters_kept(self):
        j = self.page({"model_name": "m", "page_size": 2})
        tok = j["next_page_token"]
        self.assertIsNotNone(tok)
        rest = self.page({"model_name": "m", "page_size": 5000, "page_token": tok})
        got = [ident(e["key"]) for e in j["entries"] + rest["entries"]]
        self.assertIsNone(rest["next_page_token"])
        self.assertEqual(got, self.expect(lambda k: k["model_name"] == "m"))

    def test_token_with_other_filters(self):
        j = self.page({"model_name": "m", "page_size": 1})
        tok = j["next_page_token"]
        for other in ({"model_name": "mm"}, {}, {"model_name": "m", "cache_salt": ""},
                      {"model_name": "m", "tier": "l1"}, {"model_name": "m", "kv_rank": "0"},
                      {"model_name": "m", "object_group_id": "0"}):
            with self.subTest(other=other):
                p = dict(other, page_token=tok, page_size=1)
                self.problem(self.list(p, status=400), 400, "page_token_mismatch")
        # tier=any spelled out is the default: same filters
        r = self.list({"model_name": "m", "tier": "any", "page_token": tok})
        self.assertEqual(r.status, 200)

    def test_tampered_token(self):
        tok = self.page({"page_size": 1})["next_page_token"]
        self.assertGreater(len(tok), 20)
        for pos in (len(tok) // 2, len(tok) // 2 + 5, len(tok) - 6, 10):
            c = tok[pos]
            flipped = tok[:pos] + ("B" if c != "B" else "C") + tok[pos + 1:]
            with self.subTest(pos=pos):
                r = self.list({"page_size": 1, "page_token": flipped}, status=400)
                self.problem(r, 400, "invalid_page_token")
        r = self.list({"page_size": 1, "page_token": tok[:-4]}, status=400)
        self.problem(r, 400, "invalid_page_token")
        r = self.list({"page_size": 1, "page_token": tok + "AAAA"}, status=400)
        self.problem(r, 400, "invalid_page_token")

    def test_garbage_token(self):
        for g in ("x", "garbage", "!!!!", "A" * 100, "%%%", "a b", "\u00e9" * 30, "A" * 5000):
            with self.subTest(g=g[:20]):
                r = self.d.request("GET", "/v1/keys?" + urlencode({"page_token": g},
                                                                  quote_via=quote))
                self.assertIn(r.status, (400, 414), r)
                if r.status == 400:
                    self.assertEqual(r.json()["code"], "invalid_page_token", r)
        r = self.d.request("GET", "/v1/keys?page_token=")
        self.assertIn(r.status, (200, 400), r)


class PageSizeTest(Base):
    """More than 5000 keys, to see the default and the cap."""

    N = 5100

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.keys = [mk("ps", 0, "%06x" % i) for i in range(cls.N)]
        r = cls.d.request("PUT", "/v1/keys", {"entries": [
            {"key": k, "size_bytes": 1} for k in cls.keys]}, timeout=30)
        assert r.status == 200, r

    def test_absent_is_500(self):
        j = self.page()
        self.assertEqual(len(j["entries"]), 500)
        self.assertIsNotNone(j["next_page_token"])

    def test_zero_is_500(self):
        j = self.page({"page_size": 0})
        self.assertEqual(len(j["entries"]), 500)
        self.assertIsNotNone(j["next_page_token"])

    def test_capped_at_5000(self):
        j = self.page({"page_size": 6000})
        self.assertLessEqual(len(j["entries"]), 5000)
        self.assertEqual(len(j["entries"]), 5000)    # nothing filtered: a full page
        self.assertIsNotNone(j["next_page_token"])
        j2 = self.page({"page_size": 6000, "page_token": j["next_page_token"]})
        self.assertEqual(len(j2["entries"]), self.N - 5000)
        self.assertIsNone(j2["next_page_token"])

    def test_exact_sizes(self):
        for ps in (1, 499, 501, 5000):
            with self.subTest(ps):
                j = self.page({"page_size": ps})
                self.assertEqual(len(j["entries"]), ps)

    def test_every_key_once(self):
        got = self.list_all(sizes=[700, 3, 1000, 0])
        ids = [e["key"]["chunk_hash_hex"] for e in got]
        self.assertEqual(len(ids), len(set(ids)))
        self.assertEqual(ids, ["%06x" % i for i in range(self.N)])

    def test_last_page_exact_end(self):
        # a page that ends exactly at the last key: the next page (if a
        # token is given) is empty and ends with null.
        j = self.page({"page_size": 5000})
        j2 = self.page({"page_size": 100, "page_token": j["next_page_token"]})
        self.assertEqual(len(j2["entries"]), 100)
        tok = j2["next_page_token"]
        if tok is not None:
            j3 = self.page({"page_size": 100, "page_token": tok})
            self.assertEqual(j3["entries"], [])
            self.assertIsNone(j3["next_page_token"])


class ScanLimitTest(Base):
    """A page scans at most 10 × page_size + 1000 keys (docs/page_tokens.md)."""

    def test_sparse_filter_gives_short_pages(self):
        l2 = [mk("scan", 0, "%06x" % i) for i in range(3000)]
        l1 = mk("scan", 0, "%06x" % 5000)
        self.put(l2)
        self.put([l1], tier="l1")
        j = self.page({"tier": "l1", "page_size": 1})
        # the only L1 key sits after 3000 L2-only keys: more than 1010 away
        self.assertEqual(j["entries"], [])
        self.assertIsNotNone(j["next_page_token"])
        got = [e["key"]["chunk_hash_hex"] for e in self.list_all({"tier": "l1"}, page_size=1)]
        self.assertEqual(got, ["%06x" % 5000])


class OtherProcessTest(Base):
    def test_token_from_other_daemon_expired(self):
        ks = [mk("other", 0, "%02x" % i) for i in range(3)]
        self.put(ks)
        d2 = Daemon()
        try:
            self.put(ks, d=d2)
            j = self.page({"page_size": 1}, d=d2)
            tok = j["next_page_token"]
            self.assertIsNotNone(tok)
            r = self.list({"page_size": 1, "page_token": tok}, status=410)
            self.problem(r, 410, "page_token_expired")
            # the second daemon still takes its own token
            self.page({"page_size": 1, "page_token": tok}, d=d2)
        finally:
            d2.kill()


class ExpiryTest(Base):
    settings = {"page_token_ttl_s": 1}

    def test_expired_token(self):
        self.put([mk("exp", 0, "%02x" % i) for i in range(3)])
        tok = self.page({"page_size": 1})["next_page_token"]
        self.assertIsNotNone(tok)
        j = self.page({"page_size": 1, "page_token": tok})   # still fresh
        self.assertEqual(len(j["entries"]), 1)
        time.sleep(2.5)
        r = self.list({"page_size": 1, "page_token": tok}, status=410)
        self.problem(r, 410, "page_token_expired")


class ConsistencyTest(Base):
    def test_changes_between_pages(self):
        rng = random.Random(7)
        model = "cons"
        # stable keys: even hash values; volatile: odd ones
        stable = [mk(model, 0, "%04x" % (2 * i)) for i in range(80)]
        volatile = [mk(model, 0, "%04x" % (2 * i + 1)) for i in range(0, 80, 3)]
        # a key of another salt/model sorting before and after
        self.put(stable + volatile)
        present_volatile = {ident(k): k for k in volatile}
        seen = []
        tok = None
        pages = 0
        next_odd = 1000
        while True:
            p = {"page_size": 7, "model_name": model}
            if tok:
                p["page_token"] = tok
            j = self.page(p)
            seen += [ident(e["key"]) for e in j["entries"]]
            tok = j["next_page_token"]
            pages += 1
            if tok is None:
                break
            self.assertLess(pages, 200)
            last = int(seen[-1][3], 16) if seen else 0
            if pages > 12:
                continue
            # insert volatile keys before and after the cursor
            new = []
            for _ in range(3):
                h = rng.randrange(0, max(last, 1)) | 1       # before
                new.append(mk(model, 0, "%04x" % h))
                if last + 1 < 160:
                    h = rng.randrange(last + 1, 160) | 1     # after
                    new.append(mk(model, 0, "%04x" % h))
            next_odd += 2
            new.append(mk(model, 0, "%04x" % next_odd))      # far after
            self.put(new)
            for k in new:
                present_volatile[ident(k)] = k
            # delete some volatile keys, before and after the cursor
            victims = rng.sample(sorted(present_volatile), min(4, len(present_volatile)))
            self.delete([present_volatile.pop(v) for v in victims])
        counts = {}
        for i in seen:
            counts[i] = counts.get(i, 0) + 1
        dup = [i for i, c in counts.items() if c > 1]
        self.assertEqual(dup, [], "returned twice")
        missing = [ident(k) for k in stable if ident(k) not in counts]
        self.assertEqual(missing, [], "stable keys missing")
        # and in order
        hashes = [int(i[3], 16) for i in seen]
        self.assertEqual(hashes, sorted(hashes))

    def test_delete_cursor_key(self):
        model = "cons-cursor"
        ks = [mk(model, 0, "%02x" % i) for i in range(10)]
        self.put(ks)
        j = self.page({"model_name": model, "page_size": 3})
        got = [e["key"]["chunk_hash_hex"] for e in j["entries"]]
        # delete the key the cursor points after, and its successor
        self.delete([mk(model, 0, got[-1]), mk(model, 0, "03")])
        out = []
        tok = j["next_page_token"]
        while tok:
            jj = self.page({"model_name": model, "page_size": 3, "page_token": tok})
            out += [e["key"]["chunk_hash_hex"] for e in jj["entries"]]
            tok = jj["next_page_token"]
        self.assertEqual(got + out, ["%02x" % i for i in range(10) if i != 3])


if __name__ == "__main__":
    unittest.main()
