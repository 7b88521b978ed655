"""ingest_allow_from: with auth on, LMCache's emitter (which sends no
Authorization) may post /events and manage /instances from the networks
listed, without a token; nothing else is waived: other routes, other
networks, and a request that does carry a bad token still get 401. The
list is checked at start (a bad network exits 2) and follows SIGHUP."""

import os
import secrets
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon  # noqa: E402

BATCH = {"batches": [{"instance_id": "mp-1", "incarnation": 1, "seq": 1, "event_type": "store",
                      "tier": "l1", "backend": "cpu",
                      "entries": [{"key": {"model_name": "m", "kv_rank": 0,
                                           "object_group_id": 0, "chunk_hash_hex": "aa"},
                                   "size_bytes": 10}]}]}
REGISTER = {"instance_id": "mp-1", "ip": "127.0.0.1", "http_port": 8080}


class IngestAllow(unittest.TestCase):
    def start(self, allow):
        self.tmp = tempfile.mkdtemp(prefix="kvidx-ingest-")
        self.admin = "a" + secrets.token_urlsafe(24)
        tokens = os.path.join(self.tmp, "tokens")
        with open(tokens, "w") as f:
            f.write("%s admin\n" % self.admin)
        os.chmod(tokens, 0o600)
        self.config = "auth_tokens_file = %s\ningest_allow_from = %s\n"
        self.tokens = tokens
        self.d = Daemon(config_text=self.config % (tokens, allow))
        return self.d

    def tearDown(self):
        if getattr(self, "d", None):
            try:
                self.assertEqual(self.d.stop(), 0)
            finally:
                self.d.kill()

    def test_listed_network_posts_events_and_manages_instances_without_a_token(self):
        d = self.start("10.0.0.0/8, 127.0.0.0/8")
        r = d.request("POST", "/instances", REGISTER)
        self.assertEqual(r.status, 200, r)
        r = d.request("POST", "/events", BATCH)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["applied"], 1)
        self.assertEqual(d.request("PUT", "/instances/mp-1/heartbeat").status, 200)
        self.assertEqual(d.request("GET", "/healthz").status, 200)
        # What was ingested is there, for a token that may read it.
        r = d.request("GET", "/directory/keys", headers={"Authorization": "Bearer " + self.admin})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["total"], 1)
        self.assertEqual(d.request("DELETE", "/instances/mp-1").status, 204)
        m = d.request("GET", "/metrics", headers={"Authorization": "Bearer " + self.admin})
        self.assertRegex(m.body.decode(), r"kvidx_auth_ingest_admitted_total [1-9]")

    def test_nothing_else_is_waived(self):
        d = self.start("127.0.0.1")
        for method, path, body in (("GET", "/directory/keys", b""),
                                   ("GET", "/instances", b""),
                                   ("POST", "/directory/lookup", {"keys": []}),
                                   ("GET", "/v1/keys", b""),
                                   ("PUT", "/v1/keys", {"entries": []}),
                                   ("GET", "/v1/stats", b"")):
            r = d.request(method, path, body)
            self.assertEqual(r.status, 401, "%s %s" % (method, path))
        # A request that carries a token is judged by it.
        r = d.request("POST", "/events", BATCH, {"Authorization": "Bearer wrong"})
        self.assertEqual(r.status, 401, r)
        r = d.request("POST", "/events", BATCH, {"Authorization": "Bearer " + self.admin})
        self.assertEqual(r.status, 200, r)

    def test_other_networks_need_a_token_until_sighup_lists_theirs(self):
        d = self.start("10.0.0.0/8 fd00::/8")
        self.assertEqual(d.request("POST", "/events", BATCH).status, 401)
        self.assertEqual(d.request("POST", "/instances", REGISTER).status, 401)
        d.write_config(self.config % (self.tokens, "127.0.0.1/32"))
        d.reload()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if d.request("POST", "/events", BATCH).status == 200:
                break
            time.sleep(0.05)
        else:
            self.fail("SIGHUP did not apply ingest_allow_from")

    def test_empty_list_admits_no_one(self):
        d = self.start('""')
        self.assertEqual(d.request("POST", "/events", BATCH).status, 401)

    def test_a_bad_network_is_a_configuration_error(self):
        tmp = tempfile.mkdtemp(prefix="kvidx-ingest-")
        for bad in ("10.0.0.1/8", "10.0.0.0/33", "localhost", "::1/129"):
            d = Daemon(settings={"ingest_allow_from": bad}, args=["--check-config"], start=False)
            import subprocess
            p = subprocess.run(d.command(), capture_output=True, text=True, timeout=10,
                               cwd=tmp)
            self.assertEqual(p.returncode, 2, bad)
            self.assertIn("ingest_allow_from", p.stderr, bad)


if __name__ == "__main__":
    unittest.main()
