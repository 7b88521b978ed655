"""The fs: L2 source against a real directory and a real kvidxd.

Files are written the way LMCache's FS L2 adapter writes them (a temporary
name, or a file under a temporary subdirectory, then a rename onto the
final `.data` name), and then deleted, renamed away, truncated, replaced by
names that do not parse; the directory is moved away and back and
replaced; inotify overflows are forced (by the test switch, and for real by
stopping the daemon while the kernel queue fills). After each step the full
listing (GET /v1/keys, every page) must equal the valid .data files on disk
with their sizes. Also: lookups and prefetches see these keys as L2 hits,
the API cannot delete or resize them, a restart does not resurrect them
from the journal or a snapshot, /readyz waits for the first scan while
/livez answers, and start-up refuses a directory it cannot read (exit 2).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

from harness import Daemon, kvidxd_path

MODEL = "meta-llama/Llama-3.1-8B"
RANK = 0x01000100


def hash_hex(i):
    return ("%08x" % i) * 8


def key(i, model=MODEL, rank=RANK, group=0, salt=""):
    k = {"model_name": model, "kv_rank": rank, "object_group_id": group,
         "chunk_hash_hex": hash_hex(i), "cache_salt": salt}
    return k


def fs_name(k, plain_rank=False, legacy=False):
    """LMCache's FS L2 adapter file name of key k."""
    model = k["model_name"].replace("/", "-SEP-")
    rank = ("%08x" if plain_rank else "0x%08x") % k["kv_rank"]
    if legacy:
        return "%s@%s@%s.data" % (model, rank, k["chunk_hash_hex"])
    name = "%s@%s@%x@%s" % (model, rank, k["object_group_id"], k["chunk_hash_hex"])
    if k["cache_salt"]:
        name += "@" + k["cache_salt"]
    return name + ".data"


def canonical(k):
    s = "%s@%08x@%x@%s" % (k["model_name"], k["kv_rank"], k["object_group_id"],
                           k["chunk_hash_hex"])
    return s + ("@" + k["cache_salt"] if k["cache_salt"] else "")


def ident(k):
    return (k["model_name"], k["kv_rank"], k["object_group_id"], k["chunk_hash_hex"],
            k.get("cache_salt", ""))


def lmcache_write(d, k, size, tmp_dir=None, **name_args):
    """Writes like FSL2Adapter: <stem>.tmp (or tmp_dir/<name>) then rename."""
    final = os.path.join(d, fs_name(k, **name_args))
    if tmp_dir:
        tmp = os.path.join(d, tmp_dir, os.path.basename(final))
    else:
        tmp = final[:-len(".data")] + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"\0" * size)
    os.replace(tmp, final)
    return final


def scratch_dir():
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix="kvidx-fs-", dir=base)


def wait_for(pred, timeout=5.0, every=0.02):
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() >= end:
            return v
        time.sleep(every)


class FsBase(unittest.TestCase):
    settings = {}

    def setUp(self):
        self.dir = scratch_dir()
        self.d = None

    def tearDown(self):
        try:
            if self.d is not None and self.d.running():
                self.assertEqual(self.d.stop(), 0, self.d.log()[-3000:])
        finally:
            if self.d is not None:
                self.d.kill()
            shutil.rmtree(self.dir, ignore_errors=True)
            shutil.rmtree(self.dir + ".away", ignore_errors=True)

    def start(self, wait_ready=True, **extra):
        if self.d is not None:
            self.d.kill()
        s = {"l2_source": "fs:" + self.dir, "l2_source_reconnect_max_ms": 200}
        s.update(self.settings)
        s.update(extra)
        self.d = Daemon(settings=s)
        if wait_ready:
            self.assertTrue(wait_for(lambda: self.d.request("GET", "/readyz").status == 200, 10),
                            self.d.log())
        return self.d

    # -- what the daemon says ---------------------------------------------
    def listing(self, **query):
        """Every key of a full listing: ident -> size_bytes (no key twice)."""
        out = {}
        token = None
        for _ in range(10000):
            q = "page_size=500" + "".join("&%s=%s" % kv for kv in query.items())
            if token:
                q += "&page_token=" + token
            r = self.d.request("GET", "/v1/keys?" + q)
            self.assertEqual(r.status, 200, r)
            j = r.json()
            for e in j["entries"]:
                i = ident(e["key"])
                self.assertNotIn(i, out, "listed twice")
                out[i] = e["size_bytes"]
            token = j["next_page_token"]
            if token is None:
                return out
        self.fail("listing did not end")

    def source(self):
        r = self.d.request("GET", "/v1/stats")
        self.assertEqual(r.status, 200)
        srcs = r.json()["sources"]
        self.assertEqual(len(srcs), 1)
        return srcs[0]

    def get(self, k):
        return self.d.request("GET", "/v1/keys/" + canonical(k))

    def assert_listing(self, expect, timeout=5.0):
        want = {ident(k): size for k, size in expect}
        got = wait_for(lambda: (lambda g: g if g == want else None)(self.listing()), timeout)
        self.assertEqual(self.listing() if got is None else got, want)


class InitialScanAndChanges(FsBase):
    def test_what_is_indexed_and_what_is_skipped(self):
        d = self.dir
        os.mkdir(os.path.join(d, "tmp"))
        good = [
            (key(1), 100),
            (key(2, model="plain"), 7),
            (key(3, group=0x1f), 300),
            (key(4, salt="alice"), 400),
            (key(5, group=2, salt="bob"), 5),
        ]
        for k, size in good:
            lmcache_write(d, k, size)
        # The two other spellings LMCache has written: rank without 0x, and
        # the legacy 3-field form of a group-0 unsalted key.
        good.append((key(6), 66))
        lmcache_write(d, key(6), 66, plain_rank=True)
        good.append((key(7, model="old"), 77))
        lmcache_write(d, key(7, model="old"), 77, legacy=True)
        # Skipped: an empty file, names that do not parse, a directory and
        # a symlink named like keys; ignored: temporary files, the tmp
        # subdirectory and a file inside it, other names.
        open(os.path.join(d, fs_name(key(8))), "wb").close()
        for bad in ("garbage.data", "m@0x1@0@aa.data", "m@0x00000001@0@xyz.data", "x@y.data"):
            with open(os.path.join(d, bad), "wb") as f:
                f.write(b"x")
        os.mkdir(os.path.join(d, fs_name(key(9))))
        os.symlink(os.path.join(d, fs_name(key(1))), os.path.join(d, fs_name(key(10))))
        with open(os.path.join(d, "tmp", fs_name(key(11))), "wb") as f:
            f.write(b"x")
        with open(os.path.join(d, fs_name(key(12))[:-5] + ".tmp"), "wb") as f:
            f.write(b"x")
        with open(os.path.join(d, "README"), "wb") as f:
            f.write(b"x")

        self.start()
        self.assert_listing(good, timeout=0)
        s = self.source()
        self.assertEqual(s["name"], "fs:" + d)
        self.assertEqual(s["kind"], "fs")
        self.assertEqual(s["state"], "live")
        self.assertFalse(s["stale"])
        self.assertTrue(s["ready"])
        self.assertEqual(s["keys"], len(good))
        self.assertEqual(s["bytes"], sum(size for _, size in good))
        self.assertEqual(s["skipped_by_reason"],
                         {"bad_name": 4, "empty": 1, "not_regular": 2, "too_large": 0})
        self.assertEqual(s["skipped"], 7)
        self.assertEqual(s["ignored"], 3)  # tmp/, the .tmp file, README
        self.assertEqual(s["scans"], 1)
        self.assertEqual(s["rescans"], 0)
        # GET names the source; the L1 state is untouched.
        r = self.get(key(4, salt="alice"))
        self.assertEqual(r.status, 200, r)
        j = r.json()
        self.assertEqual(j["size_bytes"], 400)
        self.assertTrue(j["l2"])
        self.assertIsNone(j["l1"])
        self.assertEqual(j["l2_sources"], ["fs:" + d])
        # tier=l2 lists them, tier=l1 does not.
        self.assertEqual(len(self.listing(tier="l2")), len(good))
        self.assertEqual(self.listing(tier="l1"), {})

    def test_every_kind_of_change_is_followed(self):
        d = self.dir
        os.mkdir(os.path.join(d, "tmp"))
        disk = {}
        for i in range(20):
            lmcache_write(d, key(i), 10 + i)
            disk[i] = 10 + i
        self.start()

        def check(msg):
            self.assert_listing([(key(i), s) for i, s in disk.items()])
            self.assertEqual(self.source()["keys"], len(disk), msg)

        check("first scan")
        # New files, both ways LMCache writes them.
        for i in range(20, 30):
            lmcache_write(d, key(i), 1000 + i, tmp_dir="tmp" if i % 2 else None)
            disk[i] = 1000 + i
        check("written")
        # Rewritten with another size (rename onto the existing name).
        lmcache_write(d, key(3), 5000)
        disk[3] = 5000
        check("resized")
        # Deleted.
        for i in (0, 1, 2):
            os.unlink(os.path.join(d, fs_name(key(i))))
            del disk[i]
        check("deleted")
        # Renamed away: to a temporary name, out of the directory, under tmp/.
        os.rename(os.path.join(d, fs_name(key(4))), os.path.join(d, "x.tmp"))
        os.rename(os.path.join(d, fs_name(key(5))), os.path.join(self.dir + "-out"))
        os.rename(os.path.join(d, fs_name(key(6))), os.path.join(d, "tmp", fs_name(key(6))))
        for i in (4, 5, 6):
            del disk[i]
        check("renamed away")
        os.unlink(self.dir + "-out")
        # Renamed from one key's name to another's.
        os.rename(os.path.join(d, fs_name(key(7))), os.path.join(d, fs_name(key(77))))
        disk[77] = disk.pop(7)
        check("renamed")
        # Truncated to zero: by truncate(2) and by an open that truncates.
        os.truncate(os.path.join(d, fs_name(key(8))), 0)
        with open(os.path.join(d, fs_name(key(9))), "wb"):
            pass
        del disk[8], disk[9]
        check("truncated")
        # ... and written again in place (a closed write).
        with open(os.path.join(d, fs_name(key(9))), "wb") as f:
            f.write(b"y" * 99)
        disk[9] = 99
        check("rewritten in place")
        # Names that do not parse are skipped and counted, never indexed.
        before = self.source()["skipped_by_reason"]["bad_name"]
        for bad in ("nope.data", "m@0xZZ@0@aa.data"):
            with open(os.path.join(d, "t.tmp"), "wb") as f:
                f.write(b"z")
            os.replace(os.path.join(d, "t.tmp"), os.path.join(d, bad))
        check("bad names")
        self.assertEqual(self.source()["skipped_by_reason"]["bad_name"], before + 2)
        # A hard link onto a .data name.
        os.link(os.path.join(d, fs_name(key(10))), os.path.join(d, fs_name(key(110))))
        disk[110] = disk[10]
        check("hard link")
        # Two spellings of one key: one key, gone only when both are.
        lmcache_write(d, key(11), disk[11], plain_rank=True)
        check("alias added")
        os.unlink(os.path.join(d, fs_name(key(11))))
        check("one alias removed")
        os.unlink(os.path.join(d, fs_name(key(11), plain_rank=True)))
        del disk[11]
        check("both aliases removed")
        s = self.source()
        self.assertEqual(s["state"], "live")
        self.assertEqual(s["rescans"], 0, "changes are followed without a rescan")
        self.assertGreater(s["events"], 0)


class KeyStoreInterplay(FsBase):
    settings = {"handle_grace_ms": 300}

    def test_lookup_and_prefetch_see_l2_hits(self):
        for i in range(4):
            lmcache_write(self.dir, key(i), 10)
        self.start()
        keys = [key(i) for i in range(6)]
        r = self.d.request("POST", "/v1/lookup", {"keys": keys})
        self.assertEqual(r.status, 200, r)
        j = r.json()
        self.assertEqual(j["l2_indices"], [0, 1, 2, 3])
        self.assertEqual(j["l1_indices"], [])
        self.assertEqual(j["found_indices"], [0, 1, 2, 3])
        self.assertEqual(j["hit_keys"], 4)
        self.assertEqual(j["found_bytes"], 40)
        # LOOKUP prefetch: the leading run is loaded from L2 into L1.
        r = self.d.request("POST", "/v1/prefetches", {"keys": keys})
        self.assertEqual(r.status, 201, r)
        h = r.json()
        self.assertEqual(h["l2_orig_indices"], [0, 1, 2, 3])
        r = self.d.request("GET", "/v1/prefetches/%d?wait_ms=5000" % h["id"], timeout=10)
        self.assertEqual(r.json()["status"], "completed", r)
        self.assertEqual(r.json()["retained_indices"], [0, 1, 2, 3])
        g = self.get(key(0)).json()
        self.assertEqual(g["l1"]["state"], "ready")
        self.assertEqual(g["l1"]["pins"], 1)
        self.assertEqual(g["l2_sources"], ["fs:" + self.dir])
        # Release: the temporary L1 copy goes, the source's copy stays.
        self.assertEqual(self.d.request("DELETE", "/v1/prefetches/%d" % h["id"]).status, 204)
        g = self.get(key(0)).json()
        self.assertIsNone(g["l1"])
        self.assertTrue(g["l2"])
        self.assert_listing([(key(i), 10) for i in range(4)])

    def test_delete_and_put_beside_a_source(self):
        d = self.dir
        lmcache_write(d, key(1), 64)
        lmcache_write(d, key(2), 64)
        self.start()
        # The API cannot delete a source's copy.
        r = self.d.request("DELETE", "/v1/keys", {"keys": [key(1), key(3)]})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"deleted": 0, "not_found": 1, "skipped_pinned": 0,
                                    "skipped_source": 1})
        r = self.d.request("DELETE", "/v1/keys", {"tier": "l2", "force": True, "keys": [key(1)]})
        self.assertEqual(r.json()["skipped_source"], 1)
        r = self.d.request("DELETE", "/v1/keys/" + canonical(key(1)))
        self.assertEqual(r.status, 409, r)
        self.assertEqual(r.json()["code"], "conflict")
        r = self.d.request("DELETE", "/v1/keys/" + canonical(key(1)) + "?tier=l1")
        self.assertEqual(r.status, 404, r)
        # ... nor resize it.
        r = self.d.request("PUT", "/v1/keys/" + canonical(key(1)),
                           {"size_bytes": 65, "tier": "l2"})
        self.assertEqual(r.status, 409, r)
        # An API store of the same key with its size: one key, both copies.
        r = self.d.request("PUT", "/v1/keys", {"tier": "l2",
                                               "entries": [{"key": key(1), "size_bytes": 64}]})
        self.assertEqual(r.status, 200, r)
        self.assert_listing([(key(1), 64), (key(2), 64)])
        stats = self.d.request("GET", "/v1/stats").json()
        self.assertEqual(stats["keys"]["total"], 2)
        self.assertEqual(stats["keys"]["l2"], 1, "one L2 copy stored through the API")
        self.assertEqual(stats["keys"]["l2_source"], 2)
        self.assertEqual(stats["bytes"]["l2_source"], 128)
        # Deleting the API copy leaves the source's.
        r = self.d.request("DELETE", "/v1/keys/" + canonical(key(1)))
        self.assertEqual(r.status, 204, r)
        g = self.get(key(1)).json()
        self.assertTrue(g["l2"])
        self.assertEqual(g["l2_sources"], ["fs:" + d])
        self.assertEqual(self.d.request("DELETE", "/v1/keys/" + canonical(key(1))).status, 409)
        # An L1 copy beside the source's: deleting it works, the key stays.
        r = self.d.request("PUT", "/v1/keys", {"tier": "l1",
                                               "entries": [{"key": key(2), "size_bytes": 64}]})
        self.assertEqual(r.status, 200, r)
        r = self.d.request("DELETE", "/v1/keys", {"keys": [key(2)]})
        self.assertEqual(r.json()["deleted"], 1)
        self.assertEqual(self.get(key(2)).json()["l1"], None)
        # The API stores key 2 in L2, then the file goes: the API copy stays.
        self.d.request("PUT", "/v1/keys", {"tier": "l2",
                                           "entries": [{"key": key(2), "size_bytes": 64}]})
        os.unlink(os.path.join(d, fs_name(key(2))))
        self.assertTrue(wait_for(lambda: self.get(key(2)).json()["l2_sources"] == []))
        g = self.get(key(2)).json()
        self.assertTrue(g["l2"])
        # The file of key 1 goes: nothing holds it any more.
        os.unlink(os.path.join(d, fs_name(key(1))))
        self.assertTrue(wait_for(lambda: self.get(key(1)).status == 404))

    def test_two_sources_holding_one_key(self):
        other = scratch_dir()
        try:
            lmcache_write(self.dir, key(1), 8)
            lmcache_write(other, key(1), 8)
            lmcache_write(other, key(2), 9)
            self.start(l2_source="fs:%s fs:%s" % (self.dir, other))
            g = self.get(key(1)).json()
            self.assertEqual(g["l2_sources"], ["fs:" + self.dir, "fs:" + other])
            os.unlink(os.path.join(other, fs_name(key(1))))
            self.assertTrue(wait_for(lambda: self.get(key(1)).json()["l2_sources"] ==
                                     ["fs:" + self.dir]))
            stats = self.d.request("GET", "/v1/stats").json()["sources"]
            self.assertEqual([(s["name"], s["keys"]) for s in stats],
                             [("fs:" + self.dir, 1), ("fs:" + other, 1)])
            self.assert_listing([(key(1), 8), (key(2), 9)])
        finally:
            shutil.rmtree(other, ignore_errors=True)

    def test_metrics(self):
        for i in range(3):
            lmcache_write(self.dir, key(i), 10)
        self.start()
        r = self.d.request("GET", "/metrics")
        self.assertEqual(r.status, 200)
        text = r.body.decode()
        label = 'source="fs:%s"' % self.dir
        self.assertIn("kvidx_source_keys{%s} 3" % label, text)
        self.assertIn("kvidx_source_bytes{%s} 30" % label, text)
        self.assertIn('kvidx_source_state{%s,state="live"} 1' % label, text)
        self.assertIn('kvidx_source_state{%s,state="scanning"} 0' % label, text)
        self.assertIn("kvidx_source_stale{%s} 0" % label, text)
        self.assertIn("kvidx_source_scans_total{%s} 1" % label, text)
        self.assertIn('kvidx_fs_source_skipped_files{%s,reason="bad_name"} 0' % label, text)
        self.assertIn("kvidx_fs_source_inotify_overflows_total{%s} 0" % label, text)
        self.assertIn("kvidx_ready 1", text)
        helps = re.findall(r"^# HELP (\S+)", text, re.M)
        self.assertEqual(len(helps), len(set(helps)), "a family described twice")


class Readiness(FsBase):
    def test_readyz_503_during_a_slow_first_scan_livez_200(self):
        for i in range(5):
            lmcache_write(self.dir, key(i), 10)
        self.start(wait_ready=False, l2_source_test_scan_delay_ms=1500)
        r = self.d.request("GET", "/readyz")
        self.assertEqual(r.status, 503, r)
        self.assertEqual(r.json()["code"], "not_ready")
        self.assertEqual(self.d.request("GET", "/livez").status, 200)
        s = self.source()
        self.assertEqual(s["state"], "scanning")
        self.assertFalse(s["ready"])
        self.assertFalse(self.d.request("GET", "/v1/stats").json()["ready"])
        self.assertIn("kvidx_ready 0", self.d.request("GET", "/metrics").body.decode())
        self.assertTrue(wait_for(lambda: self.d.request("GET", "/readyz").status == 200, 10))
        self.assertEqual(self.source()["state"], "live")
        self.assert_listing([(key(i), 10) for i in range(5)])

    def test_a_directory_that_cannot_be_read_at_start_exits_2(self):
        missing = os.path.join(self.dir, "missing")
        p = subprocess.run([kvidxd_path(), "--set", "listen=127.0.0.1:0",
                            "--set", "l2_source=fs:" + missing],
                           capture_output=True, timeout=30)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(missing.encode(), p.stderr)
        self.assertIn(b"No such file or directory", p.stderr)
        a_file = os.path.join(self.dir, "file")
        open(a_file, "w").close()
        p = subprocess.run([kvidxd_path(), "--set", "listen=127.0.0.1:0",
                            "--set", "l2_source=fs:" + a_file],
                           capture_output=True, timeout=30)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(b"Not a directory", p.stderr)
        p = subprocess.run([kvidxd_path(), "--set", "listen=127.0.0.1:0",
                            "--set", "l2_source=fs:relative/dir"],
                           capture_output=True, timeout=30)
        self.assertEqual(p.returncode, 2, p.stderr)


class Rescans(FsBase):
    def test_forced_overflow_rescans_and_keeps_every_key_listed(self):
        for i in range(50):
            lmcache_write(self.dir, key(i), 10)
        self.start(l2_source_test_overflow_file=".kvidx-test-overflow",
                   l2_source_test_scan_delay_ms=600)
        disk = {i: 10 for i in range(50)}
        self.assert_listing([(key(i), s) for i, s in disk.items()])
        open(os.path.join(self.dir, ".kvidx-test-overflow"), "w").close()
        self.assertTrue(wait_for(lambda: self.source()["state"] == "rescanning", 3))
        # During the rescan: changes still apply, and no key still on disk
        # leaves the listing.
        lmcache_write(self.dir, key(100), 7)
        disk[100] = 7
        os.unlink(os.path.join(self.dir, fs_name(key(0))))
        del disk[0]
        while self.source()["state"] == "rescanning":
            got = self.listing()
            for i in range(1, 50):
                self.assertIn(ident(key(i)), got, "a key on disk vanished during a rescan")
            time.sleep(0.05)
        s = self.source()
        self.assertEqual(s["state"], "live")
        self.assertEqual(s["inotify_overflows"], 1)
        self.assertEqual(s["rescans"], 1)
        self.assert_listing([(key(i), sz) for i, sz in disk.items()])

    def test_real_inotify_overflow_while_the_daemon_is_stopped(self):
        try:
            with open("/proc/sys/fs/inotify/max_queued_events") as f:
                limit = int(f.read())
        except OSError:
            self.skipTest("no /proc/sys/fs/inotify/max_queued_events")
        if limit > 200000:
            self.skipTest("inotify queue too large to fill (%d)" % limit)
        for i in range(100):
            lmcache_write(self.dir, key(i), 10)
        self.start()
        disk = {i: 10 for i in range(100)}
        self.assert_listing([(key(i), s) for i, s in disk.items()])
        # While the daemon is stopped, the kernel queue fills and drops the
        # events of the changes that follow: only a rescan can see them.
        self.d.send_signal(signal.SIGSTOP)
        try:
            n = 0
            while n * 4 < limit + 1000:
                lmcache_write(self.dir, key(1000 + n), 3)
                disk[1000 + n] = 3
                n += 1
            for i in range(50):
                os.unlink(os.path.join(self.dir, fs_name(key(i))))
                del disk[i]
        finally:
            self.d.send_signal(signal.SIGCONT)
        self.assertTrue(wait_for(lambda: self.source()["inotify_overflows"] >= 1, 10),
                        self.source())
        self.assert_listing([(key(i), s) for i, s in disk.items()], timeout=20)
        self.assertEqual(self.source()["state"], "live")

    def test_directory_moved_away_and_back_then_replaced(self):
        for i in range(10):
            lmcache_write(self.dir, key(i), 10)
        self.start()
        disk = [(key(i), 10) for i in range(10)]
        away = self.dir + ".away"
        os.rename(self.dir, away)
        # Failed and stale, the keys kept as last known.
        self.assertTrue(wait_for(lambda: self.source()["state"] == "failed", 5), self.source())
        s = self.source()
        self.assertTrue(s["stale"])
        self.assertIn(self.dir, s["last_error"])
        self.assertIn("No such file or directory", s["last_error"])
        self.assert_listing(disk, timeout=0)
        self.assertEqual(self.d.request("GET", "/readyz").status, 200,
                         "a store that went away does not make the daemon unready")
        # Changed while away, then back: rescanned.
        lmcache_write(away, key(50), 5)
        os.unlink(os.path.join(away, fs_name(key(9))))
        disk = [(key(i), 10) for i in range(9)] + [(key(50), 5)]
        os.rename(away, self.dir)
        self.assertTrue(wait_for(lambda: self.source()["state"] == "live", 5), self.source())
        self.assertFalse(self.source()["stale"])
        self.assert_listing(disk)
        self.assertGreaterEqual(self.source()["rescans"], 1)
        # Replaced by another directory: its content replaces the keys.
        os.rename(self.dir, away)
        os.mkdir(self.dir)
        lmcache_write(self.dir, key(60), 6)
        self.assertTrue(wait_for(lambda: self.listing() == {ident(key(60)): 6}, 10),
                        self.listing())
        self.assertEqual(self.source()["state"], "live")
        self.assertGreaterEqual(self.source()["watch_lost"], 2)


class Restart(FsBase):
    def test_source_keys_come_from_the_rescan_not_the_journal(self):
        data_dir = tempfile.mkdtemp(prefix="kvidx-fs-data-")
        try:
            for i in range(40):
                lmcache_write(self.dir, key(i), 10)
            self.start(data_dir=data_dir, snapshot_journal_bytes="4KiB")
            # API keys beside them (enough writes to take a snapshot), one of
            # them also on disk.
            for b in range(30):
                entries = [{"key": key(10000 + b * 10 + j), "size_bytes": 1} for j in range(10)]
                self.assertEqual(self.d.request("PUT", "/v1/keys",
                                                {"tier": "l2", "entries": entries}).status, 200)
            self.assertEqual(self.d.request("PUT", "/v1/keys", {
                "tier": "l2", "entries": [{"key": key(5), "size_bytes": 10}]}).status, 200)
            self.assertTrue(self.d.wait_log(r"snapshot: generation .* written", 10), self.d.log())
            self.assertEqual(self.d.stop(), 0)
            # While the daemon is down, files go and come.
            for i in range(20):
                os.unlink(os.path.join(self.dir, fs_name(key(i))))
            lmcache_write(self.dir, key(99), 9)
            self.start(data_dir=data_dir, snapshot_journal_bytes="4KiB")
            expect = [(key(i), 10) for i in range(20, 40)] + [(key(99), 9), (key(5), 10)]
            expect += [(key(10000 + n), 1) for n in range(300)]
            self.assert_listing(expect, timeout=0)
            g = self.get(key(5)).json()
            self.assertEqual(g["l2_sources"], [], "its file is gone; the API copy stays")
            self.assertTrue(g["l2"])
            self.assertEqual(self.get(key(0)).status, 404, "resurrected from the journal")
            self.assertEqual(self.d.stop(), 0)
            # Once more with the source's directory empty: only the API's keys.
            for name in os.listdir(self.dir):
                os.unlink(os.path.join(self.dir, name))
            self.start(data_dir=data_dir)
            self.assert_listing([(key(5), 10)] + [(key(10000 + n), 1) for n in range(300)],
                                timeout=0)
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
