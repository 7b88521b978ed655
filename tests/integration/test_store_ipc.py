"""PUT /v1/keys in the ipc form: {"tier", "model_name", "world_size",
"worker_id", "cache_salt", "chunk_hashes", "object_group_ids",
"size_bytes" | "sizes"}. The keys are the ones a lookup's ipc form names,
in the same order (group-major, then chunk, then rank); the store is all
or nothing, counts distinct keys, takes its sizes from size_bytes (one for
all), sizes (one per chunk) or the model's layout; every other rule is the
key form's. Also the single-key PUT /v1/keys/{canonical} bodies that the
fast scanner reads.
"""

import os
import sys
import unittest
from urllib.parse import quote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon  # noqa: E402

PROBLEM = "application/problem+json"
MODEL = "meta-llama/Llama-3.1-8B"
JSON = {"Content-Type": "application/json"}


def ipc_rank(world, r):
    return world << 24 | r << 16 | world << 8 | r


def canonical(model, rank, group, h, salt=""):
    s = "%s@%08x@%x@%s" % (model, rank, group, h)
    return s + "@" + salt if salt else s


def ipc_keys(model, world, worker, hashes, groups=(0,), salt=""):
    """The keys of an ipc-form request, in its order."""
    ranks = [worker] if worker is not None else list(range(world))
    out = []
    for g in groups:
        for h in hashes:
            for r in ranks:
                out.append({"model_name": model, "kv_rank": ipc_rank(world, r),
                            "object_group_id": g, "chunk_hash_hex": h, "cache_salt": salt})
    return out


class Base(unittest.TestCase):
    settings = {}

    @classmethod
    def setUpClass(cls):
        cls.d = Daemon(settings=cls.settings)

    @classmethod
    def tearDownClass(cls):
        cls.d.kill()

    def store(self, **body):
        return self.d.request("PUT", "/v1/keys", body)

    def info(self, k):
        c = canonical(k["model_name"], k["kv_rank"], k["object_group_id"], k["chunk_hash_hex"],
                      k["cache_salt"])
        return self.d.request("GET", "/v1/keys/" + quote(c, safe="@"))

    def found(self, keys):
        r = self.d.request("POST", "/v1/lookup", {"keys": keys})
        self.assertEqual(r.status, 200, r)
        return r.json()["found_indices"]

    def assert_problem(self, r, status, code=None):
        self.assertEqual(r.status, status, r)
        self.assertTrue(r.headers.get("content-type", "").startswith(PROBLEM), r.headers)
        j = r.json()
        if code is not None:
            self.assertEqual(j["code"], code, j)
        return j


class IpcStoreTest(Base):
    def test_expands_like_the_lookup(self):
        hashes = ["a1a1", "b2b2", "c3c3"]
        r = self.store(tier="l2", model_name=MODEL, world_size=2, worker_id=None, cache_salt="s1",
                       chunk_hashes=hashes, object_group_ids=[0, 5], size_bytes=4096)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"stored": 12})
        # The lookup's ipc form sees every key, every chunk.
        r = self.d.request("POST", "/v1/lookup", {
            "model_name": MODEL, "world_size": 2, "worker_id": None, "cache_salt": "s1",
            "chunk_hashes": hashes, "object_group_ids": [0, 5]})
        self.assertEqual(r.status, 200, r)
        j = r.json()
        self.assertEqual(j["total_keys"], 12)
        self.assertEqual(j["found_indices"], list(range(12)))
        self.assertEqual(j["hit_chunks"], 3)
        self.assertEqual(j["found_bytes"], 12 * 4096)
        # The explicit keys, in the expansion's order, are the stored ones.
        keys = ipc_keys(MODEL, 2, None, hashes, (0, 5), "s1")
        self.assertEqual(self.found(keys), list(range(12)))
        for k in keys:
            r = self.info(k)
            self.assertEqual(r.status, 200, (k, r))
            self.assertEqual(r.json()["size_bytes"], 4096)
            self.assertTrue(r.json()["l2"])
            self.assertIsNone(r.json()["l1"])
        # A neighbour that the expansion does not name is absent.
        other = dict(keys[0], kv_rank=ipc_rank(4, 0))
        self.assertEqual(self.info(other).status, 404)

    def test_sizes_per_chunk_and_the_default_group(self):
        hashes = ["0101", "0202", "0303"]
        r = self.store(model_name=MODEL, world_size=4, chunk_hashes=hashes, sizes=[10, 20, 30])
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"stored": 12})
        for i, k in enumerate(ipc_keys(MODEL, 4, None, hashes)):
            r = self.info(k)
            self.assertEqual(r.status, 200, (k, r))
            self.assertEqual(r.json()["size_bytes"], 10 * (1 + i // 4), k)

    def test_one_worker(self):
        hashes = ["dddd", "eeee"]
        r = self.store(model_name=MODEL, world_size=4, worker_id=1, chunk_hashes=hashes,
                       size_bytes=7, tier="l1")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"stored": 2})
        for k in ipc_keys(MODEL, 4, 1, hashes):
            self.assertEqual(k["kv_rank"], 0x04010401)
            j = self.info(k).json()
            self.assertEqual(j["size_bytes"], 7)
            self.assertEqual(j["l1"]["state"], "ready")
            self.assertFalse(j["l2"])
        self.assertEqual(self.found(ipc_keys(MODEL, 4, 0, hashes)), [])

    def test_a_chunk_named_twice_is_stored_and_counted_once(self):
        r = self.store(model_name=MODEL, world_size=2, chunk_hashes=["f0f0", "f1f1", "f0f0"],
                       sizes=[1, 2, 3])
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"stored": 4})
        # the last position wins, with its size
        k = ipc_keys(MODEL, 2, None, ["f0f0"])[0]
        self.assertEqual(self.info(k).json()["size_bytes"], 3)

    def test_re_put_resizes(self):
        body = dict(model_name=MODEL, world_size=1, chunk_hashes=["9999"])
        self.assertEqual(self.store(size_bytes=5, **body).json(), {"stored": 1})
        self.assertEqual(self.store(size_bytes=6, **body).json(), {"stored": 1})
        k = ipc_keys(MODEL, 1, None, ["9999"])[0]
        self.assertEqual(self.info(k).json()["size_bytes"], 6)

    def test_all_or_nothing(self):
        good = ["7a7a", "7b7b"]
        cases = [
            (dict(chunk_hashes=good + ["xyz"], size_bytes=5), 400, "invalid_key"),
            (dict(chunk_hashes=good + ["abc"], size_bytes=5), 400, "invalid_key"),
            (dict(chunk_hashes=good, sizes=[1]), 400, "invalid_argument"),
            (dict(chunk_hashes=good, sizes=[1, 0]), 400, "invalid_argument"),
            (dict(chunk_hashes=good, sizes=[1, 2 ** 40 + 1]), 400, "invalid_argument"),
            (dict(chunk_hashes=good, sizes=[1, 2], size_bytes=5), 400, "invalid_argument"),
            (dict(chunk_hashes=good, size_bytes=0), 400, "invalid_argument"),
            (dict(chunk_hashes=good, size_bytes=1.5), 400, "invalid_argument"),
            (dict(chunk_hashes=good, size_bytes=5, attn_window=[-1]), 400, "invalid_argument"),
            (dict(chunk_hashes=good, size_bytes=5, keys=[]), 400, "invalid_argument"),
            (dict(chunk_hashes=good, size_bytes=5, tier="all"), 400, "invalid_argument"),
            (dict(chunk_hashes=good, size_bytes=5, object_group_ids=[70000]), 400,
             "invalid_argument"),
            (dict(chunk_hashes=good, size_bytes=5, worker_id=2), 400, "invalid_argument"),
            (dict(chunk_hashes="7a7a", size_bytes=5), 400, "invalid_argument"),
        ]
        for extra, status, code in cases:
            body = dict(model_name=MODEL, world_size=2)
            body.update(extra)
            r = self.d.request("PUT", "/v1/keys", body)
            self.assert_problem(r, status, code)
        for k in ipc_keys(MODEL, 2, None, good):
            self.assertEqual(self.info(k).status, 404, k)
        # A bad model name is a key error too.
        r = self.store(model_name="a@b", world_size=1, chunk_hashes=good, size_bytes=5)
        self.assert_problem(r, 400, "invalid_key")
        # The key form and the ipc form do not mix.
        r = self.d.request("PUT", "/v1/keys", {"entries": [], "model_name": MODEL,
                                               "world_size": 1, "chunk_hashes": good,
                                               "size_bytes": 5})
        self.assert_problem(r, 400)

    def test_sizes_from_the_layout(self):
        model = "ipc-layout/x"
        body = dict(model_name=model, world_size=2, chunk_hashes=["5a5a"])
        r = self.store(**body)
        self.assert_problem(r, 409, "conflict")
        r = self.d.request("PUT", "/v1/layouts", {"model_name": model, "world_size": 2,
                                                  "shapes": [[10]], "dtypes": ["uint8"]})
        self.assertEqual(r.status, 200, r)
        r = self.store(**body)
        self.assertEqual(r.status, 200, r)
        for k in ipc_keys(model, 2, None, ["5a5a"]):
            self.assertEqual(self.info(k).json()["size_bytes"], 10)


class IpcLimitTest(Base):
    settings = {"max_keys_per_request": 8}

    def test_too_many_keys(self):
        r = self.store(model_name=MODEL, world_size=4, chunk_hashes=["aa", "bb", "cc"],
                       size_bytes=5)
        self.assert_problem(r, 413, "too_many_keys")
        r = self.store(model_name=MODEL, world_size=4, chunk_hashes=["aa", "bb"], size_bytes=5)
        self.assertEqual(r.json(), {"stored": 8})


class SingleKeyBodyTest(Base):
    """The bodies of PUT /v1/keys/{canonical} the scanner reads, and their
    neighbours that it leaves to cJSON, answer the same way."""

    def path(self, h):
        return "/v1/keys/" + quote(canonical(MODEL, 0x01000100, 0, h), safe="@")

    def test_plain_and_unusual_bodies(self):
        ok = [(b'{"size_bytes":5}', 5, None), (b' {"tier":"l1", "size_bytes":6}\n', 6, "ready"),
              (b'{"size_bytes":7,"tier":"l2"}', 7, None),
              (b'{"size_bytes":8,"tier":"l\\u0031"}', 8, "ready")]
        for i, (body, size, l1) in enumerate(ok):
            p = self.path("%02x" % (0x10 + i))
            r = self.d.request("PUT", p, body, JSON)
            self.assertEqual(r.status, 200, (body, r))
            self.assertEqual(r.json(), {"stored": 1})
            j = self.d.request("GET", p).json()
            self.assertEqual(j["size_bytes"], size, body)
            self.assertEqual(j["l1"] and j["l1"]["state"], l1, body)
        bad = [(b'{"size_bytes":0}', 400), (b'{"size_bytes":5,"size_bytes":5}', 400),
               (b'{"size_bytes":5,"tier":"l3"}', 400), (b'{"size_bytes":5} x', 400),
               (b'{"size_bytes":5,}', 400), (b'{"size_bytes":1.5}', 400),
               (b'{"size_bytes":5,"x":1}', 400), (b'{}', 409), (b'{"tier":"l1"}', 409),
               (b'{"size_bytes":1099511627777}', 400)]
        for body, status in bad:
            p = self.path("ee")
            r = self.d.request("PUT", p, body, JSON)
            self.assert_problem(r, status)
            self.assertEqual(self.d.request("GET", p).status, 404, body)


if __name__ == "__main__":
    unittest.main()
