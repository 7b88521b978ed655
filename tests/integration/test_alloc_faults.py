"""Allocation failures in the daemon (kvidxd_faults, tests/support/fault_alloc.c).

While allocations fail, every request of every kind must get a well-formed
expected answer, or a 503 problem+json whose code is `internal`, or see its
connection closed: never a crash, a hang or a malformed answer. Afterwards
the daemon serves normally and its state is what the acknowledged writes
say: a write answered 503 changed nothing, one answered 2xx is there (a
write whose connection was closed may have gone either way). The listener
must keep accepting even when many connections in a row cannot be
allocated, alone and together with running out of file descriptors.

$KVIDXD_FAULTS is the test binary (skipped when unset). The figures (requests
sent, allocations failed, answers by status) are printed to stderr.
"""

import json
import os
import random
import re
import resource
import signal
import socket
import sys
import time
import unittest
from collections import Counter
from urllib.parse import quote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Conn, Daemon, build_request, read_response  # noqa: E402
from lmcache_emitter import Emitter, key as fkey  # noqa: E402

FAULTS = os.environ.get("KVIDXD_FAULTS")
PROBLEM = "application/problem+json"
REPORT_RE = r"fault_alloc: %s allocations=(\d+) failed=(\d+)"
CLOSED = "closed"


class FaultDaemon(Daemon):
    def command(self):
        cmd = [FAULTS, "--set", "listen=127.0.0.1:0"]
        for k, v in self.settings.items():
            cmd += ["--set", "%s=%s" % (k, v)]
        return cmd + self.args

    def toggle(self, what):
        """SIGUSR2, then waits for the allocator's line; (allocations, failed)."""
        start = len(self.log())
        self.send_signal(signal.SIGUSR2)
        m = self.wait_log(REPORT_RE % what, 10, start)
        assert m, "no '%s' line from the fault allocator" % what
        return int(m.group(1)), int(m.group(2))


def wkey(i):
    return {"model_name": "w", "kv_rank": 0, "chunk_hash_hex": "%04x" % i}


def wpath(i):
    return "/v1/keys/" + quote("w@00000000@0@%04x" % i, safe="@")


def pkey(i):
    return {"model_name": "p", "kv_rank": 0, "chunk_hash_hex": "%02x" % i}


IPC_RANK = (1 << 24) | (1 << 8)
IPC_LOOKUP = {"model_name": "q", "world_size": 1, "worker_id": None,
              "chunk_hashes": ["c%d" % c for c in range(6)],
              "object_group_ids": [0, 1, 2], "attn_window": [-1, 2, 1]}


def ipc_entries():
    out = []
    for g, chunks in ((0, [0, 1, 2, 3]), (1, [2, 3, 4]), (2, [1, 3, 5])):
        for c in chunks:
            out.append({"key": {"model_name": "q", "kv_rank": IPC_RANK, "object_group_id": g,
                                "chunk_hash_hex": "c%d" % c}, "size_bytes": 1})
    return out


class Client:
    """Sends requests on fresh or keep-alive connections and judges every
    answer; counts them by status."""

    def __init__(self, test, d, rng):
        self.t, self.d, self.rng = test, d, rng
        self.conn = None
        self.sent = 0
        self.storage_refusals = 0
        self.by_status = Counter()

    def close(self):
        if self.conn:
            self.conn.close()
            self.conn = None

    def send(self, method, path, body=b"", expect=(200,), fresh=None):
        """The Response when it is an expected one, None after a 503
        `internal`, CLOSED when the connection was closed without an answer.
        Anything else fails the test."""
        if fresh is None:
            fresh = self.rng.random() < 0.5
        self.sent += 1
        what = "%s %s" % (method, path)
        try:
            if fresh:
                self.close()
                r = self.d.request(method, path, body, timeout=10)
            else:
                if self.conn is None:
                    self.conn = Conn(self.d, timeout=10)
                r = self.conn.request(method, path, body)
                if r.headers.get("connection", "").lower() == "close":
                    self.close()
        except (EOFError, ConnectionError):
            self.close()
            self.by_status[CLOSED] += 1
            return CLOSED
        except socket.timeout:
            self.t.fail("%s: no answer within 10 s (hang)" % what)
        except (ValueError, IndexError) as e:
            self.t.fail("%s: malformed answer: %r" % (what, e))
        self.by_status[r.status] += 1
        self.t.assertEqual(r.version, "HTTP/1.1", what)
        if r.status == 503:
            self.t.assertEqual(r.headers.get("content-type"), PROBLEM, (what, r))
            j = json.loads(r.body)
            # With a data_dir, a journal record that could not be encoded
            # refuses writes until the next snapshot: storage_unavailable.
            codes = ("internal", "storage_unavailable") if self.t.DURABLE else ("internal",)
            self.t.assertEqual(j["status"], 503, (what, j))
            self.t.assertIn(j["code"], codes, (what, j))
            self.t.assertTrue(j["type"].endswith("/problems/" + j["code"]), (what, j))
            if j["code"] == "storage_unavailable":
                self.storage_refusals += 1
            return None  # a keep-alive connection goes on being used
        self.t.assertIn(r.status, expect, (what, r))
        self.t.assertEqual(len(r.body), int(r.headers.get("content-length", len(r.body))), what)
        if r.body and "json" in r.headers.get("content-type", ""):
            r.json()  # parses
        return r


class AllocFaultsBase(unittest.TestCase):
    DURABLE = False

    def setUp(self):
        if not FAULTS:
            self.skipTest("KVIDXD_FAULTS is not set")
        self.d = None

    def tearDown(self):
        if self.d:
            self.d.kill()

    def start(self, spec, **settings):
        self.d = FaultDaemon(settings=settings, env={"KVIDX_FAULT_ALLOC": spec})

    def stop_clean(self):
        self.assertTrue(self.d.running(), self.d.log()[-3000:])
        self.assertEqual(self.d.stop(), 0, self.d.log()[-3000:])
        self.assertNotIn("ERROR: AddressSanitizer", self.d.log())
        self.assertNotIn("runtime error:", self.d.log())


class TestRequestsUnderFaults(AllocFaultsBase):
    """Every 13th allocation fails: most requests meet a failure."""
    ROUNDS = 70
    EVERY = 13
    DURABLE = False

    def start(self, spec, **settings):
        if self.DURABLE:
            import tempfile
            self.tmp = tempfile.TemporaryDirectory(prefix="kvidx-faults-")
            self.addCleanup(self.tmp.cleanup)
            settings.update(data_dir=self.tmp.name, fsync="always")
        super().start(spec, **settings)

    def served_state(self, d):
        keys, token = [], None
        while True:
            r = d.request("GET", "/v1/keys?page_size=5000" +
                          ("&page_token=" + token if token else ""))
            self.assertEqual(r.status, 200, r.body)
            j = r.json()
            keys += [json.dumps(e, sort_keys=True) for e in j["entries"]]
            token = j["next_page_token"]
            if not token:
                break
        r = d.request("GET", "/directory/keys?limit=10000")
        self.assertEqual(r.status, 200, r.body)
        fleet = sorted(json.dumps(k, sort_keys=True) for k in r.json()["keys"])
        return sorted(keys), fleet

    def kill_while_failing(self, present, fleet_in, fleet_none, client):
        """kill -9 while allocations still fail, then a restart without
        faults: every acknowledged write is there, every refused one not."""
        self.d.send_signal(signal.SIGKILL)
        self.d.proc.wait(10)
        log = self.d.log()
        self.d.kill()
        self.assertNotIn("ERROR: AddressSanitizer", log)
        d = Daemon(settings={"data_dir": self.tmp.name, "fsync": "always"})
        try:
            for i, there in sorted(present.items()):
                r = d.request("GET", wpath(i))
                self.assertEqual(r.status, 200 if there else 404,
                                 "key %d: acknowledged %s, then lost by kill -9"
                                 % (i, "stored" if there else "deleted"))
            r = d.request("GET", "/directory/keys?limit=1000&model_name=f")
            listed = {k["key"]["chunk_hash_hex"] for k in r.json()["keys"]}
            self.assertLessEqual(fleet_in, listed, "acknowledged fleet events lost")
            self.assertEqual(fleet_none & listed, set())
            print("\nkill -9 while 1 allocation in %d failed: %d requests (%d refused as "
                  "storage_unavailable; %d journal gaps, %d snapshots written), then %d keys and "
                  "%d fleet keys checked after the restart"
                  % (self.EVERY, client.sent, client.storage_refusals,
                     log.count("out of memory encoding a record"),
                     log.count("snapshot: generation"), len(present), len(fleet_in)),
                  file=sys.stderr)
        finally:
            d.stop()

    def kill_and_compare(self):
        before = self.served_state(self.d)
        self.d.send_signal(signal.SIGKILL)
        self.d.proc.wait(10)
        self.assertNotIn("ERROR: AddressSanitizer", self.d.log())
        self.d.kill()
        d = Daemon(settings={"data_dir": self.tmp.name, "fsync": "always"})
        try:
            after = self.served_state(d)
            self.assertEqual(after[0], before[0], "keys differ after kill -9 and restart")
            self.assertEqual(after[1], before[1], "the fleet directory differs after the restart")
            print("\nafter kill -9: %d keys and %d directory keys restored as served"
                  % (len(after[0]), len(after[1])), file=sys.stderr)
        finally:
            d.stop()

    def test_every_kind_of_request(self):
        t0 = time.monotonic()
        self.start("every=%d,armed=0" % self.EVERY)
        d = self.d
        rng = random.Random(7)
        # Read-only fixtures, stored before faults start.
        self.assertEqual(d.request("PUT", "/v1/keys", {"tier": "l1", "entries": [
            {"key": pkey(i), "size_bytes": 10} for i in range(0, 12, 2)]}).status, 200)
        self.assertEqual(d.request("PUT", "/v1/keys", {"tier": "l2", "entries": [
            {"key": pkey(i), "size_bytes": 10} for i in range(1, 12, 2)]}).status, 200)
        self.assertEqual(d.request("PUT", "/v1/keys", {"entries": ipc_entries()}).status, 200)
        p_all = {"%02x" % i for i in range(12)}

        c = Client(self, d, rng)
        present = {}     # w key id -> True/False when known
        unknown = set()  # w key ids a closed connection left undecided
        handles = set()  # prefetch handles created and not yet deleted
        lost_creates = 0
        emitter = Emitter("127.0.0.1", d.port, "mp-faults", incarnation=1)
        fleet_in, fleet_out, fleet_unknown = set(), set(), set()
        fleet_none = set()  # refused single-batch requests: must not be applied
        next_w, next_f = 0, 0

        def wrote(ids, r, value):
            for i in ids:
                if r is CLOSED:
                    unknown.add(i)
                    present.pop(i, None)
                elif r is not None:
                    unknown.discard(i)
                    present[i] = value

        armed_at = d.toggle("armed")
        for rnd in range(self.ROUNDS):
            # Batch store of three new keys: all or nothing.
            ids = list(range(next_w, next_w + 3))
            next_w += 3
            present.update((i, False) for i in ids)
            r = c.send("PUT", "/v1/keys", {"tier": rng.choice(["l1", "l2"]), "entries": [
                {"key": wkey(i), "size_bytes": 10 + i % 7} for i in ids]})
            if r not in (None, CLOSED):
                self.assertEqual(r.json(), {"stored": 3})
            wrote(ids, r, True)
            # Single-key store.
            i = next_w
            next_w += 1
            present[i] = False
            r = c.send("PUT", wpath(i), {"size_bytes": 5, "tier": "l1"})
            wrote([i], r, True)
            # Single-key read, checked against what is known.
            i = rng.randrange(next_w)
            r = c.send("GET", wpath(i), expect=(200, 404))
            if r not in (None, CLOSED) and i in present:
                self.assertEqual(r.status, 200 if present[i] else 404, (i, r))
            # Single-key delete of a known key.
            if present and rnd % 3 == 0:
                i = rng.choice(sorted(present))
                r = c.send("DELETE", wpath(i), expect=(204,) if present[i] else (404,))
                wrote([i], r, False)
            # A listing of model p with page tokens; a complete walk lists each key once.
            seen, tok = [], None
            for _ in range(20):
                q = "/v1/keys?model_name=p&page_size=%d" % rng.choice([2, 3, 5])
                if tok:
                    q += "&page_token=" + quote(tok)
                r = c.send("GET", q)
                if r in (None, CLOSED):
                    seen = None
                    break
                j = r.json()
                seen += [e["key"]["chunk_hash_hex"] for e in j["entries"]]
                tok = j["next_page_token"]
                if not tok:
                    break
            if seen is not None:
                self.assertEqual(sorted(seen), sorted(p_all))
            # Lookups, key form and ipc form.
            r = c.send("POST", "/v1/lookup", {"keys": [pkey(i) for i in range(14)]})
            if r not in (None, CLOSED):
                self.assertEqual(r.json()["found_indices"], list(range(12)))
            r = c.send("POST", "/v1/lookup", IPC_LOOKUP)
            if r not in (None, CLOSED):
                self.assertEqual(r.json()["hit_chunks"], 4)
            # A prefetch handle: create, read, release part, delete.
            r = c.send("POST", "/v1/prefetches", {"keys": [pkey(i) for i in range(6)]},
                       expect=(201,))
            if r is CLOSED:
                lost_creates += 1
            elif r is not None:
                hid = r.json()["id"]
                handles.add(hid)
                r = c.send("GET", "/v1/prefetches/%d?wait_ms=200" % hid)
                # A handle that completed while memory ran out keeps nothing;
                # releasing a key it does not hold is 409.
                release = (200, 409)
                if r not in (None, CLOSED) and r.json()["status"] == "completed":
                    release = (200,) if 0 in r.json()["retained_indices"] else (409,)
                c.send("POST", "/v1/prefetches/%d/release" % hid, {"indices": [0]}, expect=release)
                r = c.send("DELETE", "/v1/prefetches/%d" % hid, expect=(204,))
                if r not in (None, CLOSED):
                    handles.discard(hid)
            # Fleet: one events request of two new keys, and the directory reads.
            ids = ["%04x" % n for n in range(next_f, next_f + 2)]
            next_f += 2
            for h in ids:
                emitter.store(rng.choice(["l1", "l2"]), "dram", fkey("f", h), 1)
            batches = emitter.skip_flush()
            r = c.send("POST", "/events", {"batches": batches})
            # A 503 on /events may leave the batches before the failing one
            # applied (a retry sees them as duplicates): the keys of a
            # refused request of several batches are undecided, how many of
            # them are there anyway is printed. A refused request of one
            # batch changed nothing (an answer that cannot be built after
            # the batches applied closes the connection instead).
            if r is None and len(batches) == 1:
                fleet_none.update(ids)
            (fleet_unknown if r is CLOSED else fleet_out if r is None else fleet_in).update(ids)
            c.send("GET", "/directory/keys?limit=7")
            c.send("GET", "/directory/stats")
            c.send("GET", "/directory/streams")
            c.send("POST", "/directory/lookup", {"keys": [fkey("f", h) for h in ids]})
            if rnd % 10 == 0:
                c.send("POST", "/instances", {"instance_id": "mp-faults", "ip": "127.0.0.1",
                                              "http_port": 8080, "metadata": {}})
            c.send("GET", "/metrics")
            c.send("GET", "/livez")
            self.assertTrue(d.running(), d.log()[-3000:])
        if self.DURABLE:
            c.close()
            return self.kill_while_failing(present, fleet_in, fleet_none, c)
        allocs, failed = d.toggle("disarmed")
        fc = c
        fc.close()
        self.assertGreater(failed, armed_at[1])
        self.assertTrue(d.running(), d.log()[-3000:])

        # Normal service, and the state the acknowledged writes describe.
        c = Client(self, d, rng)

        def ok(*a, **kw):
            r = c.send(*a, **kw)
            self.assertNotIn(r, (None, CLOSED), a)
            return r

        ok("GET", "/livez", fresh=True)
        for i in range(next_w):
            r = ok("GET", wpath(i), expect=(200, 404))
            if i in present:
                self.assertEqual(r.status, 200 if present[i] else 404, (i, present[i]))
        for hid in handles:
            ok("DELETE", "/v1/prefetches/%d" % hid, expect=(204,))
        if not lost_creates:
            for i in range(6):
                j = ok("GET", "/v1/keys/p@00000000@0@%02x" % i).json()
                self.assertEqual(j["l1"]["pins"] if j["l1"] else 0, 0, (i, j))
        r = ok("GET", "/directory/keys?limit=1000&model_name=f")
        listed = {k["key"]["chunk_hash_hex"] for k in r.json()["keys"]}
        self.assertLessEqual(fleet_in, listed)
        self.assertLessEqual(listed, fleet_in | fleet_unknown | fleet_out)
        refused_applied = len(fleet_out & listed)
        self.assertEqual(fleet_none & listed, set(),
                         "a single-batch /events request answered 503 was applied")
        m = ok("GET", "/metrics").body.decode()
        errors_5xx = sum(int(v) for v in re.findall(
            r'^kvidx_http_requests_total\{[^}]*code_class="5xx"\} (\d+)$', m, re.M))
        if self.DURABLE:
            self.kill_and_compare()
        else:
            self.stop_clean()
        print("\nalloc faults (1 allocation in %d failing while armed): %d requests, "
              "%d allocations seen, %d failed; answers %s; 5xx in /metrics %d; "
              "%d w keys (%d undecided), %d fleet keys (%d acked, %d refused of which %d applied, "
              "%d undecided); "
              "%.1f s" % (
                  self.EVERY, fc.sent, allocs - armed_at[0], failed - armed_at[1],
                  dict(sorted((str(k), v) for k, v in fc.by_status.items())), errors_5xx,
                  next_w, len(unknown), next_f, len(fleet_in), len(fleet_out),
                  refused_applied, len(fleet_unknown), time.monotonic() - t0), file=sys.stderr)
        # Every 5xx the client saw was counted (a closed connection may hide more).
        self.assertGreaterEqual(errors_5xx, fc.by_status.get(503, 0))
        self.assertGreater(fc.by_status.get(503, 0), 0)
        self.assertGreater(sum(v for k, v in fc.by_status.items() if k not in (503, CLOSED)), 0)




class TestRequestsUnderFaultsDurable(TestRequestsUnderFaults):
    """Every 127th allocation fails with a data_dir under fsync=always;
    then kill -9 and a restart without faults: the catalogue and the fleet
    directory come back exactly as the daemon served them before the kill
    (whatever it acknowledged, under every failure, reached the journal)."""
    EVERY = 127
    DURABLE = True


class TestBatchStoreEveryFailure(AllocFaultsBase):
    """One batch store of 3000 keys under fsync=always, with its Nth
    allocation failing, for every N across the request (a stride when there
    are many), each followed at once by kill -9 and a restart without
    faults: a 200 means every key is there, a 503 none, a closed connection
    all or none. One of those allocations grows the journal's stage: its
    failure leaves the journal short of a record, so that answer must wait
    for the snapshot that holds the whole state."""
    KEYS = 3000
    POINTS = 60

    def run_one(self, spec, dd):
        d = FaultDaemon(settings={"data_dir": dd, "fsync": "always"},
                        env={"KVIDX_FAULT_ALLOC": spec})
        self.d = d
        body = {"tier": "l2", "entries": [{"key": wkey(i), "size_bytes": 7}
                                          for i in range(self.KEYS)]}
        armed = d.toggle("armed")
        try:
            r = d.request("PUT", "/v1/keys", body, timeout=30)
            outcome = r.status
        except (EOFError, ConnectionError):
            outcome = CLOSED
        # The window disarms itself once its one failure is spent ("limit").
        m = re.search(REPORT_RE % "limit", d.log())
        allocs = int(m.group(1)) if m else d.toggle("disarmed")[0]
        d.send_signal(signal.SIGKILL)
        d.proc.wait(10)
        log = d.log()
        d.kill()
        self.d = None
        self.assertNotIn("ERROR: AddressSanitizer", log)
        return outcome, allocs - armed[0], log

    def found(self, dd):
        d = Daemon(settings={"data_dir": dd, "fsync": "always"})
        try:
            n, token = 0, None
            while True:
                r = d.request("GET", "/v1/keys?model_name=w&page_size=5000" +
                              ("&page_token=" + token if token else ""))
                j = r.json()
                n += len(j["entries"])
                token = j["next_page_token"]
                if not token:
                    return n
        finally:
            d.stop()

    def test_each_allocation_then_kill(self):
        import shutil
        import tempfile
        base = tempfile.mkdtemp(prefix="kvidx-faults-batch-")
        self.addCleanup(shutil.rmtree, base, True)
        _, total, _ = self.run_one("after=100000000,every=1,armed=0", os.path.join(base, "count"))
        self.assertGreater(total, 10)
        outcomes, gaps = Counter(), 0
        for n in range(0, total, max(1, total // self.POINTS)):
            dd = os.path.join(base, "n%d" % n)
            outcome, _, log = self.run_one("after=%d,every=100000000,count=1,armed=0" % n, dd)
            gaps += "out of memory encoding a record" in log
            got = self.found(dd)
            if outcome == 200:
                self.assertEqual(got, self.KEYS, "allocation %d failed: answered 200, then %d of "
                                 "%d keys after kill -9" % (n + 1, got, self.KEYS))
            elif outcome == CLOSED:
                self.assertIn(got, (0, self.KEYS), "allocation %d: part of the batch" % (n + 1))
            else:
                self.assertEqual(outcome, 503, n)
                self.assertEqual(got, 0, "allocation %d failed: answered 503, then %d keys"
                                 % (n + 1, got))
            outcomes[outcome] += 1
        print("\nbatch store of %d keys, each of its %d allocations failing in turn (stride %d), "
              "kill -9, restart: %s; journal gaps met %d"
              % (self.KEYS, total, max(1, total // self.POINTS), dict(outcomes), gaps),
              file=sys.stderr)


class TestRequestsUnderRareFaults(TestRequestsUnderFaults):
    """Every 127th allocation fails: most requests succeed, so the state
    check sees many acknowledged writes."""
    EVERY = 127


class TestRequestsUnderRarerFaults(TestRequestsUnderFaults):
    """Every 251st allocation fails: failures meet rarer paths (a prefetch
    handle completing without memory, for one)."""
    EVERY = 251


class TestListenerUnderFaults(AllocFaultsBase):
    N = 50

    def burst(self):
        """N connections, each with a GET /livez sent, made while the daemon
        is stopped, so that they are all pending when it goes on."""
        self.d.send_signal(signal.SIGSTOP)
        socks = []
        try:
            for _ in range(self.N):
                s = socket.create_connection(self.d.addr, 5)
                s.sendall(build_request("GET", "/livez", headers={"Connection": "close"}))
                socks.append(s)
        finally:
            self.d.send_signal(signal.SIGCONT)
        return socks

    def outcomes(self, socks, timeout=10.0):
        """Counter of 200 / 503 / closed; fails on a hang or another answer."""
        out = Counter()
        end = time.monotonic() + timeout
        for s in socks:
            s.settimeout(max(0.05, end - time.monotonic()))
            try:
                r = read_response(s)
            except (EOFError, ConnectionError):
                out[CLOSED] += 1
                continue
            except socket.timeout:
                self.fail("a pending connection was never accepted: %s" % dict(out))
            finally:
                s.close()
            if r.status == 503:
                self.assertEqual(json.loads(r.body)["code"], "internal", r)
            else:
                self.assertEqual(r.status, 200, r)
            out[r.status] += 1
        return out

    def serves(self):
        for _ in range(20):
            self.assertEqual(self.d.request("GET", "/livez", timeout=5).status, 200)

    def test_connections_that_cannot_be_allocated(self):
        t0 = time.monotonic()
        self.start("every=1,armed=0")
        self.serves()
        self.d.toggle("armed")
        out = self.outcomes(self.burst())
        allocs, failed = self.d.toggle("disarmed")
        # Nothing can be allocated: every connection is taken and closed.
        self.assertEqual(out, Counter({CLOSED: self.N}))
        self.assertGreaterEqual(failed, self.N)
        self.serves()
        self.stop_clean()
        print("\nlistener, every allocation failing: %d connections all closed, "
              "%d allocations failed; then 20 answered; %.1f s"
              % (self.N, failed, time.monotonic() - t0), file=sys.stderr)

    def test_with_few_file_descriptors(self):
        """Allocation failures and running out of descriptors together."""
        t0 = time.monotonic()
        self.start("every=2,armed=0")
        self.serves()
        pid = self.d.proc.pid
        old = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        nfds = len(os.listdir("/proc/%d/fd" % pid))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (nfds + 8, old[1]))
        try:
            self.d.toggle("armed")
            out = self.outcomes(self.burst())
            allocs, failed = self.d.toggle("disarmed")
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, old)
        self.assertGreater(out[CLOSED], 0)
        self.serves()
        # And the same burst with no fault at all is answered in full.
        self.assertEqual(self.outcomes(self.burst()), Counter({200: self.N}))
        self.stop_clean()
        print("\nlistener, every 2nd allocation failing and %d free fds: %s, "
              "%d allocations failed; then served in full; %.1f s"
              % (8, dict(sorted((str(k), v) for k, v in out.items())), failed,
                 time.monotonic() - t0), file=sys.stderr)


class TestStartupUnderFaults(AllocFaultsBase):
    """Every allocation from the Nth on fails, for each N from 0 to the
    number a start makes: each time the daemon either exits 1 having logged
    why (the message itself, never only that memory ran out, and never a
    crash) or starts, and then stops cleanly on SIGTERM."""

    extra = []
    POINTS = 1000  # at most this many start points are tried (every one here)

    def run_daemon(self, spec, until_ready_then=None):
        import subprocess
        env = dict(os.environ, KVIDX_FAULT_ALLOC=spec)
        p = subprocess.Popen([FAULTS, "--set", "listen=127.0.0.1:0"] + self.extra, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        err, started = b"", False
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                line = p.stderr.readline()
                if not line:
                    break
                err += line
                if b"listening on" in line:
                    started = True
                    break
            if started and until_ready_then:
                until_ready_then(p)
            if started:
                p.send_signal(signal.SIGTERM)
            err += p.communicate(timeout=30)[1]
            return p.returncode, err.decode(errors="replace"), started
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stderr.close()

    def test_every_startup_allocation(self):
        # How many allocations a start makes: numbered, none failing.
        rc, text, started = self.run_daemon(
            "after=100000000,every=1", lambda p: (p.send_signal(signal.SIGUSR2), time.sleep(0.3)))
        self.assertTrue(started, text)
        m = re.search(REPORT_RE % "disarmed", text)
        self.assertTrue(m, text)
        total = int(m.group(1))
        self.assertGreater(total, 0)
        outcomes = Counter()
        last_refusal = ""
        # A start's count moves a little from one start to the next (each
        # failed start with a data_dir leaves one empty journal generation,
        # replayed by the next), so the sweep goes on past it until a start
        # succeeds.
        stride = max(1, total // self.POINTS)
        for after in range(0, 4 * total + 100, stride):
            if outcomes["started"]:
                break
            rc, text, started = self.run_daemon("after=%d,every=1,count=100000000" % after)
            where = "after=%d: %s" % (after, text[-2000:])
            self.assertNotIn("AddressSanitizer", text, where)
            self.assertNotIn("runtime error:", text, where)
            if rc == -signal.SIGABRT and ("uv_loop_init" in text or "uv_poll_start" in text):
                # libuv aborts when it cannot grow its descriptor table:
                # inside uv_loop_init, or where the server grows it once at
                # start so that serving never has to (docs/reliability.md).
                outcomes["libuv abort at start"] += 1
                continue
            if started:
                self.assertIn(rc, (0, 1), where)
                outcomes["started"] += 1
                continue
            self.assertEqual(rc, 1, where)
            self.assertTrue(text.strip(), "after=%d: nothing logged" % after)
            self.assertRegex(text.strip().splitlines()[-1], r" error \S", where)
            self.assertNotIn("out of memory formatting", text, where)
            outcomes["exit 1, reason logged"] += 1
            last_refusal = text.strip().splitlines()[-1]
        print("\nstartup%s: failing every allocation from the Nth on, N = 0..%d by %d "
              "(a fault-free start made %d): %s"
              % (self.WHAT, after, stride, total, dict(outcomes)), file=sys.stderr)
        # Once no allocation fails it starts.
        self.assertGreater(outcomes["started"], 0, last_refusal)
        self.after_sweep()

    WHAT = ""

    def after_sweep(self):
        pass


class TestRestoreUnderFaults(TestStartupUnderFaults):
    """The same with a data_dir holding a snapshot and a journal (keys and
    fleet events): a start that fails for want of memory leaves data_dir
    as it was, so the next start restores everything."""
    WHAT = " with a data_dir to restore"
    POINTS = 150  # a stride over the restore's allocations

    def setUp(self):
        super().setUp()
        import tempfile
        self.tmp = tempfile.TemporaryDirectory()
        self.extra = ["--set", "data_dir=" + self.tmp.name, "--set", "fsync=always"]
        # A small snapshot_journal_bytes: the first batch (past 4 KiB of
        # journal, at about 18 bytes a key) is snapshotted, the rest stays
        # in the journal.
        d = Daemon(settings={"data_dir": self.tmp.name, "fsync": "always",
                             "snapshot_journal_bytes": "4KiB"})
        try:
            keys = [wkey(i) for i in range(300)]
            r = d.request("PUT", "/v1/keys", {"tier": "l2", "entries": [
                {"key": k, "size_bytes": 64} for k in keys[:240]]})
            self.assertIn(r.status, (200, 201), r.body)
            deadline = time.monotonic() + 20
            while not os.path.exists(os.path.join(self.tmp.name, "snapshot.kvs")):
                self.assertLess(time.monotonic(), deadline, "no snapshot was written")
                time.sleep(0.05)
            r = d.request("PUT", "/v1/keys", {"tier": "l2", "entries": [
                {"key": k, "size_bytes": 64} for k in keys[240:]]})
            self.assertIn(r.status, (200, 201), r.body)
            em = Emitter(d.addr[0], d.port, "inst-a")
            self.assertEqual(em.register()[0] // 100, 2)
            for i in range(20):
                em.store("l1", "cpu", fkey("m", "%064x" % i), 4096)
            self.assertEqual(em.flush()[0], 200)
            self.before = self.state(d)
            self.assertEqual((len(self.before[0]), len(self.before[1])), (300, 20))
        finally:
            self.assertEqual(d.stop(), 0)

    def tearDown(self):
        super().tearDown()
        self.tmp.cleanup()

    def state(self, d):
        listing = d.request("GET", "/v1/keys?page_size=1000").json()
        fleet = d.request("GET", "/directory/keys?limit=1000").json()
        return (sorted(json.dumps(k, sort_keys=True) for k in listing["entries"]),
                sorted(json.dumps(k, sort_keys=True) for k in fleet["keys"]))

    def after_sweep(self):
        d = Daemon(settings={"data_dir": self.tmp.name, "fsync": "always"})
        try:
            self.assertEqual(self.state(d), self.before)
        finally:
            d.stop()

if __name__ == "__main__":
    unittest.main()
