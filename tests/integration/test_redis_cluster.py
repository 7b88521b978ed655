"""l2_source = redis+cluster://...: three primaries (each with a replica)
on loopback ports made with redis-cli --cluster create; keys over all
slots; one primary killed and failed over, and a slot range resharded
during writes; the listing converges to the union of the primaries'
keyspaces, and two kvidxd processes following the same cluster agree key
for key. Bounded to about two minutes."""

import os
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import Daemon  # noqa: E402
from redis_helper import (Client, RedisError, RedisServer, free_cluster_port,  # noqa: E402
                          have_redis, keyspace, kvidx_keys, lmc_key, wait_until)

DEADLINE = 30.0


def crc16(data):
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


class ClusterClient:
    """Sends each key's command to the primary of its slot (follows MOVED/ASK)."""

    def __init__(self, ports):
        self.ports = list(ports)
        self.conns = {}
        self.refresh()

    def conn(self, port):
        if port not in self.conns:
            self.conns[port] = Client(port)
        return self.conns[port]

    def refresh(self):
        for p in self.ports:
            try:
                slots = self.conn(p).cmd("CLUSTER", "SLOTS")
            except OSError:
                self.conns.pop(p, None)
                continue
            if isinstance(slots, list):
                self.map = [None] * 16384
                for rng in slots:
                    for s in range(rng[0], rng[1] + 1):
                        self.map[s] = rng[2][1]
                return
        raise RuntimeError("no node answers CLUSTER SLOTS")

    def cmd(self, key, *args):
        port = self.map[crc16(key.encode()) & 16383]
        for _ in range(10):
            try:
                r = self.conn(port).cmd(*args)
            except OSError:
                self.conns.pop(port, None)
                time.sleep(0.2)
                self.refresh()
                port = self.map[crc16(key.encode()) & 16383]
                continue
            if isinstance(r, RedisError) and str(r).startswith(("MOVED", "ASK")):
                port = int(str(r).split()[2].rsplit(":", 1)[1])
                if str(r).startswith("ASK"):
                    self.conn(port).cmd("ASKING")
                else:
                    self.refresh()
                continue
            if isinstance(r, RedisError) and "CLUSTERDOWN" in str(r):
                time.sleep(0.2)
                continue
            return r
        raise RuntimeError("no answer for " + key)

    def primaries(self):
        return sorted(set(p for p in self.map if p))


@unittest.skipUnless(have_redis(), "redis-server/redis-cli not installed (scripts/deps.sh test)")
class RedisClusterTest(unittest.TestCase):
    def setUp(self):
        # A replica's first sync starts at once (no diskless-sync delay).
        args = ("--cluster-enabled", "yes", "--cluster-node-timeout", "1000",
                "--notify-keyspace-events", "AKE", "--repl-diskless-sync-delay", "0")
        # Cleanups, unlike tearDown, also run when setUp fails half-way: no
        # server outlives the test.
        self.servers, self.daemons = [], []
        self.addCleanup(self.cleanup)
        for i in range(6):
            r = RedisServer(args=args + ("--cluster-config-file", "nodes.conf"),
                            port=free_cluster_port(), name="cl%d" % i)
            self.servers.append(r)
        addrs = ["127.0.0.1:%d" % r.port for r in self.servers]
        out = subprocess.run(["redis-cli", "--cluster", "create"] + addrs +
                             ["--cluster-replicas", "1", "--cluster-yes"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout.decode()[-2000:])
        ports = [r.port for r in self.servers]
        wait_until(lambda: all(Client(p).cmd("CLUSTER", "INFO").find(b"cluster_state:ok") >= 0
                               for p in ports), 20, "cluster_state:ok")

        # A replica that has never synced with its primary refuses to take
        # over ("disconnected from master for longer than allowed"), so the
        # failover below needs every replica's link up first.
        def synced():
            for p in ports:
                info = Client(p).cmd("INFO", "replication")
                if b"role:slave" in info and b"master_link_status:up" not in info:
                    return False
            return True
        wait_until(synced, 20, "every replica synced")
        self.cc = ClusterClient(ports)

    def cleanup(self):
        for d in self.daemons:
            d.kill()
        for r in self.servers:
            r.stop()

    def start(self):
        seeds = ",".join("127.0.0.1:%d" % r.port for r in self.servers[:2])
        d = Daemon(settings={"l2_source": "redis+cluster://%s?prefix=lmc" % seeds,
                             "l2_source_reconnect_max_ms": 500})
        self.daemons.append(d)
        wait_until(lambda: d.request("GET", "/readyz").status == 200, DEADLINE, "first scans")
        return d

    def slots_of(self, port):
        """How many slots the primary on port serves, as the cluster says."""
        return sum(1 for p in self.cc.map if p == port)

    def union(self):
        out = {}
        for p in self.cc.primaries():
            out.update(keyspace(Client(p), "lmc"))
        return out

    def converge(self, d, what):
        last = {}

        def same():
            last["want"], last["got"] = self.union(), kvidx_keys(d)
            return last["want"] == last["got"]
        try:
            wait_until(same, DEADLINE, what, interval=0.2)
        except AssertionError:
            w, g = last.get("want", {}), last.get("got", {})
            self.fail("%s: kvidx %d keys, cluster %d; missing %s extra %s\nkvidxd log (end):\n%s" % (
                what, len(g), len(w), sorted(set(w) - set(g))[:3], sorted(set(g) - set(w))[:3],
                d.log()[-4000:]))

    def write(self, ids, size=64):
        for i in ids:
            k = lmc_key(i, "lmc")
            self.cc.cmd(k, "SET", k, b"v" * (size + i % 5))

    def test_failover_reshard_and_two_nodes_agree(self):
        self.write(range(1500))
        d1 = self.start()
        d2 = self.start()
        self.converge(d1, "first scans")
        # Kill one primary: its replica is promoted (cluster-node-timeout 1 s).
        victim = self.cc.primaries()[0]
        for r in self.servers:
            if r.port == victim:
                r.kill()
        self.cc.ports = [r.port for r in self.servers if r.port != victim]
        wait_until(lambda: (self.cc.refresh() or True) and victim not in self.cc.primaries(),
                   DEADLINE, "failover")
        self.write(range(1500, 2000))
        self.converge(d1, "after the failover")
        # Reshard 500 slots between the two other primaries during writes.
        prim = self.cc.primaries()
        ids = {}
        for p in prim:
            ids[p] = Client(p).cmd("CLUSTER", "MYID").decode()
        src, dst = prim[0], prim[1]
        # redis-cli refuses to reshard until every node agrees on the
        # configuration, which takes a moment after a failover.
        wait_until(lambda: subprocess.run(
            ["redis-cli", "--cluster", "check", "127.0.0.1:%d" % src],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30).returncode == 0,
            DEADLINE, "the nodes agree after the failover", interval=0.2)
        slots_before = self.slots_of(dst)
        log = tempfile.TemporaryFile()  # a pipe could fill and stall the reshard
        self.addCleanup(log.close)
        proc = subprocess.Popen(
            ["redis-cli", "--cluster", "reshard", "127.0.0.1:%d" % src, "--cluster-from", ids[src],
             "--cluster-to", ids[dst], "--cluster-slots", "500", "--cluster-yes"],
            stdout=log, stderr=subprocess.STDOUT)
        n = 2000
        while proc.poll() is None and n < 6000:
            self.write(range(n, n + 50))
            n += 50
        self.assertGreater(n, 2000, "no write while the slots moved")
        proc.wait(60)
        log.seek(0)
        out = log.read().decode(errors="replace")
        self.assertEqual(proc.returncode, 0, "redis-cli --cluster reshard failed:\n" + out[-3000:])
        self.cc.refresh()
        self.assertEqual(self.slots_of(dst), slots_before + 500, "the slots did not move")
        self.write(range(n, n + 100))
        self.converge(d1, "after resharding")
        self.converge(d2, "second daemon")
        self.assertEqual(kvidx_keys(d1), kvidx_keys(d2))
        # The figures: the source is live with every key, the failed-over
        # primary is retired, and each node holds what its primary holds.
        want = self.union()
        for d in (d1, d2):
            st = d.request("GET", "/v1/stats").json()["sources"][0]
            self.assertEqual((st["kind"], st["state"], st["ready"], st["stale"]),
                             ("redis+cluster", "live", True, False), st)
            self.assertEqual(st["keys"], len(want), st)
            self.assertEqual(st["bytes"], sum(want.values()), st)
            per_node = {int(n["server"].rsplit(":", 1)[1]): n["keys"] for n in st["nodes"]}
            self.assertEqual(per_node, {p: len(keyspace(Client(p), "lmc"))
                                        for p in self.cc.primaries()}, st)
            self.assertNotIn(victim, per_node)
        # A clean stop with every node's connections open (in the sanitizer
        # build a leak makes the exit status non-zero).
        for d in (d1, d2):
            self.assertEqual(d.stop(), 0, d.log()[-2000:])


if __name__ == "__main__":
    unittest.main()
