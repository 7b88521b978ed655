"""l2_source = redis://...: kvidx follows a real redis-server as LMCache's
Valkey adapter fills it (SET of the object bytes under the wire key, DEL,
EXPIRE, maxmemory eviction, RENAME, FLUSHDB) and after faults (the server
killed and restarted with and without its data, the subscriber connection
killed while writes go on, keyspace notifications switched off). After
every step the listing must equal the server's keyspace (SCAN + STRLEN)
within a deadline."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import Daemon  # noqa: E402
from redis_helper import (RedisServer, have_redis, keyspace, kvidx_keys, lmc_key,  # noqa: E402
                          wait_until)

DEADLINE = 15.0


def source_stats(d):
    """The first source object of /v1/stats (found by its "name" member)."""
    r = d.request("GET", "/v1/stats")
    j = r.json()

    def find(x):
        if isinstance(x, dict):
            if "name" in x and ("redis" in str(x.get("name", ""))):
                return x
            for v in x.values():
                f = find(v)
                if f:
                    return f
        if isinstance(x, list):
            for v in x:
                f = find(v)
                if f:
                    return f
        return None
    return find(j)


@unittest.skipUnless(have_redis(), "redis-server/redis-cli not installed (scripts/deps.sh test)")
class RedisSourceTest(unittest.TestCase):
    prefix = "lmc"
    extra = {}
    redis_args = ()

    def setUp(self):
        self.d = self.c = None
        self.r = RedisServer(args=("--notify-keyspace-events", "AKE") + tuple(self.redis_args))
        self.addCleanup(self.cleanup)  # runs even when setUp fails after this
        self.c = self.r.client()

    def cleanup(self):
        if self.d:
            self.d.kill()
        if self.c:
            self.c.close()
        self.r.stop()

    def url(self):
        u = "redis://127.0.0.1:%d/0" % self.r.port
        return u + ("?prefix=" + self.prefix if self.prefix else "")

    def start(self, **settings):
        s = {"l2_source": self.url(), "l2_source_rescan_s": 1,
             "l2_source_reconnect_max_ms": 500}
        s.update(self.extra)
        s.update(settings)
        self.d = Daemon(settings=s)
        wait_until(lambda: self.d.request("GET", "/readyz").status == 200, DEADLINE,
                   "the first scan (/readyz 200)")

    def expected(self):
        return keyspace(self.c, self.prefix)

    def converge(self, what, timeout=DEADLINE):
        last = {}

        def same():
            want, got = self.expected(), kvidx_keys(self.d)
            last["want"], last["got"] = want, got
            return want == got
        try:
            wait_until(same, timeout, what, interval=0.1)
        except AssertionError:
            want, got = last.get("want", {}), last.get("got", {})
            missing = sorted(set(want) - set(got))[:5]
            extra = sorted(set(got) - set(want))[:5]
            wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])[:5]
            self.fail("%s: kvidx has %d keys, the server %d; missing %s, extra %s, sizes %s\n"
                      "kvidxd log (end):\n%s"
                      % (what, len(got), len(want), missing, extra, wrong, self.d.log()[-4000:]))

    def set_many(self, ids, size=100, prefix=None):
        p = self.prefix if prefix is None else prefix
        self.c.pipeline([("SET", lmc_key(i, p), b"x" * (size + i % 7)) for i in ids])

    def test_follows_lmcache_writes(self):
        self.set_many(range(500))
        # Other applications' keys, other prefixes and keys that do not parse
        # share the database: skipped and counted, never fatal.
        self.c.pipeline([("SET", "session:%d" % i, "v") for i in range(20)])
        self.c.cmd("SET", lmc_key(1, "other"), "v")
        self.c.cmd("SET", "lmc@not-a-key", "v")
        self.c.cmd("HSET", lmc_key(9999, self.prefix), "f", "v")
        self.c.cmd("SET", lmc_key(10000, self.prefix), "")
        self.start()
        self.converge("first scan")
        st = source_stats(self.d)
        self.assertIsNotNone(st, "no source in /v1/stats")
        self.assertGreaterEqual(st.get("skipped", 0), 23, st)
        # SET of new keys and of new sizes, DEL, APPEND, RENAME, EXPIRE.
        self.set_many(range(500, 700))
        self.converge("SET of new keys")
        self.c.cmd("SET", lmc_key(3, self.prefix), b"y" * 4096)
        self.c.cmd("APPEND", lmc_key(4, self.prefix), b"z" * 10)
        self.converge("SET of a new size, APPEND")
        self.c.pipeline([("DEL", lmc_key(i, self.prefix)) for i in range(0, 100)])
        self.converge("DEL")
        self.c.cmd("RENAME", lmc_key(200, self.prefix), lmc_key(5000, self.prefix))
        self.c.cmd("RENAME", lmc_key(201, self.prefix), "not-ours")
        self.c.cmd("RENAME", "session:1", lmc_key(5001, self.prefix))
        self.converge("RENAME")
        self.c.pipeline([("PEXPIRE", lmc_key(i, self.prefix), 200) for i in range(300, 350)])
        wait_until(lambda: self.c.cmd("EXISTS", lmc_key(300, self.prefix)) == 0, 5, "expiry")
        # Expired keys are removed when Redis reclaims them (lazily or by its
        # active cycle), which sends the "expired" event.
        self.converge("EXPIRE")
        self.c.cmd("FLUSHDB")
        self.converge("FLUSHDB", timeout=8)
        self.assertEqual(kvidx_keys(self.d), {})
        self.set_many(range(50))
        self.converge("SET after FLUSHDB")
        # A clean stop while following (in the sanitizer build a leak makes
        # the exit status non-zero).
        self.assertEqual(self.d.stop(), 0, self.d.log()[-2000:])

    def test_eviction(self):
        self.start()
        self.c.cmd("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
        self.c.cmd("CONFIG", "SET", "maxmemory", str(4 << 20))
        for base in range(0, 4000, 500):
            self.set_many(range(base, base + 500), size=4000)
        self.assertLess(self.c.cmd("DBSIZE"), 4000, "nothing was evicted")
        self.converge("eviction")

    def test_server_restart_without_data(self):
        self.set_many(range(300))
        self.start()
        self.converge("first scan")
        self.r.restart(keep_dir=False)
        self.c = self.r.client()
        self.c.cmd("CONFIG", "SET", "notify-keyspace-events", "AKE")
        self.converge("restarted empty")
        self.set_many(range(1000, 1100))
        self.converge("writes after the restart")

    def test_server_restart_with_data(self):
        self.set_many(range(300))
        self.start()
        self.converge("first scan")
        self.c.cmd("SAVE")
        self.c.pipeline([("DEL", lmc_key(i, self.prefix)) for i in range(100)])  # not saved
        self.r.args += ["--dbfilename", "dump.rdb"]
        self.r.restart(keep_dir=True)
        self.c = self.r.client()
        self.c.cmd("CONFIG", "SET", "notify-keyspace-events", "AKE")
        self.assertEqual(len(self.expected()), 300)
        self.converge("restarted with its data")
        self.set_many(range(2000, 2050))
        self.converge("writes after the restart")

    def test_subscriber_killed_while_writing(self):
        self.start()
        for round_ in range(3):
            base = 10000 * (round_ + 1)
            self.set_many(range(base, base + 200))
            self.c.cmd("CLIENT", "KILL", "TYPE", "pubsub")
            # Writes and deletes go on while kvidx reconnects.
            self.set_many(range(base + 200, base + 400))
            self.c.pipeline([("DEL", lmc_key(i, self.prefix)) for i in range(base, base + 50)])
            self.converge("subscriber killed (round %d)" % round_)
        st = source_stats(self.d)
        self.assertGreaterEqual(st.get("reconnects", 0), 1, st)

    def test_notifications_off_falls_back_to_rescans(self):
        self.c.cmd("CONFIG", "SET", "notify-keyspace-events", "")
        self.set_many(range(100))
        self.start()
        self.converge("first scan")
        self.assertIn("notify-keyspace-events", self.d.log())
        self.set_many(range(100, 200))
        self.c.pipeline([("DEL", lmc_key(i, self.prefix)) for i in range(20)])
        self.converge("rescans without notifications")
        st = source_stats(self.d)
        self.assertEqual(st.get("notifications"), "incomplete", st)
        # Switched off while live: found by the periodic check, then rescans.
        self.c.cmd("CONFIG", "SET", "notify-keyspace-events", "AKE")
        wait_until(lambda: source_stats(self.d).get("notifications") == "complete", DEADLINE,
                   "notifications seen as complete")
        self.c.cmd("CONFIG", "SET", "notify-keyspace-events", "")
        self.set_many(range(300, 400))
        self.converge("notifications switched off while live")

    def test_steady_writes_cause_no_rescan(self):
        # The flush check (DBSIZE below the keys known) must allow for the
        # keys added between the DBSIZE and the heartbeat: writes that go
        # on for several probes are no reason to rescan.
        self.start()
        deadline, i = time.monotonic() + 4, 0
        while time.monotonic() < deadline:
            self.set_many(range(i, i + 100))
            i += 100
            time.sleep(0.005)
        self.converge("steady writes")
        st = source_stats(self.d)
        self.assertEqual(st.get("flushes_detected"), 0, (st, self.d.log()[-3000:]))
        self.assertEqual(st.get("scans"), 1, st)
        self.assertNotIn("rescanning", self.d.log())

    def test_configure_turns_notifications_on(self):
        self.c.cmd("CONFIG", "SET", "notify-keyspace-events", "")
        self.start(l2_source_configure="yes", l2_source_rescan_s=3600)
        flags = self.c.cmd("CONFIG", "GET", "notify-keyspace-events")[1].decode()
        for f in "Eg$xe":
            self.assertIn(f, flags)
        self.set_many(range(100))
        self.converge("events after CONFIG SET", timeout=5)


@unittest.skipUnless(have_redis(), "redis-server/redis-cli not installed (scripts/deps.sh test)")
class RedisSourceNoPrefixTest(RedisSourceTest):
    prefix = None

    def test_follows_lmcache_writes(self):
        self.set_many(range(200))
        self.c.cmd("SET", lmc_key(1, "lmc"), "v")  # a prefixed key does not parse here
        self.start()
        self.converge("first scan")
        self.c.pipeline([("DEL", lmc_key(i, None)) for i in range(50)])
        self.set_many(range(1000, 1100))
        self.converge("changes")


@unittest.skipUnless(have_redis(), "redis-server/redis-cli not installed (scripts/deps.sh test)")
class RedisSourceAuthTest(unittest.TestCase):
    def test_password_never_shown(self):
        r = RedisServer(args=("--requirepass", "pa55-w0rd", "--notify-keyspace-events", "AKE",
                              "--databases", "4"))
        d = None
        try:
            c = r.client()
            self.assertEqual(c.cmd("AUTH", "pa55-w0rd"), b"OK")
            c.cmd("SELECT", 2)
            c.pipeline([("SET", lmc_key(i, "p"), "abc") for i in range(10)])
            d = Daemon(settings={"l2_source": "redis://pa55-w0rd@127.0.0.1:%d/2?prefix=p" % r.port,
                                 "log_level": "debug"})
            wait_until(lambda: d.request("GET", "/readyz").status == 200, DEADLINE, "first scan")
            wait_until(lambda: len(kvidx_keys(d)) == 10, DEADLINE, "ten keys")
            stats = d.request("GET", "/v1/stats").body.decode()
            metrics = d.request("GET", "/metrics").body.decode()
            one = d.request("GET", "/v1/keys/" + lmc_key(3)).body.decode()
            for text in (stats, metrics, one, d.log()):
                self.assertNotIn("pa55-w0rd", text)
            self.assertIn("***@127.0.0.1", stats)
            # Every figure of the source, in both places, under the shown name.
            name = "redis://***@127.0.0.1:%d/2?prefix=p" % r.port
            st = source_stats(d)
            self.assertEqual(st["name"], name, st)
            self.assertEqual(st["kind"], "redis", st)
            self.assertEqual(st["state"], "live", st)
            self.assertEqual(st["keys"], 10, st)
            self.assertEqual(st["bytes"], 30, st)
            for k in ("skipped", "scans", "reconnects", "notification_lag_ms", "last_error",
                      "server_error", "dbsize"):
                self.assertIn(k, st)
            self.assertGreaterEqual(st["scans"], 1, st)
            label = 'source="%s"' % name
            for fam, value in (("kvidx_source_keys", "10"), ("kvidx_source_bytes", "30"),
                               ("kvidx_source_skipped", None), ("kvidx_source_scans_total", None),
                               ("kvidx_redis_reconnects_total", None),
                               ("kvidx_redis_notification_lag_seconds", None),
                               ("kvidx_source_last_error_info", None)):
                lines = [ln for ln in metrics.splitlines()
                         if ln.startswith(fam + "{") and label in ln]
                self.assertEqual(len(lines), 1, (fam, metrics))
                if value is not None:
                    self.assertEqual(lines[0].rsplit(" ", 1)[1], value, lines[0])
            self.assertIn('kvidx_source_state{%s,state="live"} 1' % label, metrics)
            c.close()
        finally:
            if d:
                d.kill()
            r.stop()

    def test_a_url_that_cannot_be_used_exits_2_without_its_password(self):
        from harness import kvidxd_path
        for url in ("redis://u:s3cr3t-pw@127.0.0.1:99999/0",
                    "redis://u:s3cr3t-pw@127.0.0.1:6379/0?prefix=a@b",
                    "redis+cluster://u:s3cr3t-pw@127.0.0.1:6379/3",
                    "redis://u:s3cr3t-pw@"):
            p = subprocess.run([kvidxd_path(), "--set", "listen=127.0.0.1:0",
                                "--set", "l2_source=" + url],
                               capture_output=True, timeout=30)
            self.assertEqual(p.returncode, 2, (url, p.stderr))
            self.assertIn(b"l2_source", p.stderr, url)
            self.assertNotIn(b"s3cr3t-pw", p.stderr + p.stdout, url)


class BlackHole:
    """A listener on 127.0.0.1:port that accepts, reads and never answers."""

    def __init__(self, port):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.conns, self.done = [], False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.done:
            if self.sock:
                try:
                    c, _ = self.sock.accept()
                    c.setblocking(False)
                    self.conns.append(c)
                except OSError:
                    pass
            else:
                time.sleep(0.1)
            for c in self.conns:
                try:
                    c.recv(65536)
                except OSError:
                    pass

    def stop_listening(self):
        """Frees the port; the accepted connections stay open, unanswered."""
        s, self.sock = self.sock, None
        time.sleep(0.2)
        s.close()

    def close(self):
        self.done = True
        self.thread.join(5)
        for c in self.conns + ([self.sock] if self.sock else []):
            c.close()


@unittest.skipUnless(have_redis(), "redis-server/redis-cli not installed (scripts/deps.sh test)")
class RedisSourceHungServerTest(unittest.TestCase):
    def test_a_server_that_never_answers_after_a_reconnect_is_given_up(self):
        # The server goes away and something that accepts and never answers
        # takes its port; the server comes back while kvidx's connections to
        # that silent listener stay open. The session being set up after the
        # reconnect must time out (15 s) and the source retry, so that it
        # follows the server again.
        r = RedisServer(args=("--notify-keyspace-events", "AKE"))
        d, hole = None, None
        try:
            c = r.client()
            c.pipeline([("SET", lmc_key(i, "lmc"), "abc") for i in range(20)])
            d = Daemon(settings={"l2_source": "redis://127.0.0.1:%d/0?prefix=lmc" % r.port,
                                 "l2_source_reconnect_max_ms": 200})
            wait_until(lambda: len(kvidx_keys(d)) == 20, DEADLINE, "first scan")
            c.close()
            r.kill()
            hole = BlackHole(r.port)
            wait_until(lambda: len(hole.conns) >= 2, DEADLINE,
                       "kvidx connects to the silent server")
            hole.stop_listening()
            r.start()
            c = r.client()
            c.cmd("FLUSHALL")
            c.pipeline([("SET", lmc_key(i, "lmc"), "abcd") for i in range(100, 130)])
            want = {k: 4 for k in keyspace(c, "lmc")}
            self.assertEqual(len(want), 30)
            wait_until(lambda: kvidx_keys(d) == want, 30, "the source follows the server again")
            self.assertIn("did not answer within", d.log())
            c.close()
        finally:
            if hole:
                hole.close()
            if d:
                d.kill()
            r.stop()


if __name__ == "__main__":
    unittest.main()
