"""Lookup and prefetch handles over HTTP (docs/lookup_and_prefetch.md, docs/prefetch.md): both
loaders, the worked example of §4.1, long polls that do not block other
clients, lease expiry (410, then 404), and pinned keys under eviction
pressure with a small l1_capacity_bytes.
"""

import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon  # noqa: E402


def key(i, model="m"):
    return {"model_name": model, "kv_rank": 0, "chunk_hash_hex": "%02x" % i}


SIX = [key(i) for i in range(6)]


def put(d, tier, ids, size=10):
    r = d.request("PUT", "/v1/keys", {"tier": tier, "entries": [
        {"key": key(i), "size_bytes": size} for i in ids]})
    assert r.status == 200, r
    return r


def key_info(d, i):
    r = d.request("GET", "/v1/keys/m@00000000@0@%02x" % i)
    return r.json() if r.status == 200 else None


def pins(d, i):
    info = key_info(d, i)
    return info["l1"]["pins"] if info and info["l1"] else 0


def example(d):
    put(d, "l2", [2, 3, 4])
    put(d, "l1", [0, 1, 3])


class Base(unittest.TestCase):
    settings = {}

    def setUp(self):
        self.d = Daemon(settings=self.settings)

    def tearDown(self):
        try:
            self.assertEqual(self.d.stop(), 0)
        finally:
            self.d.kill()

    def prefetch(self, **body):
        body.setdefault("keys", SIX)
        r = self.d.request("POST", "/v1/prefetches", body)
        self.assertEqual(r.status, 201, r)
        return r.json()

    def get(self, hid, query=""):
        return self.d.request("GET", "/v1/prefetches/%s%s" % (hid, query), timeout=40)

    def wait_completed(self, hid):
        r = self.get(hid, "?wait_ms=5000")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["status"], "completed")
        return r.json()


class CatalogLoader(Base):
    settings = {"handle_grace_ms": 300}

    def test_lookup_worked_example_and_no_side_effects(self):
        example(self.d)
        before = [key_info(self.d, i) for i in range(6)]
        r = self.d.request("POST", "/v1/lookup", {"keys": SIX})
        self.assertEqual(r.status, 200)
        j = r.json()
        self.assertEqual(j["l1_indices"], [0, 1, 3])
        self.assertEqual(j["l2_indices"], [2, 3, 4])
        self.assertEqual(j["found_indices"], [0, 1, 2, 3, 4])
        self.assertEqual(j["hit_keys"], 5)
        self.assertEqual(j["found_bytes"], 50)
        self.assertEqual(j["total_keys"], 6)
        self.assertEqual([key_info(self.d, i) for i in range(6)], before)

    def test_lookup_ipc_form(self):
        rank = (1 << 24) | (1 << 8)
        entries = []
        for g, chunks in ((0, [0, 1, 2, 3]), (1, [2, 3, 4]), (2, [1, 3, 5])):
            for c in chunks:
                entries.append({"key": {"model_name": "m", "kv_rank": rank,
                                        "object_group_id": g,
                                        "chunk_hash_hex": "c%d" % c},
                                "size_bytes": 1})
        self.assertEqual(self.d.request("PUT", "/v1/keys",
                                        {"entries": entries}).status, 200)
        r = self.d.request("POST", "/v1/lookup", {
            "model_name": "m", "world_size": 1, "worker_id": None,
            "chunk_hashes": ["c%d" % c for c in range(6)],
            "object_group_ids": [0, 1, 2], "attn_window": [-1, 2, 1]})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["hit_chunks"], 4)
        r = self.d.request("POST", "/v1/lookup", {
            "model_name": "m", "world_size": 1, "chunk_hashes": ["c0"],
            "attn_window": [0]})
        self.assertEqual(r.status, 400)

    def test_lookup_prefix_prefetch_lifecycle(self):
        example(self.d)
        h = self.prefetch(external_request_id="req-1")
        self.assertEqual(h["l1_found_indices"], [0, 1, 3])
        self.assertEqual(h["l2_orig_indices"], [2, 4])
        self.assertEqual(h["prefetch_request_id"], h["id"])
        self.assertEqual(h["external_request_id"], "req-1")
        self.assertEqual(h["total_requested_keys"], 6)
        j = self.wait_completed(h["id"])
        self.assertEqual(j["retained_indices"], [0, 1, 2, 3, 4])
        self.assertEqual(j["hit_keys"], 5)
        self.assertEqual(pins(self.d, 2), 1)
        self.assertTrue(key_info(self.d, 2)["l1"]["temporary"])
        # repeatable
        self.assertEqual(self.get(h["id"]).json()["retained_indices"], [0, 1, 2, 3, 4])
        r = self.d.request("POST", "/v1/prefetches/%d/release" % h["id"], {"indices": [2]})
        self.assertEqual(r.status, 200, r)
        self.assertIsNone(key_info(self.d, 2)["l1"])  # temporary copy dropped
        self.assertEqual(self.d.request("DELETE", "/v1/prefetches/%d" % h["id"]).status, 204)
        self.assertEqual(self.d.request("DELETE", "/v1/prefetches/%d" % h["id"]).status, 204)
        self.assertEqual([pins(self.d, i) for i in range(6)], [0] * 6)
        self.assertEqual(self.get(h["id"]).json()["status"], "released")
        time.sleep(0.5)
        self.assertEqual(self.get(h["id"]).status, 404)

    def test_expiry_410_then_404(self):
        example(self.d)
        h = self.prefetch(lease_ms=200)
        self.wait_completed(h["id"])
        self.assertEqual(pins(self.d, 0), 1)
        time.sleep(0.35)
        r = self.get(h["id"])
        self.assertEqual(r.status, 410)
        self.assertEqual(r.json()["code"], "handle_expired")
        self.assertEqual(pins(self.d, 0), 0)
        time.sleep(0.4)
        self.assertEqual(self.get(h["id"]).status, 404)

    def test_warm(self):
        example(self.d)
        h = self.prefetch(mode="WARM")
        self.assertEqual(h["l1_found_indices"], [])
        j = self.wait_completed(h["id"])
        self.assertEqual(j["found_indices"], [0, 1, 2, 3, 4])
        for i in range(5):
            info = key_info(self.d, i)
            self.assertEqual(info["l1"]["state"], "ready")
            self.assertEqual(info["l1"]["pins"], 0)
            self.assertFalse(info["l1"]["temporary"])

    def test_lease_is_capped_at_max_lease_ms(self):
        # lease_ms is bounded by max_lease_ms (default 600000).
        example(self.d)
        before = time.time() * 1000
        h = self.prefetch(lease_ms=10 ** 9)
        after = time.time() * 1000
        self.assertLessEqual(h["expires_at_ms"], after + 600000 + 5)
        self.assertGreaterEqual(h["expires_at_ms"], before + 600000 - 1000)

    def test_bad_requests(self):
        for body in ({"keys": SIX, "lease_ms": 0}, {"keys": SIX, "extra_count": 128},
                     {"keys": SIX, "mode": "NOPE"}, {"keys": [{"chunk_hash": "00"}]},
                     {"keys": SIX, "unknown": 1}):
            r = self.d.request("POST", "/v1/prefetches", body)
            self.assertEqual(r.status, 400, body)
            self.assertEqual(r.headers["content-type"].split(";")[0],
                             "application/problem+json")
        self.assertEqual(self.get(1, "?wait_ms=30001").status, 400)
        self.assertEqual(self.get(12345).status, 404)


class SmallL1(Base):
    settings = {"l1_capacity_bytes": 50}

    def test_pinned_keys_are_not_evicted(self):
        example(self.d)
        h = self.prefetch()
        self.wait_completed(h["id"])
        put(self.d, "l2", [5])
        # L1 is full of pinned keys: storing into L1 cannot evict them
        r = self.d.request("PUT", "/v1/keys", {"tier": "l1", "entries": [
            {"key": key(9), "size_bytes": 10}]})
        self.assertEqual(r.status, 507, r)
        h2 = self.prefetch(keys=[key(5)])
        j = self.wait_completed(h2["id"])
        self.assertEqual(j["retained_indices"], [])
        for i in range(5):
            self.assertEqual(key_info(self.d, i)["l1"]["state"], "ready")
        self.assertEqual(self.d.request("DELETE", "/v1/prefetches/%d" % h["id"]).status, 204)
        h3 = self.prefetch(keys=[key(5)])
        self.assertEqual(self.wait_completed(h3["id"])["retained_indices"], [0])


class ExternalLoader(Base):
    settings = {"loader": "external", "load_timeout_ms": 800}

    def tasks(self, query=""):
        r = self.d.request("GET", "/v1/loads" + query, timeout=40)
        self.assertEqual(r.status, 200, r)
        return r.json()["tasks"]

    def test_single_flight_and_failures(self):
        example(self.d)
        a = self.prefetch()
        b = self.prefetch(trim_policy="SPARSE")
        self.assertEqual(b["l2_orig_indices"], [2, 4])
        tasks = self.tasks()
        self.assertEqual(len(tasks), 1)
        t = tasks[0]
        self.assertEqual([k["key"]["chunk_hash_hex"] for k in t["keys"]], ["02", "04"])
        self.assertEqual(self.get(a["id"]).json()["status"], "pending")
        r = self.d.request("POST", "/v1/loads/%d" % t["task"],
                           {"loaded": [key(4)], "failed": [0]})
        self.assertEqual(r.status, 200, r)
        ja = self.wait_completed(a["id"])
        jb = self.wait_completed(b["id"])
        self.assertEqual(ja["retained_indices"], [0, 1])
        self.assertEqual(jb["retained_indices"], [0, 1, 3, 4])
        self.assertEqual(pins(self.d, 3), 1)
        self.assertEqual(pins(self.d, 0), 2)
        self.assertEqual(self.d.request("POST", "/v1/loads/%d" % t["task"],
                                        {"loaded": [0]}).status, 404)

    def test_wait_ms_does_not_block_others(self):
        example(self.d)
        out = {}

        def poller():
            out["tasks"] = self.tasks("?wait_ms=5000")
        th = threading.Thread(target=poller)
        th.start()
        time.sleep(0.2)
        self.assertEqual(self.d.request("GET", "/livez").status, 200)
        h = self.prefetch()
        th.join(10)
        self.assertEqual(len(out["tasks"]), 1)
        res = {}

        def waiter():
            res["r"] = self.get(h["id"], "?wait_ms=5000")
        th = threading.Thread(target=waiter)
        th.start()
        time.sleep(0.2)
        self.assertEqual(self.get(h["id"]).json()["status"], "pending")
        self.d.request("POST", "/v1/loads/%d" % out["tasks"][0]["task"], {"loaded": [0, 1]})
        th.join(10)
        self.assertEqual(res["r"].json()["status"], "completed")

    def test_load_timeout(self):
        example(self.d)
        h = self.prefetch(trim_policy="SPARSE")
        time.sleep(1.0)
        j = self.get(h["id"]).json()
        self.assertEqual(j["status"], "completed")
        self.assertEqual(j["retained_indices"], [0, 1, 3])
        self.assertEqual(self.tasks(), [])
        self.assertIsNone(key_info(self.d, 2)["l1"])


if __name__ == "__main__":
    unittest.main()
