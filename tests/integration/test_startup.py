"""Start-up with and without data_dir: a configuration that checks out
starts; with data_dir the daemon restores its catalogue, layouts and
page-token secret across restarts (docs/persistence.md), drops
a torn journal tail, and refuses a corrupt snapshot with a message naming
the file. (The kill -9 load test lives in test_persistence.py.)"""
import glob
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, kvidxd_path  # noqa: E402

JSON = {"Content-Type": "application/json"}


def key(i, model="m"):
    return {"model_name": model, "kv_rank": 0, "chunk_hash_hex": "%08x" % i}


def put(d, keys, tier="l2", size=100):
    body = json.dumps({"tier": tier, "entries": [{"key": k, "size_bytes": size}
                                                  for k in keys]}).encode()
    r = d.request("PUT", "/v1/keys", body, JSON)
    assert r.status == 200, r
    return r


def listing(d, query=""):
    r = d.request("GET", "/v1/keys" + query)
    assert r.status == 200, r
    return r.json()


def all_keys(d):
    out, tok = [], None
    while True:
        q = "?page_size=1000" + ("&page_token=" + tok if tok else "")
        page = listing(d, q)
        out += [e["key"]["chunk_hash_hex"] for e in page["entries"]]
        tok = page["next_page_token"]
        if not tok:
            return out


IGNORE_XFSZ = ("import os, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
               "os.execv(sys.argv[1], sys.argv[1:])")


class XfszDaemon(Daemon):
    """kvidxd with SIGXFSZ ignored, so a file size limit set with
    prlimit(2) makes its journal writes fail with EFBIG."""

    def command(self):
        return [sys.executable, "-c", IGNORE_XFSZ] + super().command()


def layout(model, dims):
    return json.dumps({"model_name": model, "shapes": [dims], "dtypes": ["bfloat16"]}).encode()


def layout_models(d):
    r = d.request("GET", "/v1/layouts")
    assert r.status == 200, r
    return {x["model_name"]: x["shapes"] for x in r.json()["layouts"]}


class StartupTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvidx-data-")
        self.daemons = []

    def tearDown(self):
        for d in self.daemons:
            d.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, **settings):
        s = {"data_dir": self.dir, "fsync": "always"}
        s.update(settings)
        d = Daemon(settings=s)
        self.daemons.append(d)
        return d

    def test_no_arguments_check_config_uses_defaults(self):
        p = subprocess.run([kvidxd_path(), "--check-config"], capture_output=True, timeout=10)
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_data_dir_files_and_modes(self):
        d = self.start()
        self.assertEqual(d.request("GET", "/readyz").status, 200)
        secret = os.path.join(self.dir, "page_token.secret")
        self.assertEqual(os.stat(secret).st_mode & 0o777, 0o600)
        self.assertEqual(len(glob.glob(os.path.join(self.dir, "journal-" + "?" * 16 + ".kvj"))), 1)
        self.assertEqual(d.stop(), 0)

    def test_restart_keeps_keys_layouts_and_tiers(self):
        d = self.start()
        put(d, [key(i) for i in range(50)], "l2")
        put(d, [key(i) for i in range(40, 60)], "l1", size=100)
        layout = {"model_name": "m", "shapes": [[2, 3]], "dtypes": ["bfloat16"]}
        self.assertEqual(d.request("PUT", "/v1/layouts", json.dumps(layout).encode(),
                                   JSON).status, 200)
        r = d.request("DELETE", "/v1/keys", json.dumps(
            {"keys": [key(i) for i in range(10)]}).encode(), JSON)
        self.assertEqual(r.json()["deleted"], 10)
        self.assertEqual(d.stop(), 0)
        d2 = self.start()
        self.assertIn("restored from", d2.log())
        self.assertEqual(sorted(all_keys(d2)), ["%08x" % i for i in range(10, 60)])
        self.assertEqual(len(listing(d2, "?tier=l1&page_size=1000")["entries"]), 20)
        self.assertEqual(len(listing(d2, "?tier=l2&page_size=1000")["entries"]), 40)
        r = d2.request("GET", "/v1/layouts")
        self.assertEqual(len(r.json()["layouts"]), 1)

    def test_kill9_keeps_acknowledged_writes(self):
        d = self.start()
        for b in range(5):
            put(d, [key(b * 10 + i) for i in range(10)])
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(5)
        d2 = self.start()
        self.assertEqual(len(all_keys(d2)), 50)

    def test_page_tokens_survive_restart(self):
        d = self.start()
        put(d, [key(i) for i in range(30)])
        page = listing(d, "?page_size=10")
        tok = page["next_page_token"]
        self.assertTrue(tok)
        self.assertEqual(d.stop(), 0)
        d2 = self.start()
        r = d2.request("GET", "/v1/keys?page_size=10&page_token=" + tok)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(len(r.json()["entries"]), 10)

    def test_torn_journal_tail_is_dropped(self):
        d = self.start()
        put(d, [key(i) for i in range(20)])
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(5)
        j = sorted(glob.glob(os.path.join(self.dir, "journal-*.kvj")))[-1]
        size = os.path.getsize(j)
        with open(j, "ab") as f:
            f.write(b"\x30\x00\x00\x00garbage")  # a torn record
        d2 = self.start()
        self.assertIn("torn or corrupt", d2.log())
        self.assertEqual(len(all_keys(d2)), 20)
        self.assertEqual(os.path.getsize(j), size)

    def test_snapshot_rotation_and_restore(self):
        d = self.start(snapshot_journal_bytes="4KiB", fsync="everysec")
        for b in range(20):
            put(d, [key(b * 20 + i) for i in range(20)])
        self.assertTrue(d.wait_log("snapshot: generation .* written", 10))
        self.assertEqual(d.stop(), 0)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "snapshot.kvs")))
        d2 = self.start()
        self.assertEqual(len(all_keys(d2)), 400)

    @unittest.skipUnless(hasattr(resource, "prlimit"), "needs prlimit(2)")
    def test_layout_write_refused_by_the_journal_changes_nothing(self):
        d = XfszDaemon(settings={"data_dir": self.dir, "fsync": "always"})
        self.daemons.append(d)
        self.assertEqual(d.request("PUT", "/v1/layouts", layout("a", [2]), JSON).status, 200)
        j = sorted(glob.glob(os.path.join(self.dir, "journal-*.kvj")))[-1]
        pid = d.proc.pid
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (os.path.getsize(j) + 600,
                                                      resource.RLIM_INFINITY))
        try:
            refused = None
            for n in range(1, 100):
                # Replacing "a" and adding new models, until the journal fails.
                r = d.request("PUT", "/v1/layouts", layout("a" if n % 2 else "m%d" % n, [n + 2]),
                              JSON)
                if r.status != 200:
                    self.assertEqual(r.status, 503, r)
                    self.assertEqual(r.json()["code"], "storage_unavailable")
                    refused = n
                    break
                before = layout_models(d)
            self.assertIsNotNone(refused, "never refused past RLIMIT_FSIZE")
            self.assertEqual(layout_models(d), before, "a refused layout write changed state")
            r = d.request("DELETE", "/v1/layouts?model_name=a")
            self.assertEqual(r.status, 503, r)
            self.assertEqual(layout_models(d), before)
        finally:
            resource.prlimit(pid, resource.RLIMIT_FSIZE,
                             (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        end = time.monotonic() + 10
        while d.request("PUT", "/v1/layouts", layout("z", [7]), JSON).status != 200:
            self.assertLess(time.monotonic(), end, "writes did not resume")
            time.sleep(0.2)
        before["z"] = [[7]]
        self.assertEqual(layout_models(d), before)
        self.assertEqual(d.stop(), 0)
        d2 = self.start()
        self.assertEqual(layout_models(d2), before, "replay differs from what was served")

    def test_corrupt_snapshot_refuses_to_start(self):
        d = self.start(snapshot_journal_bytes="4KiB")
        for b in range(20):
            put(d, [key(b * 20 + i) for i in range(20)])
        self.assertTrue(d.wait_log("snapshot: generation .* written", 10))
        self.assertEqual(d.stop(), 0)
        snap = os.path.join(self.dir, "snapshot.kvs")
        with open(snap, "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0x55]))
        p = subprocess.run([kvidxd_path(), "--set", "listen=127.0.0.1:0",
                            "--set", "data_dir=" + self.dir], capture_output=True, timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(b"snapshot.kvs", p.stderr)
        self.assertIn(b"refusing to start", p.stderr)


if __name__ == "__main__":
    unittest.main()
