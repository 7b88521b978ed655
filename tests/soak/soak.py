#!/usr/bin/env python3
"""Soak test of kvidxd: one daemon under every kind of load for SOAK_SECONDS
(default 600), one `kill -9` halfway and a restart on the same data_dir, then
exact checks of what it holds against what the clients were told.

Run it with `make soak` (normal build) or `make soak-asan` (ASan build, 60 s);
directly: `KVIDXD=build-test/kvidxd SOAK_SECONDS=120 python3 tests/soak/soak.py`.
Python 3 stdlib only; it needs `redis-server` (scripts/deps.sh test). Every
process it starts (kvidxd, redis-server, its clients) runs on 127.0.0.1 and
is stopped by its PID; every load stops by itself at SOAK_SECONDS.

The daemon: `data_dir` (temp), `fsync = everysec`, small snapshots (so that
the fork/rotate path runs many times), an `fs:` source (a temp directory
written with LMCache FS L2 file names and real renames) and a `redis://`
source (our own redis-server on a free loopback port), a small
`instance_timeout_s`, small request limits (so oversized requests are cheap).

The clients, one process each, each with a key space of its own (its own
model name) so that its reference of what the daemon acknowledged is exact:

* `mut-N`: batch and single PUT/DELETE, single GETs, lookups (key and ipc
  form), listings of its own model (every answer is checked against the
  reference: stored counts, deleted/not_found counts, 204/404, sizes, tiers,
  found/l1/l2 indices, hit_keys, hit_chunks, the listing itself);
* `pipe`: the same kinds of requests, 4-12 at a time pipelined on one
  connection (answers must come in order);
* `slow`: the same, each request trickled a few bytes at a time, and now and
  then a request whose headers stall past `header_timeout_ms` (408);
* `list`: paged walks (page size changing between pages) of the whole index
  and of one model while everything mutates: keys in ascending order, none
  repeated, and every *stable* key (stored once at start by each producer,
  never touched again) present exactly once;
* `prefetch`: LOOKUP handles (key and ipc form) submitted, polled
  (`wait_ms`), released, deleted, or left to expire (then 410);
* `bad`: malformed and oversized requests, each must answer its 4xx/5xx
  problem+json with its code (counted per kind);
* `fleet`: emulated LMCache MP servers (tests/integration/lmcache_emitter.py)
  posting /events, heartbeating, restarted with a higher incarnation (their L1
  placements fenced), and left silent past `instance_timeout_s` (dropped,
  fenced, re-registered on the heartbeat's 404);
* `fs`, `redis`: writers of the two sources' stores.

The kill: halfway through, kvidxd gets SIGKILL and is started again on the
same data_dir and port; clients see their connections fail, wait for the new
process, and reconcile. With `fsync = everysec` the daemon may lose writes it
acknowledged shortly before the kill (on a power failure; a kill -9 keeps
what reached the kernel). The rule checked: every write acknowledged more
than WINDOW_S (2 s) before the kill must be there; of the writes acknowledged
in the last WINDOW_S, the daemon must hold exactly a prefix of each client's
sequence of writes (a write whose answer never came may or may not be in it).
The acknowledged writes after that prefix are counted as "lost within the
everysec window"; any other difference fails the run.

RSS: VmRSS of kvidxd, sampled every second. W = 60 s, or a tenth of
SOAK_SECONDS when that is shorter. Baseline of each incarnation = the median
of its samples from W to W + 5 s after its load started (the first process:
the soak's start; the second: its restart). End = the median of the
incarnation's last 5 samples (before the kill; before the load stops).
Checked: end <= 110% of baseline. The peak and every step of 1 MiB or more
between two samples (with the mappings that grew, from /proc/PID/smaps) are
printed. Under ASan the figures are printed but not checked (its allocator
quarantine grows RSS by design).

At the end (load stopped, sources given time to converge): the full listing
equals the union of every reference (API clients, fs files, redis keys), L1
and L2 tiers included; /directory/keys equals the emitters' references; pins,
prefetch pins and handles are back to 0 (/metrics); the first kvidxd died of
the SIGKILL only, the second exits 0 on SIGTERM; the logs hold no sanitizer
report and no error-level line. Exit status 0 only when every check passed.
"""

import collections
import copy
import json
import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))

import harness  # noqa: E402
from harness import Daemon, build_request  # noqa: E402
import lmcache_emitter  # noqa: E402
import redis_helper  # noqa: E402

WINDOW_S = 2.0          # acknowledged writes this close to the kill may be lost
RANK = 0x01000100       # world size 1, worker 0
TIMEOUT = 30.0          # per request: generous, the machine is shared
INSTANCE_TIMEOUT_S = 4
FLEET_SIZE = 5
HEADER_TIMEOUT_MS = 3000
HANDLE_GRACE_MS = 3000
MAX_BODY = 1 << 20
MAX_KEYS = 4096
ASAN = os.environ.get("SOAK_ASAN", "") not in ("", "0")


def now():
    return time.monotonic()


class ConnError(Exception):
    """The connection failed: the request's outcome is unknown."""


# ---------------------------------------------------------------- keys

def hash_hex(i):
    return "%016x" % ((i * 0x9E3779B97F4A7C15 + 0x1234) % (1 << 64))


def mkkey(model, i, salt=""):
    return {"model_name": model, "kv_rank": RANK, "object_group_id": 0,
            "chunk_hash_hex": hash_hex(i), "cache_salt": salt}


def canonical(k):
    s = "%s@%08x@%x@%s" % (k["model_name"], k["kv_rank"], k["object_group_id"],
                           k["chunk_hash_hex"])
    return s + ("@" + k["cache_salt"] if k.get("cache_salt") else "")


def order_key(k):
    return (k.get("cache_salt", "").encode(), k["model_name"].encode(), k["kv_rank"],
            k["object_group_id"], bytes.fromhex(k["chunk_hash_hex"]))


def fs_name(k):
    name = "%s@0x%08x@%x@%s" % (k["model_name"].replace("/", "-SEP-"), k["kv_rank"],
                                k["object_group_id"], k["chunk_hash_hex"])
    return name + ".data"


STABLE_BASE = 1000000   # stable keys: indices from here, never mutated
N_STABLE = 30


def stable_keys(model, salt=""):
    return [mkkey(model, STABLE_BASE + i, salt) for i in range(N_STABLE)]


FS_MODEL = "org/soak-fs"
REDIS_MODEL = "soak/redis"
REDIS_PREFIX = "lmc"
PF_MODEL = "soak-pf"
PF_KEYS = 64


def redis_name(k):
    return REDIS_PREFIX + "@" + canonical(k)


# ---------------------------------------------------------------- HTTP

class Http:
    """A keep-alive HTTP/1.1 connection that reconnects lazily."""

    def __init__(self, port):
        self.port = port
        self.sock = None
        self.reader = None

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = self.reader = None

    def _connect(self):
        if self.sock is None:
            try:
                self.sock = socket.create_connection(("127.0.0.1", self.port), TIMEOUT)
            except OSError as e:
                self.close()
                raise ConnError("connect: %s" % e)
            self.sock.settimeout(TIMEOUT)
            self.reader = harness._Reader(self.sock)

    def send(self, data, trickle=None):
        self._connect()
        try:
            if trickle is None:
                self.sock.sendall(data)
            else:
                i = 0
                while i < len(data):
                    n = trickle[0]()
                    self.sock.sendall(data[i:i + n])
                    i += n
                    time.sleep(trickle[1]())
        except OSError as e:
            self.close()
            raise ConnError("send: %s" % e)

    def read(self, head=False):
        try:
            r = self.reader.response(head)
        except (OSError, EOFError, ValueError, IndexError) as e:
            self.close()
            raise ConnError("read: %s" % e)
        if r.headers.get("connection", "").lower() == "close":
            self.close()
        return r

    def request(self, method, path, body=b"", headers=None, trickle=None):
        self.send(build_request(method, path, body, headers), trickle)
        return self.read(head=(method == "HEAD"))


def rjson(r):
    try:
        return json.loads(r.body.decode()) if r.body else None
    except ValueError:
        return None


def problem_code(r):
    if not r.headers.get("content-type", "").startswith("application/problem+json"):
        return None
    j = rjson(r)
    return j.get("code") if isinstance(j, dict) else None


def walk(http, params, page_sizes=(5000,), max_pages=100000):
    """Every entry of a paged GET /v1/keys; page size drawn per page."""
    out, tok = [], None
    for _ in range(max_pages):
        q = dict(params)
        q["page_size"] = random.choice(page_sizes)
        if tok:
            q["page_token"] = tok
        r = http.request("GET", "/v1/keys?" + urllib.parse.urlencode(q))
        if r.status != 200:
            raise AssertionError("listing %r answered %d %r" % (params, r.status, r.body[:200]))
        j = rjson(r)
        out += j["entries"]
        tok = j["next_page_token"]
        if tok is None:
            return out
    raise AssertionError("listing does not end")


# ---------------------------------------------------------------- shared state

class Shared:
    """What the controller and the client processes share."""

    def __init__(self, deadline, port):
        self.deadline = mp.Value("d", deadline)
        self.phase = mp.Value("i", 0)      # 0 serving, 1 killed (until restarted)
        self.gen = mp.Value("i", 0)        # incarnation number of kvidxd, from 0
        self.kill_t = mp.Value("d", 0.0)   # monotonic time of the kill
        self.port = port
        self.results = mp.Queue()
        self.stable_ready = mp.Value("i", 0)


# ---------------------------------------------------------------- worker base

class Worker:
    kind = "worker"

    def __init__(self, name, shared):
        self.name = name
        self.sh = shared
        self.port = shared.port
        self.http = Http(self.port)
        self.gen = 0
        self.requests = collections.Counter()
        self.expected = collections.Counter()
        self.unexpected = collections.Counter()
        self.samples = []
        self.faults = collections.Counter()
        self.lost = 0
        self.reconciles = 0
        self.extra = {}
        self.rng = random.Random(hash(name) ^ os.getpid())

    def alive(self):
        return now() < self.sh.deadline.value

    def bad(self, kind, msg):
        self.unexpected[kind] += 1
        if len(self.samples) < 20:
            self.samples.append("%s: %s: %s" % (self.name, kind, msg[:600]))

    def outage(self):
        """True when a connection failure is explained by the kill."""
        return self.sh.phase.value == 1 or self.sh.gen.value != self.gen

    def wait_restart(self):
        """Waits until the restarted kvidxd serves (bounded by the deadline)."""
        end = self.sh.deadline.value + 120
        while (self.sh.phase.value == 1 or self.sh.gen.value == self.gen) and now() < end:
            if self.sh.phase.value == 0 and self.sh.gen.value == self.gen:
                break
            time.sleep(0.05)
        self.http.close()

    def conn_failed(self, e, what):
        if self.outage():
            self.expected["conn_failed_by_kill"] += 1
            self.wait_restart()
            return True
        self.bad("conn_error", "%s: %s" % (what, e))
        self.http.close()
        time.sleep(0.2)
        return False

    def wait_listed(self, keys, timeout=60):
        """Waits until the daemon holds every key (a source's keys appear
        once its notification or inotify event is applied)."""
        end = now() + timeout
        for k in keys:
            path = "/v1/keys/" + urllib.parse.quote(canonical(k), safe="@")
            while True:
                try:
                    if self.call("get_one", "GET", path).status == 200:
                        break
                except ConnError as e:
                    self.conn_failed(e, "wait_listed")
                if now() > end:
                    self.bad("source_lag", "%s not indexed after %.0f s" % (canonical(k), timeout))
                    return
                time.sleep(0.05)

    def call(self, kind, method, path, body=b"", headers=None, trickle=None):
        self.requests[kind] += 1
        return self.http.request(method, path, body, headers, trickle)

    def pace(self, lo=0.003, hi=0.012):
        time.sleep(self.rng.uniform(lo, hi))

    def report(self):
        return {"name": self.name, "kind": self.kind, "requests": dict(self.requests),
                "expected": dict(self.expected), "unexpected": dict(self.unexpected),
                "samples": self.samples, "faults": dict(self.faults), "lost": self.lost,
                "reconciles": self.reconciles, "extra": self.extra}

    def main(self):
        try:
            self.run()
        except Exception:
            self.bad("client_crash", traceback.format_exc())
        finally:
            try:
                self.finish()
            except Exception:
                self.bad("client_crash", traceback.format_exc())
            self.sh.results.put(self.report())

    def finish(self):
        pass


# ---------------------------------------------------------------- history

class History:
    """The ops a client had acknowledged, with checkpoints of its reference,
    to find which prefix of them a restarted daemon holds."""

    def __init__(self, ref):
        self.cps = collections.deque(maxlen=20)
        self.cps.append([now(), copy.deepcopy(ref), []])

    def record(self, t_ack, op):
        self.cps[-1][2].append((t_ack, op))

    def checkpoint(self, ref):
        if now() - self.cps[-1][0] >= 1.0:
            self.cps.append([now(), copy.deepcopy(ref), []])

    def reset(self, ref):
        self.cps.clear()
        self.cps.append([now(), copy.deepcopy(ref), []])

    def candidates(self, must_t, apply, fence=None):
        """[(state, lost)]: the state after every op acknowledged before
        must_t plus each prefix of the later ones (fewest lost first). With
        fence, the fence op is inserted at each position after must_t
        instead (a drop at an unknown moment)."""
        start = 0
        for i, cp in enumerate(self.cps):
            if cp[0] <= must_t:
                start = i
        state = copy.deepcopy(self.cps[start][1])
        ops = [o for cp in list(self.cps)[start:] for o in cp[2]]
        rest = []
        for t, op in ops:
            if t is not None and t < must_t and not rest:
                apply(state, op)
            else:
                rest.append((t, op))
        out = []
        if fence is None:
            s = copy.deepcopy(state)
            cands = [(copy.deepcopy(s), sum(1 for t, _ in rest if t is not None))]
            for k, (t, op) in enumerate(rest):
                apply(s, op)
                cands.append((copy.deepcopy(s), sum(1 for t2, _ in rest[k + 1:] if t2 is not None)))
            out = sorted(cands, key=lambda c: c[1])
        else:
            for k in range(len(rest) + 1):
                s = copy.deepcopy(state)
                for _, op in rest[:k]:
                    apply(s, op)
                apply(s, fence)
                for _, op in rest[k:]:
                    apply(s, op)
                out.append((s, 0))
        return out, len(rest)


# ---------------------------------------------------------------- API mutators

def apply_api(ref, op):
    kind = op[0]
    if kind == "put":
        _, tier, items = op
        for c, size in items:
            e = ref.get(c)
            if e is None:
                e = ref[c] = [size, False, False]
            e[0] = size
            e[1 if tier == "l1" else 2] = True
    elif kind == "del":
        _, tier, cs = op
        for c in cs:
            e = ref.get(c)
            if e is None:
                continue
            if tier in ("all", "l1"):
                e[1] = False
            if tier in ("all", "l2"):
                e[2] = False
            if not e[1] and not e[2]:
                del ref[c]


class MutClient(Worker):
    kind = "api"

    def __init__(self, name, shared, mode="single", universe=300, salt=""):
        super().__init__(name, shared)
        self.mode = mode
        self.model = "soak-" + name
        self.salt = salt
        self.keys = [mkkey(self.model, i, salt) for i in range(universe)]
        self.by_c = {canonical(k): k for k in self.keys}
        self.ref = {}
        self.hist = None
        self.last_stall = now()

    # -- op builders: (kind, method, path, body, expect(resp)->err|None, op|None)
    def rand_keys(self, n):
        return self.rng.sample(self.keys, min(n, len(self.keys)))

    def exp_status(self, r, status):
        if r.status != status:
            return "status %d, expected %d: %r" % (r.status, status, r.body[:300])
        return None

    def op_put_batch(self, ref):
        tier = self.rng.choice(("l1", "l2"))
        ks = self.rand_keys(self.rng.randint(1, 40))
        items = [(canonical(k), self.rng.randint(1, 1 << 20)) for k in ks]
        body = {"tier": tier, "entries": [{"key": k, "size_bytes": s}
                                          for k, (_, s) in zip(ks, items)]}
        n = len(items)

        def exp(r):
            return self.exp_status(r, 200) or (None if rjson(r) == {"stored": n}
                                               else "answer %r, expected stored %d" % (r.body, n))
        return "put_batch", "PUT", "/v1/keys", body, exp, ("put", tier, items)

    def op_put_one(self, ref):
        k = self.rng.choice(self.keys)
        c = canonical(k)
        tier = self.rng.choice(("l1", "l2"))
        size = self.rng.randint(1, 1 << 30)

        def exp(r):
            return self.exp_status(r, 200) or (None if rjson(r) == {"stored": 1}
                                               else "answer %r" % r.body)
        return ("put_one", "PUT", "/v1/keys/" + urllib.parse.quote(c, safe="@"),
                {"size_bytes": size, "tier": tier}, exp, ("put", tier, [(c, size)]))

    def op_del_batch(self, ref):
        tier = self.rng.choice(("all", "all", "l1", "l2"))
        ks = self.rand_keys(self.rng.randint(1, 20))
        cs = [canonical(k) for k in ks]
        deleted = 0
        for c in cs:
            e = ref.get(c)
            if e and ((tier in ("all", "l1") and e[1]) or (tier in ("all", "l2") and e[2])):
                deleted += 1
        want = {"deleted": deleted, "not_found": len(cs) - deleted, "skipped_pinned": 0,
                "skipped_source": 0}

        def exp(r):
            return self.exp_status(r, 200) or (None if rjson(r) == want
                                               else "answer %r, expected %r" % (r.body, want))
        return "del_batch", "DELETE", "/v1/keys", {"tier": tier, "keys": ks}, exp, ("del", tier, cs)

    def op_del_one(self, ref):
        k = self.rng.choice(self.keys)
        c = canonical(k)
        present = c in ref

        def exp(r):
            if present:
                return self.exp_status(r, 204)
            if r.status == 404 and problem_code(r) == "not_found":
                self.expected["delete_404"] += 1
                return None
            return "status %d, expected 404 not_found: %r" % (r.status, r.body[:200])
        return ("del_one", "DELETE", "/v1/keys/" + urllib.parse.quote(c, safe="@"), b"", exp,
                ("del", "all", [c]))

    def op_get_one(self, ref):
        k = self.rng.choice(self.keys)
        c = canonical(k)
        e = copy.deepcopy(ref.get(c))

        def exp(r):
            if e is None:
                if r.status == 404 and problem_code(r) == "not_found":
                    self.expected["get_404"] += 1
                    return None
                return "status %d for an absent key: %r" % (r.status, r.body[:200])
            err = self.exp_status(r, 200)
            if err:
                return err
            j = rjson(r)
            l1 = {"state": "ready", "pins": 0, "temporary": False} if e[1] else None
            want = {"key": k, "size_bytes": e[0], "l1": l1, "l2": e[2], "l2_sources": []}
            return None if j == want else "answer %r, expected %r" % (j, want)
        return ("get_one", "GET", "/v1/keys/" + urllib.parse.quote(c, safe="@"), b"", exp, None)

    def lookup_expect(self, ref, cs, ipc):
        n = len(cs)
        l1 = [i for i, c in enumerate(cs) if c in ref and ref[c][1]]
        l2 = [i for i, c in enumerate(cs) if c in ref and ref[c][2]]
        found = [i for i, c in enumerate(cs) if c in ref]
        hit = 0
        while hit < n and cs[hit] in ref:
            hit += 1
        fb = sum(ref[c][0] for c in cs if c in ref)
        return {"total_keys": n, "l1_indices": l1, "l2_indices": l2, "found_indices": found,
                "hit_keys": hit, "found_bytes": fb, "hit_chunks": hit if ipc else None}

    def op_lookup(self, ref, ipc):
        ks = self.rand_keys(self.rng.randint(1, 12))
        cs = [canonical(k) for k in ks]
        want = self.lookup_expect(ref, cs, ipc)
        if ipc:
            body = {"model_name": self.model, "world_size": 1, "worker_id": None,
                    "cache_salt": self.salt, "chunk_hashes": [k["chunk_hash_hex"] for k in ks]}
        else:
            body = {"keys": ks}

        def exp(r):
            err = self.exp_status(r, 200)
            if err:
                return err
            j = rjson(r)
            return None if j == want else "answer %r, expected %r" % (j, want)
        return ("lookup_ipc" if ipc else "lookup_keys"), "POST", "/v1/lookup", body, exp, None

    def op_list(self, ref):
        want = {c: e[0] for c, e in ref.items()}
        return "list_own", want

    # -- running ops
    def run_op(self, b, trickle=None):
        kind, method, path, body, exp, op = b
        try:
            r = self.call(kind, method, path, body, None, trickle)
        except ConnError:
            if op is not None:
                self.hist.record(None, op)
            raise
        err = exp(r)
        if err:
            self.bad(kind, err)
        if op is not None:
            if r.status >= 300 and not (kind == "del_one" and r.status == 404):
                # refused: nothing changed (every error above was reported)
                return
            apply_api(self.ref, op)
            self.hist.record(now(), op)

    def list_own(self):
        want = {c: (e[0], e[1], e[2]) for c, e in self.ref.items()}
        got = self.daemon_state(page_sizes=(self.rng.randint(7, 500),))
        if got != want:
            self.bad("list_own", self.diff(want, got))

    def daemon_state(self, page_sizes=(5000,)):
        q = {"model_name": self.model}
        if self.salt:
            q["cache_salt"] = self.salt
        self.requests["list_own"] += 3
        anyt = walk(self.http, dict(q, tier="any"), page_sizes)
        l1 = {canonical(e["key"]) for e in walk(self.http, dict(q, tier="l1"), page_sizes)}
        l2 = {canonical(e["key"]) for e in walk(self.http, dict(q, tier="l2"), page_sizes)}
        out = {}
        for e in anyt:
            c = canonical(e["key"])
            if c in out:
                self.bad("list_repeat", c)
            out[c] = (e["size_bytes"], c in l1, c in l2)
        return out

    @staticmethod
    def diff(want, got):
        missing = sorted(set(want) - set(got))[:4]
        extra = sorted(set(got) - set(want))[:4]
        wrong = [(c, want[c], got[c]) for c in sorted(set(want) & set(got)) if want[c] != got[c]][:4]
        return "reference %d keys, daemon %d; missing %s extra %s differ %s" % (
            len(want), len(got), missing, extra, wrong)

    def reconcile(self, must_t):
        """After a restart (or an unexplained connection failure): the
        daemon must hold one of the candidate states."""
        self.reconciles += 1
        for _ in range(20):
            try:
                got = self.daemon_state()
                break
            except ConnError as e:
                if not self.conn_failed(e, "reconcile"):
                    continue
        else:
            self.bad("reconcile", "could not read the daemon's state")
            return
        proj = lambda st: {c: (e[0], e[1], e[2]) for c, e in st.items()}  # noqa: E731
        cands, nrest = self.hist.candidates(must_t, apply_api)
        for st, lost in cands:
            if proj(st) == got:
                self.ref = st
                self.lost += lost
                self.extra["window_ops"] = self.extra.get("window_ops", 0) + nrest
                self.hist.reset(self.ref)
                return
        full = cands[0][0] if cands else {}
        for st, lost in cands:
            if lost == 0:
                full = st
        self.bad("reconcile", "no prefix of the last %d ops matches: %s" % (
            nrest, self.diff(proj(full), got)))
        self.ref = {c: list(v) for c, v in got.items()}
        self.hist.reset(self.ref)

    def setup(self):
        st = stable_keys(self.model, self.salt)
        body = {"tier": "l2", "entries": [{"key": k, "size_bytes": 4096} for k in st]}
        while True:
            try:
                r = self.call("put_batch", "PUT", "/v1/keys", body)
                break
            except ConnError as e:
                self.conn_failed(e, "setup")
        if r.status != 200:
            self.bad("setup", "stable keys: %d %r" % (r.status, r.body[:200]))
        for k in st:
            self.ref[canonical(k)] = [4096, False, True]
        with self.sh.stable_ready.get_lock():
            self.sh.stable_ready.value += 1
        self.hist = History(self.ref)

    def one_builder(self):
        x = self.rng.random()
        if x < 0.22:
            return self.op_put_batch(self.ref)
        if x < 0.36:
            return self.op_put_one(self.ref)
        if x < 0.48:
            return self.op_del_batch(self.ref)
        if x < 0.56:
            return self.op_del_one(self.ref)
        if x < 0.70:
            return self.op_get_one(self.ref)
        if x < 0.83:
            return self.op_lookup(self.ref, False)
        if x < 0.96:
            return self.op_lookup(self.ref, True)
        return None   # a listing of the own model

    def run(self):
        self.setup()
        while self.alive():
            if self.sh.gen.value != self.gen and self.sh.phase.value == 0:
                self.http.close()
                self.gen = self.sh.gen.value
                self.reconcile(self.sh.kill_t.value - WINDOW_S)
            try:
                if self.mode == "pipe":
                    self.pipelined()
                elif self.mode == "slow":
                    self.slow_step()
                else:
                    b = self.one_builder()
                    if b is None:
                        self.list_own()
                    else:
                        self.run_op(b)
                    self.pace()
            except ConnError as e:
                if self.conn_failed(e, "op"):
                    self.gen = self.sh.gen.value
                    self.reconcile(self.sh.kill_t.value - WINDOW_S)
                else:
                    self.reconcile(now())
            self.hist.checkpoint(self.ref)

    def pipelined(self):
        """4..12 requests sent at once on one connection; expectations are
        computed in sequence on a scratch copy of the reference."""
        n = self.rng.randint(4, 12)
        scratch = copy.deepcopy(self.ref)
        group = []
        for _ in range(n):
            x = self.rng.random()
            if x < 0.3:
                b = self.op_put_one(scratch)
            elif x < 0.45:
                b = self.op_put_batch(scratch)
            elif x < 0.6:
                b = self.op_del_one(scratch)
            elif x < 0.8:
                b = self.op_get_one(scratch)
            else:
                b = self.op_lookup(scratch, self.rng.random() < 0.5)
            if b[5] is not None:
                apply_api(scratch, b[5])
            group.append(b)
        data = b"".join(build_request(m, p, body) for _, m, p, body, _, _ in group)
        try:
            for b in group:
                self.requests[b[0]] += 1
            self.requests["pipelined_groups"] += 1
            self.http.send(data)
        except ConnError:
            for b in group:
                if b[5] is not None:
                    self.hist.record(None, b[5])
            raise
        for i, b in enumerate(group):
            kind, _, _, _, exp, op = b
            try:
                r = self.http.read()
            except ConnError:
                for b2 in group[i:]:
                    if b2[5] is not None:
                        self.hist.record(None, b2[5])
                raise
            err = exp(r)
            if err:
                self.bad(kind + "_pipelined", err)
            if op is not None and (r.status < 300 or (kind == "del_one" and r.status == 404)):
                apply_api(self.ref, op)
                self.hist.record(now(), op)
        self.pace(0.005, 0.02)

    def slow_step(self):
        if now() - self.last_stall > 15:
            self.last_stall = now()
            self.stall()
            return
        b = self.one_builder() or self.op_get_one(self.ref)
        trickle = (lambda: self.rng.randint(1, 12), lambda: self.rng.uniform(0.002, 0.02))
        self.faults["slow_requests"] += 1
        self.run_op(b, trickle)

    def stall(self):
        """Headers that stop coming: 408 request_timeout, then close."""
        self.faults["slow_header_timeout"] += 1
        s = None
        try:
            s = socket.create_connection(("127.0.0.1", self.port), TIMEOUT)
            s.settimeout(HEADER_TIMEOUT_MS / 1000.0 + 20)
            s.sendall(b"GET /v1/keys?model_name=x HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            t0 = now()
            r = harness.read_response(s)
            waited = now() - t0
            self.requests["stalled"] += 1
            if r.status == 408 and problem_code(r) == "request_timeout":
                self.expected["408_request_timeout"] += 1
                if waited < HEADER_TIMEOUT_MS / 1000.0 * 0.8:
                    self.bad("stall", "408 after %.2f s, before header_timeout_ms" % waited)
            else:
                self.bad("stall", "status %d %r" % (r.status, r.body[:200]))
        except (OSError, EOFError) as e:
            if not self.outage():
                self.bad("stall", "no 408: %s" % e)
        finally:
            if s:
                s.close()

    def finish(self):
        self.extra["ref_keys"] = len(self.ref)
        self.extra["model"] = self.model
        self.extra["ref"] = {c: list(e) for c, e in self.ref.items()}


# ---------------------------------------------------------------- lister

class Lister(Worker):
    kind = "list"

    def __init__(self, name, shared, producers):
        super().__init__(name, shared)
        self.producers = producers   # (model, salt) with N_STABLE stable keys each

    def run(self):
        while self.sh.stable_ready.value < len([p for p in self.producers if p[2]]) and self.alive():
            time.sleep(0.1)
        stable = {}
        for model, salt, has_stable in self.producers:
            if not has_stable:
                continue
            for k in stable_keys(model, salt):
                stable[canonical(k)] = k
        walks = collections.Counter()
        while self.alive():
            x = self.rng.random()
            if x < 0.4:
                params, what = {}, "full"
            elif x < 0.8:
                model, salt, _ = self.rng.choice(self.producers)
                params, what = {"model_name": model}, "model"
                if salt:
                    params["cache_salt"] = salt
            else:
                params, what = {"tier": "l2"}, "l2"
            try:
                self.one_walk(params, stable, what)
                walks[what] += 1
            except ConnError as e:
                self.conn_failed(e, "walk")
                self.gen = self.sh.gen.value
            time.sleep(self.rng.uniform(0.01, 0.1))
        self.extra["walks"] = dict(walks)

    def matches(self, k, params):
        if "model_name" in params and k["model_name"] != params["model_name"]:
            return False
        if "cache_salt" in params and k["cache_salt"] != params["cache_salt"]:
            return False
        return True

    def one_walk(self, params, stable, what):
        seen, last, tok, pages = set(), None, None, 0
        while True:
            q = dict(params, page_size=self.rng.choice((1, 3, 17, 50, 100, 250, 400)))
            if tok:
                q["page_token"] = tok
            path = "/v1/keys?" + urllib.parse.urlencode(q)
            for attempt in range(100):
                try:
                    r = self.call("list_page", "GET", path)
                    break
                except ConnError as e:
                    if not self.conn_failed(e, "page"):
                        continue
                    self.gen = self.sh.gen.value
                    self.faults["walk_across_restart"] += 1
            else:
                raise ConnError("the page never answered")
            if r.status == 410 and problem_code(r) == "page_token_expired" and tok:
                self.expected["410_page_token_expired"] += 1
                return
            if r.status != 200:
                self.bad("list_page", "%d %r" % (r.status, r.body[:200]))
                return
            j = rjson(r)
            for e in j["entries"]:
                c = canonical(e["key"])
                if c in seen:
                    self.bad("list_repeat", "%s listed twice (%s walk)" % (c, what))
                seen.add(c)
                ok = order_key(e["key"])
                if last is not None and ok <= last:
                    self.bad("list_order", "%s after %r" % (c, last))
                last = ok
            pages += 1
            tok = j["next_page_token"]
            if tok is None:
                break
        want = {c for c, k in stable.items() if self.matches(k, params)}
        missing = want - seen
        if missing:
            self.bad("list_skipped_stable", "%d stable keys not listed (%s walk), e.g. %s" % (
                len(missing), what, sorted(missing)[:3]))
        self.requests["walks_" + what] += 1


# ---------------------------------------------------------------- prefetch client

class PrefetchClient(Worker):
    kind = "prefetch"

    def __init__(self, name, shared):
        super().__init__(name, shared)
        self.keys = [mkkey(PF_MODEL, i) for i in range(PF_KEYS)]
        self.live = {}       # id -> n keys (pinned, to release or delete)
        self.expiring = {}   # id -> expires_at_ms

    def setup(self):
        body_l2 = {"tier": "l2", "entries": [{"key": k, "size_bytes": 8192} for k in self.keys]}
        body_l1 = {"tier": "l1", "entries": [{"key": k, "size_bytes": 8192}
                                             for k in self.keys[:PF_KEYS // 2]]}
        for body in (body_l2, body_l1):
            while True:
                try:
                    r = self.call("put_batch", "PUT", "/v1/keys", body)
                    break
                except ConnError as e:
                    self.conn_failed(e, "setup")
            if r.status != 200:
                self.bad("setup", "%d %r" % (r.status, r.body[:200]))

    def run(self):
        self.setup()
        while self.alive():
            try:
                if self.sh.gen.value != self.gen and self.sh.phase.value == 0:
                    self.after_restart()
                self.step()
            except ConnError as e:
                if self.conn_failed(e, "prefetch"):
                    self.after_restart()
            time.sleep(self.rng.uniform(0.005, 0.03))

    def after_restart(self):
        """Handles do not survive a restart: every old id answers 404."""
        self.gen = self.sh.gen.value
        self.http.close()
        old = list(self.live) + list(self.expiring)
        for hid in old[:20]:
            r = self.call("handle_get", "GET", "/v1/prefetches/%s" % hid)
            if r.status == 404:
                self.expected["handle_404_after_restart"] += 1
            else:
                self.bad("handle_after_restart", "%s: %d %r" % (hid, r.status, r.body[:200]))
        self.faults["handles_lost_in_restart"] += len(old)
        self.live.clear()
        self.expiring.clear()

    def step(self):
        t_ms = time.time() * 1000
        for hid, exp_ms in list(self.expiring.items()):
            if t_ms > exp_ms + 300:
                r = self.call("handle_get", "GET", "/v1/prefetches/%s" % hid)
                code = problem_code(r)
                if r.status == 410 and code == "handle_expired":
                    self.expected["410_handle_expired"] += 1
                elif r.status == 404 and t_ms > exp_ms + HANDLE_GRACE_MS - 500:
                    self.expected["404_after_grace"] += 1
                else:
                    self.bad("expiry", "%s: %d %r (%.0f ms after expiry)" % (
                        hid, r.status, r.body[:200], t_ms - exp_ms))
                r = self.call("handle_release", "POST", "/v1/prefetches/%s/release" % hid)
                if r.status in (404, 410):
                    self.expected["release_after_expiry_%d" % r.status] += 1
                else:
                    self.bad("expiry", "release of expired %s: %d" % (hid, r.status))
                del self.expiring[hid]
        if len(self.live) >= 8 or (self.live and self.rng.random() < 0.4):
            hid = self.rng.choice(list(self.live))
            n = self.live.pop(hid)
            if self.rng.random() < 0.5:
                r = self.call("handle_release", "POST", "/v1/prefetches/%s/release" % hid)
                j = rjson(r) or {}
                if r.status != 200 or j.get("status") != "released" or j.get("pinned_keys") != 0:
                    self.bad("release", "%d %r" % (r.status, r.body[:300]))
            else:
                r = self.call("handle_delete", "DELETE", "/v1/prefetches/%s" % hid)
                if r.status != 204:
                    self.bad("delete", "%d %r" % (r.status, r.body[:300]))
            return
        self.submit()

    def submit(self):
        n = self.rng.randint(1, 12)
        s = self.rng.randint(0, PF_KEYS - n)
        ks = self.keys[s:s + n]
        expire = self.rng.random() < 0.3
        lease = self.rng.randint(300, 1500) if expire else 20000
        if self.rng.random() < 0.5:
            body = {"keys": ks}
            ipc = False
        else:
            body = {"model_name": PF_MODEL, "world_size": 1,
                    "chunk_hashes": [k["chunk_hash_hex"] for k in ks]}
            ipc = True
        body.update({"mode": "LOOKUP", "lease_ms": lease,
                     "external_request_id": "soak-%d" % self.rng.randint(0, 1 << 30)})
        r = self.call("prefetch_submit_" + ("ipc" if ipc else "keys"), "POST", "/v1/prefetches", body)
        if r.status != 201:
            self.bad("submit", "%d %r" % (r.status, r.body[:300]))
            return
        h = rjson(r)
        hid = h["id"]
        for _ in range(20):
            if h.get("status") != "pending":
                break
            r = self.call("handle_poll", "GET", "/v1/prefetches/%s?wait_ms=2000" % hid)
            if r.status != 200:
                if expire and r.status == 410:
                    self.expected["410_while_pending"] += 1
                    return
                self.bad("poll", "%d %r" % (r.status, r.body[:300]))
                return
            h = rjson(r)
        want = list(range(n))
        if (h.get("status") != "completed" or h.get("found_indices") != want
                or h.get("retained_indices") != want or h.get("hit_keys") != n
                or h.get("pinned_keys") != n or h.get("lost_indices") != []
                or h.get("hit_chunks") != (n if ipc else None)):
            if not (expire and h.get("status") != "completed"):
                self.bad("handle", "unexpected handle %r" % h)
        if expire:
            self.expiring[hid] = h["expires_at_ms"]
            self.faults["leases_left_to_expire"] += 1
        else:
            self.live[hid] = n

    def finish(self):
        # Give back what is still held; wait out the leases left to expire.
        for hid in list(self.live):
            try:
                r = self.call("handle_delete", "DELETE", "/v1/prefetches/%s" % hid)
                if r.status != 204:
                    self.bad("delete", "%d at the end" % r.status)
            except ConnError as e:
                self.bad("conn_error", "final delete: %s" % e)
        self.live.clear()
        if self.expiring:
            time.sleep(max(0, (max(self.expiring.values()) - time.time() * 1000) / 1000.0) + 0.5)


# ---------------------------------------------------------------- bad requests

J = {"Content-Type": "application/json"}


def bad_cases():
    """(kind, raw request, status, code)"""
    lk = lambda i: {"model_name": "m", "kv_rank": 1, "chunk_hash_hex": "%04x" % i}  # noqa: E731
    return [
        ("malformed_json", build_request("PUT", "/v1/keys", b"{not json", J), 400, "invalid_json"),
        ("malformed_key", build_request("PUT", "/v1/keys", {"entries": [
            {"key": {"model_name": "m", "kv_rank": 1, "chunk_hash_hex": "abc"}, "size_bytes": 1}]}),
         400, "invalid_key"),
        ("malformed_member", build_request("PUT", "/v1/keys", {"entriez": []}), 400, "invalid_argument"),
        ("malformed_media_type", build_request("POST", "/v1/lookup", b'{"keys":[]}'), 415,
         "unsupported_media_type"),
        ("malformed_path", build_request("GET", "/v1/nope"), 404, "not_found"),
        ("malformed_method", build_request("DELETE", "/v1/limits"), 405, "method_not_allowed"),
        ("malformed_page_token", build_request("GET", "/v1/keys?page_token=AAAAgarbage"), 400,
         "invalid_page_token"),
        ("malformed_query", build_request("GET", "/v1/keys?bogus=1"), 400, "invalid_argument"),
        ("malformed_http", b"BLAH\r\n\r\n", 400, "invalid_argument"),
        ("malformed_content_length", b"PUT /v1/keys HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
         400, "invalid_argument"),
        ("malformed_coding", build_request("PUT", "/v1/keys", b"", {"Transfer-Encoding": "gzip, chunked",
                                                                   "Content-Type": "application/json"}),
         501, "not_implemented"),
        ("malformed_http2", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, "http_version_not_supported"),
        ("malformed_canonical", build_request("GET", "/v1/keys/not-a-key"), 400, "invalid_key"),
        ("malformed_depth", build_request("POST", "/v1/lookup", b"[" * 40 + b"]" * 40, J), 400,
         "invalid_json"),
        ("malformed_events", build_request("POST", "/events", {"batches": [
            {"instance_id": "x", "incarnation": 1, "seq": 0, "event_type": "store", "tier": "l1",
             "backend": "dram"}]}), 422, "invalid_argument"),
        ("malformed_handle", build_request("GET", "/v1/prefetches/notanid"), 404, "not_found"),
        ("oversized_uri", build_request("GET", "/v1/keys?model_name=" + "a" * 9000), 414, "uri_too_long"),
        ("oversized_headers", build_request("GET", "/livez", b"", {"X-Big": "a" * 17000}), 431,
         "headers_too_large"),
        ("oversized_keys", build_request("POST", "/v1/lookup", {"keys": [lk(i) for i in range(MAX_KEYS + 10)]}),
         413, "too_many_keys"),
        # The body is announced but not sent: the limit is checked on Content-Length.
        ("oversized_body", b"PUT /v1/keys HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         b"Content-Length: %d\r\n\r\n{" % (2 * MAX_BODY), 413, "payload_too_large"),
    ]


class BadClient(Worker):
    kind = "bad"

    def run(self):
        cases = bad_cases()
        while self.alive():
            kind, data, status, code = self.rng.choice(cases)
            s = None
            try:
                s = socket.create_connection(("127.0.0.1", self.port), TIMEOUT)
                s.settimeout(TIMEOUT)
                s.sendall(data)
                r = harness.read_response(s)
                self.requests[kind] += 1
                self.faults["malformed" if kind.startswith("malformed") else "oversized"] += 1
                if r.status == status and problem_code(r) == code:
                    self.expected["%d_%s" % (status, code)] += 1
                else:
                    self.bad(kind, "status %d code %r, expected %d %s: %r" % (
                        r.status, problem_code(r), status, code, r.body[:200]))
            except (OSError, EOFError) as e:
                if self.outage():
                    self.expected["conn_failed_by_kill"] += 1
                    self.wait_restart()
                    self.gen = self.sh.gen.value
                else:
                    self.bad("conn_error", "%s: %s" % (kind, e))
            finally:
                if s:
                    s.close()
            time.sleep(self.rng.uniform(0.02, 0.1))


# ---------------------------------------------------------------- fleet

def apply_dir(state, op):
    if op[0] == "fence":
        for c in list(state):
            pl = state[c]
            for ident in [i for i in pl if i[0] == "l1"]:
                del pl[ident]
            if not pl:
                del state[c]
        return
    _, fence_first, batches = op
    if fence_first:
        apply_dir(state, ("fence",))
    for et, tier, backend, entries in batches:
        for c, size in entries:
            if et == "store":
                state.setdefault(c, {})[(tier, backend)] = size
            elif et == "delete":
                pl = state.get(c)
                if pl is not None:
                    pl.pop((tier, backend), None)
                    if not pl:
                        del state[c]


class Em:
    def __init__(self, idx, port, incarnation):
        self.iid = "em-%d" % idx
        self.model = "soak-fleet-%d" % idx
        self.keys = [mkkey(self.model, i) for i in range(200)]
        self.e = lmcache_emitter.Emitter("127.0.0.1", port, self.iid, incarnation=incarnation)
        self.ref = {}
        self.hist = History(self.ref)
        self.fence_next = False
        self.silent_until_drop = False
        self.last_hb_ok = now()
        self.next_hb = now()
        self.next_flush = now()


class FleetClient(Worker):
    kind = "fleet"

    def __init__(self, name, shared, n=FLEET_SIZE):
        super().__init__(name, shared)
        base = int(time.time())
        self.ems = [Em(i, self.port, base) for i in range(n)]
        self.next_fault = now() + 8
        self.fault_i = 0

    def req(self, kind, method, path, obj=None):
        body = b"" if obj is None else obj
        return self.call(kind, method, path, body)

    def register(self, em):
        r = self.req("instances_register", "POST", "/instances",
                     {"instance_id": em.iid, "ip": "127.0.0.1", "http_port": 8080, "metadata": {}})
        if r.status != 200:
            self.bad("register", "%d %r" % (r.status, r.body[:200]))
        em.last_hb_ok = now()

    def cursor(self, em):
        r = self.req("directory_streams", "GET", "/directory/streams")
        for s in (rjson(r) or {}).get("streams", []):
            if s["instance_id"] == em.iid:
                return s
        return None

    def dir_state(self, em):
        r = self.req("directory_keys", "GET", "/directory/keys?" + urllib.parse.urlencode(
            {"instance_id": em.iid, "limit": 10000}))
        if r.status != 200:
            raise AssertionError("/directory/keys %d %r" % (r.status, r.body[:200]))
        out = {}
        for row in rjson(r)["keys"]:
            c = canonical(row["key"])
            for p in row["placements"]:
                if p["instance_id"] != em.iid:
                    continue
                out.setdefault(c, {})[(p["tier"], p["backend"])] = p["size_bytes"]
        return out

    def reconcile(self, em, must_t, fence=None):
        self.reconciles += 1
        got = self.dir_state(em)
        cands, nrest = em.hist.candidates(must_t, apply_dir, fence)
        for st, lost in cands:
            if st == got:
                em.ref = st
                self.lost += lost
                self.extra["window_ops"] = self.extra.get("window_ops", 0) + nrest
                break
        else:
            want = cands[-1][0] if cands else {}
            if fence is None:
                want = min(cands, key=lambda c: c[1])[0]
            self.bad("reconcile", "%s: no candidate of %d ops matches; %s" % (
                em.iid, nrest, MutClient.diff(want, got)))
            em.ref = got
        em.hist.reset(em.ref)
        c = self.cursor(em)
        em.fence_next = c is not None and c["incarnation"] < em.e.incarnation

    def gen_events(self, em):
        for _ in range(self.rng.randint(1, 8)):
            k = self.rng.choice(em.keys)
            x = self.rng.random()
            if x < 0.35:
                em.e.store("l1", "dram", k, self.rng.randint(1, 1 << 24))
            elif x < 0.6:
                em.e.store("l2", "fs", k, self.rng.randint(1, 1 << 24))
            elif x < 0.75:
                em.e.delete("l1", "dram", k)
            elif x < 0.9:
                em.e.delete("l2", "fs", k)
            else:
                em.e.access("l1", k)

    def flush(self, em):
        batches = em.e._take()
        if not batches:
            return
        op = ("flush", em.fence_next,
              [(b["event_type"], b["tier"], b["backend"],
                [(canonical(e["key"]), e.get("size_bytes", 0)) for e in b["entries"]])
               for b in batches])
        try:
            r = self.req("events", "POST", "/events", {"batches": batches})
        except ConnError:
            em.hist.record(None, op)
            raise
        j = rjson(r) or {}
        if r.status != 200 or j.get("applied") != len(batches):
            self.bad("events", "%s: %d %r (%d batches)" % (em.iid, r.status, r.body[:200], len(batches)))
            return
        apply_dir(em.ref, op)
        em.hist.record(now(), op)
        em.fence_next = False

    def heartbeat(self, em, dropped=False):
        r = self.req("instances_heartbeat", "PUT", "/instances/%s/heartbeat" % em.iid)
        if r.status == 200:
            em.last_hb_ok = now()
            if dropped:
                self.bad("timeout", "%s: heartbeat 200 after its drop" % em.iid)
            return
        if r.status == 404:
            silent = now() - em.last_hb_ok
            if dropped:
                self.expected["heartbeat_404_after_drop"] += 1
            elif self.sh.gen.value != self.gen:
                self.expected["heartbeat_404_after_restart"] += 1
            elif silent < INSTANCE_TIMEOUT_S:
                self.bad("spurious_drop", "%s dropped %.1f s after its last heartbeat" % (em.iid, silent))
            else:
                # This process itself was late (the machine is shared):
                # the drop fenced L1 at an unknown moment since then.
                self.expected["late_heartbeat_drop"] += 1
                self.reconcile(em, now() - silent - 1, fence=("fence",))
            self.register(em)
            self.faults["re_registered_on_404"] += 1
            return
        self.bad("heartbeat", "%d %r" % (r.status, r.body[:200]))

    def fault(self):
        em = self.ems[self.fault_i % len(self.ems)]
        self.fault_i += 1
        if self.fault_i % 2 == 1:
            # A restart: a new emitter object, a higher incarnation; the
            # server registers again; its first batch fences its L1.
            self.flush(em)
            em.e = lmcache_emitter.Emitter("127.0.0.1", self.port, em.iid,
                                           incarnation=em.e.incarnation + 1)
            c = self.cursor(em)
            em.fence_next = c is not None and c["incarnation"] < em.e.incarnation
            self.register(em)
            self.faults["instance_restarts"] += 1
            if not em.fence_next:
                self.expected["restart_without_cursor"] += 1
        else:
            self.flush(em)
            em.silent_until_drop = now()
            self.faults["instance_timeouts"] += 1

    def wait_drop(self, em):
        """A silent instance: dropped after instance_timeout_s."""
        r = self.req("instances_list", "GET", "/instances")
        ids = [i["instance_id"] for i in (rjson(r) or {}).get("instances", [])]
        if em.iid in ids:
            if now() - em.silent_until_drop > INSTANCE_TIMEOUT_S + 30:
                self.bad("timeout", "%s still registered %.0f s after going silent" % (
                    em.iid, now() - em.silent_until_drop))
                em.silent_until_drop = False
            return
        waited = now() - em.silent_until_drop
        if waited < INSTANCE_TIMEOUT_S - 0.5 and self.sh.gen.value == self.gen:
            self.bad("timeout", "%s dropped after %.1f s of silence" % (em.iid, waited))
        self.extra.setdefault("drop_after_s", []).append(round(waited, 2))
        apply_dir(em.ref, ("fence",))
        em.hist.record(now(), ("fence",))
        got = self.dir_state(em)
        if any(t == "l1" for pl in got.values() for (t, _) in pl):
            self.bad("timeout", "%s dropped but L1 placements remain" % em.iid)
        em.silent_until_drop = False
        self.heartbeat(em, dropped=True)   # 404: registers again

    def run(self):
        for em in self.ems:
            while True:
                try:
                    self.register(em)
                    break
                except ConnError as e:
                    self.conn_failed(e, "register")
        while self.alive():
            try:
                if self.sh.gen.value != self.gen and self.sh.phase.value == 0:
                    self.after_restart()
                t = now()
                if t >= self.next_fault and t < self.sh.deadline.value - 15:
                    self.next_fault = t + max(6.0, (self.sh.deadline.value - t) / 6)
                    self.fault()
                for em in self.ems:
                    if em.silent_until_drop:
                        if now() - em.silent_until_drop > 1:
                            self.wait_drop(em)
                        continue
                    if now() >= em.next_hb:
                        em.next_hb = now() + 0.5
                        self.heartbeat(em)
                    if now() >= em.next_flush:
                        em.next_flush = now() + self.rng.uniform(0.1, 0.4)
                        self.gen_events(em)
                        self.flush(em)
                    em.hist.checkpoint(em.ref)
            except ConnError as e:
                if self.conn_failed(e, "fleet"):
                    self.after_restart()
                else:
                    self.after_error()
            time.sleep(0.02)
        for em in self.ems:
            try:
                if em.silent_until_drop:
                    continue
                self.flush(em)
            except ConnError as e:
                self.bad("conn_error", "final flush: %s" % e)

    def after_restart(self):
        self.gen = self.sh.gen.value
        self.http.close()
        for em in self.ems:
            em.e.pending = {}
            self.reconcile(em, self.sh.kill_t.value - WINDOW_S)

    def after_error(self):
        for em in self.ems:
            self.reconcile(em, now())

    def finish(self):
        self.extra["ref"] = {em.iid: {c: {"%s/%s" % k: v for k, v in pl.items()}
                                      for c, pl in em.ref.items()} for em in self.ems}


# ---------------------------------------------------------------- source writers

class FsWriter(Worker):
    kind = "fs"

    def __init__(self, name, shared, d):
        super().__init__(name, shared)
        self.dir = d
        self.keys = [mkkey(FS_MODEL, i) for i in range(300)]
        os.makedirs(os.path.join(d, "tmpdir"), exist_ok=True)

    def write(self, k, size, via_subdir=False):
        final = os.path.join(self.dir, fs_name(k))
        if via_subdir:
            tmp = os.path.join(self.dir, "tmpdir", os.path.basename(final))
        else:
            tmp = final[:-len(".data")] + ".tmp"
        with open(tmp, "wb") as f:
            f.write(b"\0" * size)
        os.replace(tmp, final)

    def run(self):
        for k in stable_keys(FS_MODEL):
            self.write(k, 4096)
        self.wait_listed(stable_keys(FS_MODEL))
        with self.sh.stable_ready.get_lock():
            self.sh.stable_ready.value += 1
        while self.alive():
            k = self.rng.choice(self.keys)
            p = os.path.join(self.dir, fs_name(k))
            x = self.rng.random()
            if x < 0.45:
                self.write(k, self.rng.randint(1, 6000))
                self.requests["fs_write_rename"] += 1
            elif x < 0.6:
                self.write(k, self.rng.randint(1, 6000), via_subdir=True)
                self.requests["fs_write_subdir_rename"] += 1
            elif x < 0.85:
                try:
                    os.unlink(p)
                    self.requests["fs_unlink"] += 1
                except FileNotFoundError:
                    pass
            else:
                try:
                    os.replace(p, p[:-len(".data")] + ".tmp")   # renamed away
                    os.unlink(p[:-len(".data")] + ".tmp")
                    self.requests["fs_rename_away"] += 1
                except FileNotFoundError:
                    pass
            time.sleep(self.rng.uniform(0.005, 0.03))


class RedisWriter(Worker):
    kind = "redis"

    def __init__(self, name, shared, rport):
        super().__init__(name, shared)
        self.rport = rport
        self.keys = [mkkey(REDIS_MODEL, i) for i in range(300)]

    def run(self):
        c = redis_helper.Client(self.rport)
        c.pipeline([("SET", redis_name(k), b"s" * 4096) for k in stable_keys(REDIS_MODEL)])
        self.wait_listed(stable_keys(REDIS_MODEL))
        with self.sh.stable_ready.get_lock():
            self.sh.stable_ready.value += 1
        while self.alive():
            k = self.rng.choice(self.keys)
            n = redis_name(k)
            x = self.rng.random()
            if x < 0.5:
                c.cmd("SET", n, b"v" * self.rng.randint(1, 5000))
                self.requests["redis_set"] += 1
            elif x < 0.8:
                c.cmd("DEL", n)
                self.requests["redis_del"] += 1
            elif x < 0.9:
                c.cmd("APPEND", n, b"a" * self.rng.randint(1, 100))
                self.requests["redis_append"] += 1
            else:
                c.cmd("PEXPIRE", n, self.rng.randint(50, 500))
                self.requests["redis_pexpire"] += 1
            time.sleep(self.rng.uniform(0.005, 0.03))
        c.close()


# ---------------------------------------------------------------- controller

def rss_kib(pid, field="VmRSS"):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def smaps(pid):
    """{mapping: (Rss KiB, AnonHugePages KiB)} of a process."""
    out, cur = {}, None
    try:
        with open("/proc/%d/smaps" % pid) as f:
            for line in f:
                head = line.split(None, 1)[0]
                if not head.endswith(":") or "-" in head:
                    f0 = line.split()
                    cur = "%s %s" % (f0[0], f0[5] if len(f0) > 5 else "[anon]")
                    out[cur] = [0, 0]
                elif head == "Rss:" and cur:
                    out[cur][0] = int(line.split()[1])
                elif head == "AnonHugePages:" and cur:
                    out[cur][1] = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return out


def children_of(pid):
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % p) as f:
                st = f.read()
            ppid = int(st[st.rindex(")") + 2:].split()[1])
        except (OSError, ValueError):
            continue
        if ppid == pid:
            out.append(int(p))
    return out


def proc_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            st = f.read()
        return st[st.rindex(")") + 2:].split()[0]
    except (OSError, ValueError):
        return None


def metrics(d):
    r = d.request("GET", "/metrics", timeout=TIMEOUT)
    out = {}
    for line in r.body.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, val = line.rpartition(" ")
            try:
                out[name] = float(val)
            except ValueError:
                pass
    return out


class Soak:
    def __init__(self):
        self.seconds = float(os.environ.get("SOAK_SECONDS", "600"))
        self.baseline_s = min(60.0, self.seconds / 10.0)
        self.failures = []
        self.tmp = tempfile.mkdtemp(prefix="kvidx-soak-")
        self.data_dir = os.path.join(self.tmp, "data")
        os.makedirs(self.data_dir)
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.fs_dir = tempfile.mkdtemp(prefix="kvidx-soak-fs-", dir=shm)
        self.redis = None
        self.daemons = []
        self.rss = []   # (incarnation, t since its load start, KiB)
        self.rss_parts = []  # (incarnation, t, RssAnon, RssFile)
        self.jumps = []  # RSS steps of 1 MiB or more between two samples
        self.faults = collections.Counter()

    def fail(self, what):
        self.failures.append(what)
        print("FAIL: " + what, flush=True)

    def settings(self):
        return {
            "listen": "127.0.0.1:%d" % self.port,
            "data_dir": self.data_dir, "fsync": "everysec",
            "snapshot_journal_bytes": "256KiB",
            "l2_source": "fs:%s redis://127.0.0.1:%d/0?prefix=%s" % (
                self.fs_dir, self.redis.port, REDIS_PREFIX),
            "l2_source_reconnect_max_ms": 500, "l2_source_rescan_s": 5,
            "instance_timeout_s": INSTANCE_TIMEOUT_S, "health_check_interval_s": 1,
            "handle_grace_ms": HANDLE_GRACE_MS, "header_timeout_ms": HEADER_TIMEOUT_MS,
            "max_body_bytes": "1MiB", "max_keys_per_request": MAX_KEYS,
            "log_level": "info",
        }

    def start_daemon(self):
        d = Daemon(settings=self.settings(), start_timeout=60)
        self.daemons.append(d)
        end = now() + 120
        while now() < end:
            try:
                if d.request("GET", "/readyz", timeout=TIMEOUT).status == 200:
                    return d
            except OSError:
                pass
            if not d.running():
                break
            time.sleep(0.1)
        raise RuntimeError("kvidxd did not become ready:\n" + d.log()[-3000:])

    def run(self):
        self.redis = redis_helper.RedisServer(args=("--notify-keyspace-events", "AKE"), name="soak")
        self.port = redis_helper.free_port()
        d = self.start_daemon()
        t_start = now()
        deadline = t_start + self.seconds
        sh = Shared(deadline, self.port)
        workers = [MutClient("mut-0", sh), MutClient("mut-1", sh, salt="tenant-a"),
                   MutClient("mut-2", sh), MutClient("pipe", sh, mode="pipe"),
                   MutClient("slow", sh, mode="slow", universe=100)]
        producers = [(w.model, w.salt, True) for w in workers] + [
            (FS_MODEL, "", True), (REDIS_MODEL, "", True), (PF_MODEL, "", False)]
        workers += [Lister("list", sh, producers), PrefetchClient("prefetch", sh),
                    BadClient("bad", sh), FleetClient("fleet", sh),
                    FsWriter("fs", sh, self.fs_dir), RedisWriter("redis", sh, self.redis.port)]
        procs = []
        ctx = mp.get_context("fork")
        for w in workers:
            p = ctx.Process(target=w.main, name=w.name, daemon=True)
            p.start()
            procs.append((w, p))
        print("soak: kvidxd pid %d on 127.0.0.1:%d, %d clients, %.0f s, baseline at %.0f s%s" % (
            d.proc.pid, self.port, len(procs), self.seconds, self.baseline_s,
            " (ASan)" if ASAN else ""), flush=True)
        kill_at = t_start + self.seconds / 2
        inc_start = t_start
        killed = False
        hb = None
        prev_sm = prev_v = None
        next_print = now() + 15
        while now() < deadline:
            t = now()
            v = rss_kib(d.proc.pid)
            if v is not None:
                self.rss.append((len(self.daemons) - 1, t - inc_start, v))
                self.rss_parts.append((len(self.daemons) - 1, t - inc_start,
                                       rss_kib(d.proc.pid, "RssAnon"), rss_kib(d.proc.pid, "RssFile")))
                # Where a jump of RSS comes from: the mappings that grew.
                sm = smaps(d.proc.pid)
                if prev_sm is not None and prev_v is not None and v - prev_v >= 1024:
                    grew = sorted(((sm[m][0] - prev_sm.get(m, [0, 0])[0], m, sm[m][1])
                                   for m in sm), reverse=True)[:3]
                    self.jumps.append("incarnation %d at %.0f s: %+d KiB; %s" % (
                        len(self.daemons) - 1, t - inc_start, v - prev_v,
                        "; ".join("%s %+d KiB (AnonHugePages %d KiB)" % (m, g, h)
                                  for g, m, h in grew if g > 0)))
                prev_sm, prev_v = sm, v
            if not d.running():
                self.fail("kvidxd exited unexpectedly (status %r)" % d.proc.returncode)
                break
            if not killed and t >= kill_at:
                killed = True
                kids = children_of(d.proc.pid)
                sh.kill_t.value = now()
                sh.phase.value = 1
                os.kill(d.proc.pid, signal.SIGKILL)
                rc = d.proc.wait(30)
                self.faults["kill_9"] += 1
                if rc != -signal.SIGKILL:
                    self.fail("the killed kvidxd exited %r, not by SIGKILL" % rc)
                d.kill()
                for k in kids:
                    # A snapshot child dies with its parent (PR_SET_PDEATHSIG);
                    # exiting can take a moment (a large ASan image), and its
                    # zombie stays until whoever adopted it reaps it.
                    self.faults["snapshot_child_at_kill"] += 1
                    end = now() + 10
                    while proc_state(k) not in (None, "Z", "X") and now() < end:
                        time.sleep(0.05)
                    if proc_state(k) not in (None, "Z", "X"):
                        self.fail("snapshot child %d still runs 10 s after its parent's kill" % k)
                        os.kill(k, signal.SIGKILL)
                t_restart0 = now()
                d = self.start_daemon()
                self.restart_s = now() - t_restart0
                inc_start = now()
                prev_sm = prev_v = None
                sh.gen.value = 1
                sh.phase.value = 0
                print("soak: killed (-9) and restarted in %.2f s, new pid %d" % (
                    self.restart_s, d.proc.pid), flush=True)
            if hb is None and t >= deadline - 3:
                # The emulated servers stop with the load; their instances
                # would time out (and lose their L1 placements) during the
                # final checks: keep them alive until the directory is read.
                hb = self.start_heartbeats(["em-%d" % i for i in range(FLEET_SIZE)])
            if t >= next_print:
                next_print = t + 15
                print("soak: %.0f s, rss %s KiB" % (t - t_start, v), flush=True)
            time.sleep(1.0)
        self.d = d
        results = []
        end = now() + 120
        while len(results) < len(procs) and now() < end:
            try:
                results.append(sh.results.get(timeout=1))
            except Exception:
                pass
        for w, p in procs:
            p.join(max(0.1, end - now()))
            if p.is_alive():
                self.fail("client %s did not stop; killed" % w.name)
                os.kill(p.pid, signal.SIGKILL)
                p.join(5)
        if len(results) != len(procs):
            self.fail("%d of %d clients reported" % (len(results), len(procs)))
        self.results = results
        if hb is None:
            hb = self.start_heartbeats(["em-%d" % i for i in range(FLEET_SIZE)])
        try:
            self.final_checks()
        finally:
            hb.set()

    def start_heartbeats(self, ids):
        import threading
        stop = threading.Event()

        def loop():
            while not stop.wait(0.5):
                for iid in ids:
                    try:
                        lmcache_emitter.post_json("127.0.0.1", self.port, "PUT",
                                                  "/instances/%s/heartbeat" % iid, None)
                    except OSError:
                        pass
        threading.Thread(target=loop, daemon=True).start()
        return stop

    # ---------------------------------------------------------- final checks
    def expected_index(self):
        want = {}
        for res in self.results:
            if res["kind"] == "api":
                for c, e in res["extra"]["ref"].items():
                    want[c] = tuple(e)
        for i in range(PF_KEYS):
            want[canonical(mkkey(PF_MODEL, i))] = (8192, i < PF_KEYS // 2, True)
        fs = {}
        for n in os.listdir(self.fs_dir):
            if not n.endswith(".data"):
                continue
            p = os.path.join(self.fs_dir, n)
            st = os.lstat(p)
            if st.st_size <= 0:
                continue
            model, rank, group, h = n[:-5].split("@")[:4]
            k = {"model_name": model.replace("-SEP-", "/"), "kv_rank": int(rank, 16),
                 "object_group_id": int(group, 16), "chunk_hash_hex": h, "cache_salt": ""}
            fs[canonical(k)] = (st.st_size, False, True)
        rc = self.redis.client()
        rk = {c: (n, False, True) for c, n in redis_helper.keyspace(rc, REDIS_PREFIX).items()}
        rc.close()
        want.update(fs)
        want.update(rk)
        return want, len(fs), len(rk)

    def daemon_index(self):
        http = Http(self.port)
        anyt = walk(http, {"tier": "any"})
        l1 = {canonical(e["key"]) for e in walk(http, {"tier": "l1"})}
        l2 = {canonical(e["key"]) for e in walk(http, {"tier": "l2"})}
        http.close()
        return {canonical(e["key"]): (e["size_bytes"], canonical(e["key"]) in l1,
                                      canonical(e["key"]) in l2) for e in anyt}, len(anyt)

    def final_checks(self):
        d = self.d
        self.index_ok = self.dir_ok = False
        # The sources converge (inotify, keyspace events, a rescan after the restart).
        want = got = None
        end = now() + 60
        while now() < end:
            want, nfs, nredis = self.expected_index()
            got, n = self.daemon_index()
            if got == want and n == len(got):
                self.index_ok = True
                break
            time.sleep(0.5)
        self.keys_end = len(got or {})
        self.keys_by_origin = {"fs": nfs, "redis": nredis}
        if not self.index_ok:
            self.fail("index != references: " + MutClient.diff(want, got))
        # The fleet directory.
        fleet = [r for r in self.results if r["kind"] == "fleet"]
        if fleet:
            dwant = {}
            for iid, ref in fleet[0]["extra"]["ref"].items():
                for c, pl in ref.items():
                    for ident, size in pl.items():
                        tier, backend = ident.split("/")
                        dwant.setdefault(c, set()).add((iid, tier, backend, size))
            dgot, off = {}, 0
            while True:
                r = d.request("GET", "/directory/keys?limit=10000&offset=%d" % off, timeout=TIMEOUT)
                j = r.json()
                for row in j["keys"]:
                    c = canonical(row["key"])
                    dgot[c] = {(p["instance_id"], p["tier"], p["backend"], p["size_bytes"])
                               for p in row["placements"]}
                off += len(j["keys"])
                if not j["keys"] or off >= j["total"]:
                    break
            self.dir_keys = len(dgot)
            self.dir_ok = dgot == dwant
            if not self.dir_ok:
                self.fail("directory != emitters' references: " + MutClient.diff(dwant, dgot))
        # Pins and handles back to zero (leases expire, grace ends).
        end = now() + 30
        m = {}
        while now() < end:
            m = metrics(d)
            if all(m.get(g, -1) == 0 for g in ("kvidx_pins", "kvidx_prefetch_pins",
                                               "kvidx_prefetch_handles", "kvidx_l1_loading")):
                break
            time.sleep(0.5)
        self.gauges = {g: m.get(g) for g in ("kvidx_pins", "kvidx_prefetch_pins",
                                             "kvidx_prefetch_handles", "kvidx_l1_loading",
                                             "kvidx_keys_distinct")}
        for g in ("kvidx_pins", "kvidx_prefetch_pins", "kvidx_prefetch_handles", "kvidx_l1_loading"):
            if m.get(g) != 0:
                self.fail("%s is %r at the end, not 0" % (g, m.get(g)))
        self.served = {k: v for k, v in m.items() if k.startswith("kvidx_http_requests_total")}
        # RSS: the median of the samples in the 5 s from the baseline time
        # against the median of the incarnation's last 5 samples (a single
        # sample's transient peak is neither).
        self.rss_figures = []
        for inc in (0, 1):
            samples = [(t, v) for i, t, v in self.rss if i == inc]
            base = [v for t, v in samples if self.baseline_s <= t < self.baseline_s + 5]
            after = [v for t, v in samples if t >= self.baseline_s]
            if not base or len(after) < 5:
                self.fail("too few RSS samples for incarnation %d after %.0f s" % (inc, self.baseline_s))
                continue
            b = sorted(base)[len(base) // 2]
            last = sorted(after[-5:])[2]
            peak = max(after)
            self.rss_figures.append((inc, b, peak, last))
            if last > b * 1.10:
                msg = "RSS of incarnation %d grew from %d KiB (baseline) to %d KiB at its end (+%.1f%%)" % (
                    inc, b, last, 100.0 * (last - b) / b)
                if ASAN:
                    print("note (ASan, not checked): " + msg)
                else:
                    self.fail(msg)
        # Stop: the second process exits 0 on SIGTERM.
        rc = d.stop(timeout=60)
        self.exit_code = rc
        if rc != 0:
            self.fail("kvidxd exited %r on SIGTERM" % rc)
        self.log_levels = collections.Counter()
        self.snapshots = [0, 0]
        self.restored = ""
        for i, dd in enumerate(self.daemons):
            log = dd.log()
            self.snapshots[min(i, 1)] += len(re.findall(r"snapshot: generation \d+ written", log))
            m = re.search(r"restored from .*", log)
            if i == 1 and m:
                self.restored = m.group(0)[:200]
            for line in log.splitlines():
                parts = line.split(" ", 2)
                lvl = parts[1] if len(parts) > 2 else "?"
                self.log_levels[lvl] += 1
                if lvl == "error":
                    self.fail("daemon %d logged an error: %s" % (i, line[:300]))
            for pat in ("AddressSanitizer", "LeakSanitizer", "runtime error:", "Assertion", "SUMMARY:"):
                if pat in log:
                    self.fail("daemon %d log holds %r:\n%s" % (i, pat, log[log.index(pat) - 200:][:3000]))

    def cleanup(self):
        for d in self.daemons:
            d.kill()
        if self.redis:
            self.redis.stop()
        keep = os.environ.get("SOAK_KEEP")
        if keep:
            print("soak: kept %s and %s" % (self.tmp, self.fs_dir))
            for i, d in enumerate(self.daemons):
                print("soak: log of kvidxd %d: %s" % (i, d.log_path))
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
            shutil.rmtree(self.fs_dir, ignore_errors=True)
            for d in self.daemons:
                shutil.rmtree(d.tmp, ignore_errors=True)

    # ---------------------------------------------------------- report
    def report(self):
        req, exp, unexp = collections.Counter(), collections.Counter(), collections.Counter()
        faults = collections.Counter(self.faults)
        lost = window = 0
        samples = []
        for r in self.results:
            req.update(r["requests"])
            exp.update(r["expected"])
            unexp.update(r["unexpected"])
            faults.update(r["faults"])
            lost += r["lost"]
            window += r["extra"].get("window_ops", 0)
            samples += r["samples"][:6]
        print("\n==== kvidx soak report (%.0f s%s) ====" % (self.seconds, ", ASan" if ASAN else ""))
        print("requests sent by kind (%d):" % sum(req.values()))
        for k, v in sorted(req.items()):
            print("  %-32s %d" % (k, v))
        print("served by the second kvidxd (/metrics kvidx_http_requests_total):")
        for k, v in sorted(getattr(self, "served", {}).items()):
            print("  %-60s %d" % (k[len("kvidx_http_requests_total"):], v))
        print("expected errors by kind (%d):" % sum(exp.values()))
        for k, v in sorted(exp.items()):
            print("  %-32s %d" % (k, v))
        print("unexpected errors by kind (%d):" % sum(unexp.values()))
        for k, v in sorted(unexp.items()):
            print("  %-32s %d" % (k, v))
        for s in samples[:60]:
            print("    " + s)
        print("faults injected by kind:")
        for k, v in sorted(faults.items()):
            print("  %-32s %d" % (k, v))
        if hasattr(self, "restart_s"):
            print("restart after kill -9: ready in %.2f s" % self.restart_s)
        print("RSS (VmRSS, KiB; baseline: median over [%.0f s, %.0f s) after the incarnation's load "
              "started; end: median of its last 5 samples; checked: end <= 110%% of baseline):"
              % (self.baseline_s, self.baseline_s + 5))
        for inc, b, peak, last in getattr(self, "rss_figures", []):
            print("  incarnation %d: baseline %d, at its end %d (%+.1f%%), peak after the baseline %d (%+.1f%%)"
                  % (inc, b, last, 100.0 * (last - b) / b, peak, 100.0 * (peak - b) / b))
            parts = [(t, a, f) for i, t, a, f in self.rss_parts if i == inc and a is not None]
            pb = [x for x in parts if x[0] >= self.baseline_s]
            if pb:
                print("    of which anonymous / file-backed: %d / %d at the baseline, %d / %d at the end"
                      % (pb[0][1], pb[0][2], pb[-1][1], pb[-1][2]))
            ser = [(t, v) for i, t, v in self.rss if i == inc]
            steps = [j for j in self.jumps if j.startswith("incarnation %d " % inc)]
            for j in ([] if ASAN else steps[:5]):
                print("    step: " + j[len("incarnation 0 "):])
            if len(steps) > (0 if ASAN else 5):
                print("    (%d steps of 1 MiB or more in all)" % len(steps))
            step = max(1, len(ser) // 12)
            print("    series (s: KiB): " + ", ".join("%.0f: %d" % x for x in ser[::step]))
        print("keys at the end: %d in the index (fs %d, redis %d), %d in the directory" % (
            getattr(self, "keys_end", 0), self.keys_by_origin.get("fs", 0) if hasattr(self, "keys_by_origin") else 0,
            self.keys_by_origin.get("redis", 0) if hasattr(self, "keys_by_origin") else 0,
            getattr(self, "dir_keys", 0)))
        print("index == references: %s; directory == references: %s" % (
            getattr(self, "index_ok", False), getattr(self, "dir_ok", False)))
        print("gauges at the end: %s" % getattr(self, "gauges", {}))
        print("snapshots written in the background: %s (first, second incarnation)" % (
            getattr(self, "snapshots", None),))
        print("second incarnation: %s" % getattr(self, "restored", ""))
        print("writes in the last %.0f s before the kill (acknowledged or in flight): %d; "
              "acknowledged writes lost within the everysec window: %d" % (WINDOW_S, window, lost))
        print("daemon log lines by level: %s" % dict(getattr(self, "log_levels", {})))
        print("exit of the second kvidxd on SIGTERM: %r" % getattr(self, "exit_code", None))
        if unexp:
            self.failures.append("%d unexpected errors" % sum(unexp.values()))
        if self.failures:
            print("RESULT: FAILED (%d checks)" % len(self.failures))
            for f in self.failures:
                print("  - " + f[:2000])
            return 1
        print("RESULT: passed")
        return 0


def main():
    s = Soak()
    rc = 1
    try:
        s.run()
    except Exception:
        s.fail("soak aborted: " + traceback.format_exc())
        s.results = getattr(s, "results", [])
    finally:
        try:
            rc = s.report()
        finally:
            s.cleanup()
    sys.exit(rc)


if __name__ == "__main__":
    main()
