"""Crash consistency: kvidxd is killed with SIGKILL at random points of a
mixed write load, round after round on the same data_dir, under
fsync=always, with an fs: source and a Redis source following their stores
and the fleet directory taking events and registrations.

One round: start kvidxd on the data_dir, wait for /readyz, check what came
back against the reference, run the load for a random 0-300 ms (seeded),
SIGKILL, start again. The load is one thread per kind of writer:

* three key writers (disjoint keys): PUT /v1/keys batches of new keys,
  single PUT /v1/keys/{key}, DELETE /v1/keys batches and single DELETEs of
  keys they stored; the third pipelines 2-6 of these on one keep-alive
  connection, so that one fsync covers several answers;
* two event threads, two streams each (lmcache_emitter.Emitter; a kvidxd
  restart changes no incarnation): store and delete batches posted to
  /events; one stream also names keys no other stream names, with shared
  placements and token ids; now and then a batch of an older incarnation
  (answered stale) and a restart of the server behind a stream (the next
  incarnation, seqs from 1, its L1 placements fenced); one stream skips a
  flush once on purpose (a gap, expected);
* a registrar: POST /instances of new ids and of registered ones (a new
  port: re_registered), DELETE /instances/{id};
* a file writer in the fs: source's directory (a temporary name renamed
  onto the .data name, renames from one key's name to another's, unlinks)
  and a Redis writer (SET, DEL) against our own redis-server.

What must hold after every restart:

* every acknowledged write is there: the keys a 200 PUT stored (with their
  sizes) are listed and the keys a 200/204 DELETE removed are not, the full
  listing of the API's keys equals the reference exactly; each /events
  answer was the reference's applied/duplicates/stale; the directory's
  keys and placements equal the reference (no placement twice, counts
  equal /directory/stats, token counts as the reference's); GET /instances
  lists exactly the acknowledged registrations, each with the
  registration_time it was first listed with;
* a write in flight at the kill (sent, no answer) may or may not be
  applied, but whole or not at all: a PUT or DELETE batch is found
  entirely applied or entirely not (and of pipelined requests, those
  applied come before those not); an /events request in flight is
  replayed by its emitter, and the batches the answer calls duplicates are
  a prefix of it whose entries are all applied, the rest none. This
  holds after a torn tail too (a write() the kill cut short): the journal
  frames each request's records, so a torn request is dropped whole;
* the cursors resume without a spurious gap: GET /directory/streams after
  the restart (before any replay) has, per instance, last_seq equal to the
  last acknowledged seq (or to the last durable seq of the batch in
  flight), gap_detected false unless that instance skipped on purpose, and
  the applied/duplicates/stale counters of the reference; the last
  acknowledged request of each emitter, replayed, is all duplicates;
* the log of the restart shows no damage other than a torn tail of the
  newest journal (docs/persistence.md: a torn last record is cut off and
  logged; the fleet batch it belonged to is dropped whole), and the
  daemon becomes ready;
* both sources converge to what the directory and the Redis server hold.

A second test tears a journal inside a fleet batch that took several
records (TornFleetBatch): the batch must be dropped whole, the cursor
must stay at the batch before, and the emitter's replay applies it once.

A third of the rounds use a small snapshot_journal_bytes, so the kill also
lands while snapshot children run and journals rotate. After one round in
ten the test appends the start of a record that was never finished to the
newest journal (a write cut short), and the restart must log it as a torn
tail and lose nothing acknowledged.

Rounds: 50 (KVIDX_CRASH_ROUNDS overrides), in the ASan build as well:
a round is mostly load time (0-300 ms), a start and the checks, and on
the 2-core machine the ASan build ran 50 rounds in 25-37 s against 18-34 s
for the normal one (the higher figures with a second run beside it), so
it needs no fewer. Whether $KVIDXD is an ASan build
(it imports __asan_init, or links libasan) is printed with the rounds
run. Seed: KVIDX_CRASH_SEED, else random; printed. The Redis part is
skipped (said in the output) when redis-server is not installed. At the end
the figures are printed: rounds, acknowledged writes checked by kind,
in-flight writes seen applied / not applied, duplicates on replay, torn
tails.
"""

import os
import random
import re
import shutil
import signal
import subprocess
import struct
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Conn, Daemon, build_request, kvidxd_path  # noqa: E402
from lmcache_emitter import Emitter, post_json  # noqa: E402
from redis_helper import (RedisServer, have_redis, keyspace, lmc_key,  # noqa: E402
                          wait_until)

API_MODEL = "crash"
FS_MODEL = "crashfs"
REDIS_PREFIX = "lmc"
REDIS_MODEL = "m/llama"     # lmc_key's model
DIR_MODEL = "crashdir"
FS_UNIVERSE = 150
REDIS_UNIVERSE = 150
DIR_UNIVERSE = 120
TOK_MODEL = "crashtok"
TOK_BASE = 1 << 32
TOK_UNIVERSE = 40
TOK_STREAM = "mp-a"         # the one stream that names the TOK_MODEL keys
API_LIVE_MAX = 400          # a key writer deletes more once it holds this many
LOAD_MAX_S = 0.300
ROUNDS = 50                 # in the ASan build too: see the docstring


def is_asan(path):
    for cmd in (["nm", "-D", path], ["ldd", path]):
        try:
            out = subprocess.run(cmd, capture_output=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        if b"__asan_init" in out or b"libasan" in out:
            return True
    return False


SEED = int(os.environ.get("KVIDX_CRASH_SEED", "0")) or random.randrange(1, 1 << 30)
print("test_crash_consistency: seed %d (KVIDX_CRASH_SEED)" % SEED, file=sys.stderr)


# -- keys ------------------------------------------------------------------
def key(model, i, rank=0, group=0):
    return {"model_name": model, "kv_rank": rank, "object_group_id": group,
            "chunk_hash_hex": "%016x" % i, "cache_salt": ""}


def canon(k):
    s = "%s@%08x@%x@%s" % (k["model_name"], k["kv_rank"], k["object_group_id"],
                           k["chunk_hash_hex"].lower())
    return s + ("@" + k["cache_salt"] if k.get("cache_salt") else "")


def fs_name(i):
    return "%s@0x%08x@0@%016x.data" % (FS_MODEL, 0, i)


class Unsent(Exception):
    """The connection was refused: the request never reached the daemon."""


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.c = {}

    def add(self, name, n=1):
        with self.lock:
            self.c[name] = self.c.get(name, 0) + n

    def get(self, name):
        return self.c.get(name, 0)


# -- the writers -----------------------------------------------------------
class KeyWriter:
    """PUTs and DELETEs of its own keys; the reference of its keys. With
    pipeline, several requests go out at once on one keep-alive connection
    (one fsync may then cover several of them)."""

    def __init__(self, t, n, pipeline=False):
        self.t = t
        self.base = (n + 1) << 40
        self.counter = 0
        self.pipeline = pipeline
        self.present = {}     # canon -> (key, size): acknowledged, stored
        self.inflight = []    # [("put" | "del", [(canon, key, size)], single)], sent order

    def new_key(self):
        self.counter += 1
        return key(API_MODEL, self.base + self.counter, rank=self.counter % 3)

    def request(self, rng, taken):
        """One request: (method, path, body, kind, group, single)."""
        op = rng.random()
        free = sorted(set(self.present) - taken)
        many = len(self.present) > API_LIVE_MAX
        if free and (op < 0.25 or many):
            victims = rng.sample(free, min(len(free), rng.randint(1, 20)))
            group = [(c,) + self.present[c] for c in victims]
            if len(group) == 1 and rng.random() < 0.5:
                return ("DELETE", "/v1/keys/" + urllib.parse.quote(group[0][0], safe="@"),
                        None, "del", group, True)
            return "DELETE", "/v1/keys", {"keys": [g[1] for g in group]}, "del", group, False
        if op < 0.45:
            k = self.new_key()
            size = rng.randint(1, 1 << 20)
            return ("PUT", "/v1/keys/" + urllib.parse.quote(canon(k), safe="@"),
                    {"size_bytes": size, "tier": rng.choice(["l1", "l2"])}, "put",
                    [(canon(k), k, size)], True)
        group = []
        for _ in range(rng.randint(2, 40)):
            k = self.new_key()
            group.append((canon(k), k, rng.randint(1, 1 << 30)))
        return ("PUT", "/v1/keys", {"tier": rng.choice(["l1", "l2"]),
                                    "entries": [{"key": k, "size_bytes": sz}
                                                for _, k, sz in group]},
                "put", group, False)

    def answered(self, r):
        kind, group, single = self.inflight.pop(0)
        if kind == "del":
            if single:
                self.t.assertEqual(r.status, 204, r)
            else:
                self.t.assertEqual(r.status, 200, r)
                self.t.assertEqual(r.json()["deleted"], len(group), r)
            for c, _, _ in group:
                del self.present[c]
            self.t.stats.add("ack_delete_single" if single else "ack_delete_batch")
            self.t.stats.add("ack_deleted_keys", len(group))
        else:
            self.t.assertIn(r.status, (200, 201) if single else (200,), r)
            for c, k, sz in group:
                self.present[c] = (k, sz)
            if single:
                self.t.stats.add("ack_put_single")
            else:
                self.t.stats.add("ack_put_batch")
                self.t.stats.add("ack_put_keys", len(group))
        if self.pipeline:
            self.t.stats.add("ack_pipelined")

    def step(self, d, rng):
        if not self.pipeline:
            method, path, body, kind, group, single = self.request(rng, set())
            self.inflight.append((kind, group, single))
            try:
                r = d.request(method, path, body, timeout=10)
            except ConnectionRefusedError:
                self.inflight = []
                raise Unsent()
            self.answered(r)
            return
        try:
            conn = Conn(d, timeout=10)
        except ConnectionRefusedError:
            raise Unsent()
        try:
            taken = set()
            data = b""
            for _ in range(rng.randint(2, 6)):
                method, path, body, kind, group, single = self.request(rng, taken)
                taken.update(c for c, _, _ in group)
                self.inflight.append((kind, group, single))
                data += build_request(method, path, body)
            conn.send(data)
            while self.inflight:
                self.answered(conn.read_response())
        finally:
            conn.close()

    def resolve(self, listed, real_torn):
        """After a restart: each write in flight at the kill is found whole
        or not at all, and (one connection, handled in order) those applied
        come before those not; the reference takes what was found. A real
        torn tail (real_torn) changes nothing: the journal frames each
        request's records, so a request cut short is dropped whole."""
        seen_unapplied = False
        for kind, group, _ in self.inflight:
            found = sum(1 for c, _, sz in group if listed.get(c) == sz)
            gone = sum(1 for c, _, _ in group if c not in listed)
            done = found if kind == "put" else gone
            self.t.assertIn(done, (0, len(group)),
                            "a %s batch in flight came back in part: %d of %d keys%s"
                            % (kind.upper(), done, len(group),
                               " (after a torn tail the kill left)" if real_torn else ""))
            for c, k, sz in group:
                if kind == "put" and listed.get(c) == sz:
                    self.present[c] = (k, sz)
                elif kind == "del" and c not in listed:
                    del self.present[c]
            applied = done > 0
            self.t.assertFalse(applied and seen_unapplied,
                               "a pipelined request in flight was applied after one that was not")
            seen_unapplied = seen_unapplied or not applied
            self.t.stats.add("inflight_keys_applied" if applied else "inflight_keys_not_applied")
        self.inflight = []


class Stream:
    """One emitter (replaced by one with the next incarnation when the
    server it stands for restarts) and the reference of its cursor."""

    def __init__(self, name, incarnation):
        self.name = name
        self.e = Emitter("127.0.0.1", 0, name, incarnation=incarnation)
        self.inc = None           # the cursor's incarnation (None: no cursor)
        self.acked_seq = 0
        self.applied = 0
        self.duplicates = 0
        self.stale = 0
        self.gap = False
        self.unsent = False       # the request in flight never reached the daemon
        self.last_acked = None    # the last acknowledged request body
        self.inflight = None      # ("events", body) or ("stale", body)


class EventWriter:
    """Posts the batches of its streams; applies acknowledged ones to the
    shared directory reference."""

    def __init__(self, t, streams, skipper=None, skip_round=None):
        self.t = t
        self.streams = streams
        self.skipper = skipper
        self.skip_round = skip_round
        self.skipped = False

    def step(self, d, rng, rnd):
        s = rng.choice(self.streams)
        s.e.host, s.e.port = d.addr
        if s.inc is not None and rng.random() < 0.05:
            body = {"batches": [{"instance_id": s.name, "incarnation": s.inc - 1,
                                 "seq": 1, "event_type": "store", "tier": "l1",
                                 "backend": "dram", "shared": False, "ts": time.time(),
                                 "entries": [{"key": key(DIR_MODEL, 1), "size_bytes": 1}]}]}
            s.inflight = ("stale", body)
            try:
                st, ans = self.post(d, body)
            except Unsent:
                s.inflight = None
                raise
            self.t.assertEqual((st, ans), (200, {"applied": 0, "duplicates": 0, "stale": 1}))
            s.inflight = None
            s.stale += 1
            self.t.stats.add("ack_events_stale")
            return
        if s is not self.skipper and rng.random() < 0.03:
            # The server behind the stream restarts: a new incarnation, seqs
            # from 1; its first batch fences its L1 placements.
            s.e = Emitter(d.addr[0], d.addr[1], s.name, incarnation=s.e.incarnation + 1)
            self.t.stats.add("emitter_restarts")
        for _ in range(rng.randint(1, 12)):
            i = rng.randrange(DIR_UNIVERSE)
            k = key(DIR_MODEL, i, rank=i % 2)
            tier, backend = rng.choice([("l1", "dram"), ("l2", "fs"), ("l2", "s3")])
            if rng.random() < 0.7:
                s.e.store(tier, backend, k, rng.randint(1, 1 << 24))
            else:
                s.e.delete(tier, backend, k)
        if s.name == TOK_STREAM and rng.random() < 0.3:
            # Keys only this stream names: shared placements (a fleet-wide
            # identity) and token bindings, whose outcome depends on the
            # order of the batches, which only one stream can give.
            for _ in range(rng.randint(1, 4)):
                k = key(TOK_MODEL, TOK_BASE + rng.randrange(TOK_UNIVERSE))
                shared = rng.random() < 0.5
                if rng.random() < 0.7:
                    toks = [rng.randrange(1 << 32) for _ in range(rng.randint(0, 300))]
                    s.e.store("l2", "nfs", k, rng.randint(1, 1 << 20), token_ids=toks,
                              shared=shared)
                else:
                    s.e.delete("l2", "nfs", k, shared=shared)
        if (s is self.skipper and not self.skipped and rnd >= self.skip_round):
            self.skipped = True
            lost = s.e.skip_flush()
            self.t.stats.add("batches_skipped_on_purpose", len(lost))
            self.t.log_line("round %d: %s skipped seq %d..%d on purpose"
                            % (rnd, s.name, lost[0]["seq"], lost[-1]["seq"]))
            return
        body = {"batches": s.e._take()}
        s.inflight = ("events", body)
        try:
            st, ans = self.post(d, body)
        except Unsent:
            # Never sent; its seqs are stamped, so it is sent after the
            # restart (as a request in flight is), or the test made a gap.
            s.unsent = True
            raise
        n = len(body["batches"])
        self.t.assertEqual((st, ans), (200, {"applied": n, "duplicates": 0, "stale": 0}))
        s.inflight = None
        self.t.admit(s, body["batches"])
        s.last_acked = body
        self.t.stats.add("ack_events_requests")
        self.t.stats.add("ack_events_batches", n)

    @staticmethod
    def post(d, body):
        try:
            return post_json(d.addr[0], d.addr[1], "POST", "/events", body)
        except ConnectionRefusedError:
            raise Unsent()


class Registrar:
    """POST /instances of new ids and again of registered ones (a new port:
    re_registered), DELETE /instances/{id}; the reference of the
    registrations and of the registration_time each was first seen with."""

    def __init__(self, t):
        self.t = t
        self.n = 0
        self.registered = {}   # id -> http_port
        self.seen_time = {}    # id -> registration_time listed since its last change
        self.inflight = None   # (kind, id, new port or None, old port or None)

    def step(self, d, rng):
        op = rng.random()
        if self.registered and op < 0.25:
            iid = rng.choice(sorted(self.registered))
            self.inflight = ("dereg", iid, None, self.registered[iid])
            self.seen_time.pop(iid, None)
            st = self.call(d, "DELETE", "/instances/" + iid, None)[0]
            self.t.assertEqual(st, 204)
            self.inflight = None
            del self.registered[iid]
            self.t.stats.add("ack_deregistrations")
            return
        if self.registered and op < 0.45:
            iid = rng.choice(sorted(self.registered))
            old = self.registered[iid]
        else:
            self.n += 1
            iid, old = "reg-%d" % self.n, None
        port = rng.randrange(1024, 65536)
        self.inflight = ("reg", iid, port, old)
        self.seen_time.pop(iid, None)
        st, ans = self.call(d, "POST", "/instances", {
            "instance_id": iid, "ip": "127.0.0.1", "http_port": port,
            "metadata": {"port": str(port)}})
        self.t.assertEqual((st, ans), (200, {"instance_id": iid,
                                             "re_registered": old is not None}))
        self.inflight = None
        self.registered[iid] = port
        self.t.stats.add("ack_reregistrations" if old is not None else "ack_registrations")

    @staticmethod
    def call(d, method, path, body):
        try:
            return post_json(d.addr[0], d.addr[1], method, path, body)
        except ConnectionRefusedError:
            raise Unsent()

    def resolve(self, listed):
        """listed: id -> (ip, port, metadata, registration_time)."""
        if self.inflight is None:
            return
        kind, iid, new, old = self.inflight
        self.inflight = None
        got = listed[iid][1] if iid in listed else None
        self.t.assertIn(got, (new, old), "registration of %s in flight: port %s" % (iid, got))
        if got is None:
            self.registered.pop(iid, None)
        else:
            self.registered[iid] = got
        self.t.stats.add("inflight_instances_applied" if got == new
                         else "inflight_instances_not_applied")

    def check(self, rnd, listed, streams):
        want = {iid: ("127.0.0.1", p, {"port": str(p)}) for iid, p in self.registered.items()}
        want.update({s: ("127.0.0.1", 8080, {}) for s in streams})
        self.t.assertEqual({i: v[:3] for i, v in listed.items()}, want,
                           "round %d: registrations" % rnd)
        for iid, v in listed.items():
            t = self.seen_time.setdefault(iid, v[3])
            self.t.assertEqual(v[3], t, "round %d: %s's registration_time changed" % (rnd, iid))


class FsWriter:
    def __init__(self, path):
        self.path = path
        self.disk = {}   # i -> size

    def step(self, rng):
        op = rng.random()
        if self.disk and op < 0.2:
            i = rng.choice(sorted(self.disk))
            os.unlink(os.path.join(self.path, fs_name(i)))
            del self.disk[i]
        elif self.disk and op < 0.35:
            i = rng.choice(sorted(self.disk))
            j = rng.randrange(FS_UNIVERSE)
            if j not in self.disk:
                os.rename(os.path.join(self.path, fs_name(i)), os.path.join(self.path, fs_name(j)))
                self.disk[j] = self.disk.pop(i)
        else:
            i = rng.randrange(FS_UNIVERSE)
            size = rng.randint(1, 2048)
            final = os.path.join(self.path, fs_name(i))
            tmp = final[:-len(".data")] + ".tmp"
            with open(tmp, "wb") as f:
                f.write(b"\0" * size)
            os.replace(tmp, final)
            self.disk[i] = size

    def expected(self):
        return {canon(key(FS_MODEL, i)): s for i, s in self.disk.items()}


class RedisWriter:
    def __init__(self, server):
        self.c = server.client()

    def step(self, rng):
        i = rng.randrange(REDIS_UNIVERSE)
        if rng.random() < 0.3:
            self.c.cmd("DEL", lmc_key(i, REDIS_PREFIX))
        else:
            self.c.cmd("SET", lmc_key(i, REDIS_PREFIX), b"r" * rng.randint(1, 3000))

    def expected(self):
        return keyspace(self.c, REDIS_PREFIX)


# -- the test --------------------------------------------------------------
class CrashConsistency(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kvidx-crash-")
        self.data_dir = os.path.join(self.tmp, "data")
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.fs_dir = tempfile.mkdtemp(prefix="kvidx-crash-fs-", dir=base)
        self.d = None
        self.redis = None
        self.stats = Stats()
        self.dir_ref = {}     # canon -> {(instance, tier, backend): size}
        self.dir_tokens = {}  # canon -> number of token ids bound to its chunk hash
        self.dir_lock = threading.Lock()
        self.lines = []
        self.made_tear = None    # (journal, offset) of the tail the test tore
        self.real_torn = False   # this restart found a tail the kill tore

    def tearDown(self):
        if self.d is not None:
            self.d.kill()
            shutil.rmtree(self.d.tmp, ignore_errors=True)
        if self.redis is not None:
            self.redis.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)
        shutil.rmtree(self.fs_dir, ignore_errors=True)

    def log_line(self, s):
        self.lines.append(s)
        print("test_crash_consistency: " + s, file=sys.stderr)

    # -- the directory reference ------------------------------------------
    def admit(self, s, batches):
        """The gate on the reference: batches of s admitted, in order."""
        for b in batches:
            if s.inc is None or b["incarnation"] > s.inc:
                if s.inc is not None:
                    self.fence(s.name)
                s.inc, s.acked_seq = b["incarnation"], 0
                s.applied = s.duplicates = s.stale = 0
                s.gap = False
            self.assertEqual(b["incarnation"], s.inc)
            self.assertGreater(b["seq"], s.acked_seq)
            if b["seq"] > s.acked_seq + 1:
                s.gap = True
            s.acked_seq = b["seq"]
            s.applied += 1
            self.dir_apply([b])

    def check_cursor(self, rnd, s, c, when):
        """The daemon's cursor c of stream s equals the reference: no
        spurious gap, nothing counted twice."""
        if s.inc is None:
            self.assertIsNone(c, "round %d: %s has a cursor %s: %s" % (rnd, s.name, when, c))
            return
        self.assertIsNotNone(c, "round %d: the cursor of %s is gone %s" % (rnd, s.name, when))
        got = (c["incarnation"], c["last_seq"], c["gap_detected"], c["applied"],
               c["duplicates"], c["stale"])
        want = (s.inc, s.acked_seq, s.gap, s.applied, s.duplicates, s.stale)
        self.assertEqual(got, want, "round %d: %s's cursor %s (incarnation, last_seq, gap, "
                         "applied, duplicates, stale)" % (rnd, s.name, when))

    def fence(self, inst):
        """A new incarnation of inst: the L1 placements it reported go."""
        with self.dir_lock:
            for c in list(self.dir_ref):
                pl = self.dir_ref[c]
                for ident in [i for i, (_, rep) in pl.items() if i[1] == "l1" and rep == inst]:
                    del pl[ident]
                if not pl:
                    del self.dir_ref[c]
                    self.dir_tokens.pop(c, None)

    def dir_apply(self, batches):
        """Applies admitted batches to the reference: placements by identity
        ((instance, tier, backend), or (tier, backend) fleet-wide when
        shared, with its last reporter), token bindings by key (each bound
        key has a chunk hash of its own)."""
        with self.dir_lock:
            for b in batches:
                shared = b.get("shared", False)
                ident = ("*" if shared else b["instance_id"], b["tier"], b["backend"], shared)
                for e in b["entries"]:
                    c = canon(e["key"])
                    if b["event_type"] == "store":
                        self.dir_ref.setdefault(c, {})[ident] = (e["size_bytes"],
                                                                 b["instance_id"])
                        if e.get("token_ids"):
                            self.dir_tokens[c] = len(e["token_ids"])
                    elif b["event_type"] == "delete" and c in self.dir_ref:
                        self.dir_ref[c].pop(ident, None)
                        if not self.dir_ref[c]:
                            del self.dir_ref[c]
                            self.dir_tokens.pop(c, None)

    def dir_state(self, d):
        st, ans = post_json(d.addr[0], d.addr[1], "GET", "/directory/keys?limit=10000", None)
        self.assertEqual(st, 200, ans)
        out = {}
        for row in ans["keys"]:
            c = canon(row["key"])
            self.assertNotIn(c, out, "a directory key listed twice")
            pl = {}
            for p in row["placements"]:
                ident = ("*" if p["shared"] else p["instance_id"], p["tier"], p["backend"],
                         p["shared"])
                self.assertNotIn(ident, pl, "placement doubled on %s: %s" % (c, row))
                pl[ident] = (p["size_bytes"], p["instance_id"])
            self.assertEqual(row["num_tokens"], self.dir_tokens.get(c, 0),
                             "tokens bound to %s (%s)" % (c, row))
            out[c] = pl
        self.assertEqual(ans["total"], len(out))
        return out

    def check_dir(self, rnd, when):
        got = self.dir_state(self.d)
        with self.dir_lock:
            want = {c: dict(p) for c, p in self.dir_ref.items()}
        if got != want:
            diff = [(c, want.get(c), got.get(c)) for c in sorted(set(got) | set(want))
                    if want.get(c) != got.get(c)]
            self.fail("round %d: the directory %s differs from the reference in %d keys "
                      "(key, reference, daemon): %s" % (rnd, when, len(diff), diff[:4]))
        return want

    # -- the daemon ---------------------------------------------------------
    def start(self, rnd, rng, torn_made=False):
        settings = {"data_dir": self.data_dir, "fsync": "always",
                    "l2_source": " ".join(self.sources),
                    "l2_source_reconnect_max_ms": 200, "l2_source_rescan_s": 1,
                    "instance_timeout_s": 86400,
                    "snapshot_journal_bytes": "16KiB" if rng.random() < 1 / 3 else "64MiB"}
        self.real_torn = False
        if not torn_made and rnd and rng.random() < 0.15:
            self.kill_in_start(settings, rng, rnd)
        js = sorted(n for n in os.listdir(self.data_dir) if n.endswith(".kvj")) \
            if os.path.isdir(self.data_dir) else []
        newest = os.path.join(self.data_dir, js[-1]) if js else None
        t0 = time.monotonic()
        self.d = Daemon(settings=settings, start_timeout=60)
        wait_until(lambda: self.d.request("GET", "/readyz").status == 200, 30,
                   "/readyz 200 after restart %d" % rnd)
        self.startup_s += time.monotonic() - t0
        torn = self.check_log(self.d.log(), newest, rnd)
        if torn_made:
            self.assertEqual(torn, 1, "round %d: the torn tail made is not logged:\n%s"
                             % (rnd, self.d.log()))
        self.made_tear = None

    def kill_in_start(self, settings, rng, rnd):
        """A kill -9 a few ms after the start, mostly during the restore
        (replay, truncation of a torn tail, the new journal, deletion of
        covered ones): the next start must find the same."""
        js = sorted(n for n in os.listdir(self.data_dir) if n.endswith(".kvj"))
        newest = os.path.join(self.data_dir, js[-1]) if js else None
        probe = Daemon(settings=settings, start=False)
        try:
            with open(probe.log_path, "wb") as logf:
                proc = subprocess.Popen(probe.command(), stdin=subprocess.DEVNULL,
                                        stdout=logf, stderr=logf, env=probe.env)
                time.sleep(rng.uniform(0, 0.03))
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
            self.check_log(probe.log(), newest, rnd)
            self.stats.add("kills_during_start")
        finally:
            shutil.rmtree(probe.tmp, ignore_errors=True)

    def check_log(self, log, newest, rnd):
        """No damage at restore but a torn tail of the newest journal;
        returns the number of torn tails logged."""
        torn = 0
        for line in log.splitlines():
            m = re.match(r"\S+ (warn|error) (.*)", line)
            if not m:
                continue
            msg = m.group(2)
            t = re.match(r"journal (\S+): torn or corrupt record at byte (\d+) of (\d+);", msg)
            if t:
                self.assertEqual(t.group(1), newest,
                                 "round %d: damage in a journal that is not the newest:\n%s"
                                 % (rnd, log))
                self.stats.add("torn_tails")
                torn += 1
                made = self.made_tear == (t.group(1), int(t.group(2)))
                if not made:
                    # Where the test appended, unless the crash itself
                    # left the last record torn.
                    self.real_torn = True
                    self.stats.add("torn_tails_real")
                self.log_line("round %d: torn tail, %d of %d bytes kept%s"
                              % (rnd, int(t.group(2)), int(t.group(3)),
                                 " (made by the test)" if made else " (left by the kill)"))
                continue
            if "a fleet event batch at the end of a journal was incomplete" in msg:
                self.stats.add("torn_fleet_batches_dropped")
                continue
            if msg.startswith("l2_source ") or any(msg.startswith(n + ":")
                                                    for n in self.sources):
                continue  # a source's news (reconnects and the like), not the journal's
            self.fail("round %d: the restart logs: %s\nlog:\n%s" % (rnd, line, log))
        return torn

    def kill9(self):
        self.d.proc.send_signal(signal.SIGKILL)
        self.d.proc.wait(10)
        self.d.kill()
        log = self.d.log()
        self.stats.add("snapshots_started", len(re.findall(r"snapshot: writing generation", log)))
        self.stats.add("snapshots_written", len(re.findall(r"snapshot: generation \d+ written",
                                                           log)))
        shutil.rmtree(self.d.tmp, ignore_errors=True)

    def tear_tail(self, rng):
        """Appends the start of a record that was never written whole (a
        length, a checksum and part of the payload) to the newest journal,
        as a write cut short by the crash leaves it."""
        # Only a journal the snapshot does not cover is replayed (the
        # snapshot may already cover the newest: its child can finish
        # before the writer has created the journal it rotates to).
        covered = 0
        try:
            with open(os.path.join(self.data_dir, "snapshot.kvs"), "rb") as f:
                covered = struct.unpack("<Q", f.read(24)[16:24])[0]
        except (OSError, struct.error):
            pass
        js = sorted(n for n in os.listdir(self.data_dir)
                    if re.match(r"^journal-[0-9a-f]{16}\.kvj$", n) and int(n[8:24], 16) >= covered)
        if not js:
            return False
        path = os.path.join(self.data_dir, js[-1])
        self.made_tear = (path, os.path.getsize(path))
        with open(path, "ab") as f:
            f.write(struct.pack("<II", 82, rng.getrandbits(32)) +
                    bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40))))
        self.stats.add("torn_tails_made")
        return True

    def listing(self):
        """{canon: size} of a full /v1/keys listing, no key twice."""
        out, tok = {}, None
        while True:
            q = {"page_size": 5000}
            if tok:
                q["page_token"] = tok
            r = self.d.request("GET", "/v1/keys?" + urllib.parse.urlencode(q), timeout=30)
            self.assertEqual(r.status, 200, r)
            j = r.json()
            for e in j["entries"]:
                c = canon(e["key"])
                self.assertNotIn(c, out, "listed twice")
                out[c] = e["size_bytes"]
            tok = j["next_page_token"]
            if tok is None:
                return out

    @staticmethod
    def part(listed, model):
        return {c: s for c, s in listed.items() if c.startswith(model + "@")}

    # -- the checks after a restart -----------------------------------------
    def check_restart(self, rnd):
        d = self.d
        listed = self.listing()
        api = self.part(listed, API_MODEL)
        for w in self.key_writers:
            w.resolve(api, self.real_torn)
        want = {}
        for w in self.key_writers:
            want.update({c: s for c, (_, s) in w.present.items()})
        missing = sorted(set(want) - set(api))
        extra = sorted(set(api) - set(want))
        wrong = sorted(c for c in set(want) & set(api) if want[c] != api[c])
        self.assertEqual((missing[:5], extra[:5], wrong[:5]), ([], [], []),
                         "round %d: keys: %d missing, %d extra, %d of another size"
                         % (rnd, len(missing), len(extra), len(wrong)))
        self.stats.add("checked_keys", len(want))

        # Cursors and directory before any replay: what the journal kept.
        st, ans = post_json(d.addr[0], d.addr[1], "GET", "/directory/streams", None)
        self.assertEqual(st, 200)
        cursors = {c["instance_id"]: c for c in ans["streams"]}
        self.assertFalse(set(cursors) - {s.name for s in self.streams}, cursors)
        replays = []
        for s in self.streams:
            c = cursors.get(s.name)
            pending = s.inflight
            unsent, s.inflight, s.unsent = s.unsent, None, False
            cur = (c["incarnation"], c["last_seq"]) if c else None
            ref = (s.inc, s.acked_seq) if s.inc is not None else None
            if pending and pending[0] == "events":
                body = pending[1]
                pos = [(b["incarnation"], b["seq"]) for b in body["batches"]]
                self.assertIn(cur, [ref] + pos,
                              "round %d: %s resumes at (incarnation, seq) %s: neither the last "
                              "acknowledged %s nor one in flight %s" % (rnd, s.name, cur, ref,
                                                                       pos))
                durable = sum(1 for q in pos if cur is not None and q <= cur)
                if unsent:
                    self.assertEqual(durable, 0, "a request never sent was applied")
                else:
                    self.stats.add("inflight_events_applied" if durable
                                   else "inflight_events_not_applied")
                if 0 < durable < len(pos):
                    self.stats.add("inflight_events_partly_applied")
                self.admit(s, body["batches"][:durable])
                replays.append((s, body, durable))
            elif pending:  # a stale batch in flight: counted or not
                stale_durable = c["stale"] - s.stale
                self.assertIn(stale_durable, (0, 1), c)
                self.stats.add("inflight_events_applied" if stale_durable
                               else "inflight_events_not_applied")
                s.stale += stale_durable
            self.check_cursor(rnd, s, c, "after the restart")
        # Every batch the cursors say is durable is applied whole, the others
        # not at all.
        self.check_dir(rnd, "before the replays")

        # The emitters replay: what was in flight, then the last acknowledged.
        for s, body, durable in replays:
            n = len(body["batches"])
            st, rep = post_json(d.addr[0], d.addr[1], "POST", "/events", body)
            self.assertEqual((st, rep), (200, {"applied": n - durable, "duplicates": durable,
                                                "stale": 0}),
                             "round %d: %s replay of the request in flight" % (rnd, s.name))
            self.stats.add("replay_duplicates", durable)
            s.duplicates += durable
            self.admit(s, body["batches"][durable:])
            s.last_acked = body
        for s in self.streams:
            if s.last_acked is not None:
                body = s.last_acked
                n = len(body["batches"])
                st, rep = post_json(d.addr[0], d.addr[1], "POST", "/events", body)
                self.assertEqual((st, rep), (200, {"applied": 0, "duplicates": n, "stale": 0}),
                                 "round %d: %s replay of its last acknowledged request"
                                 % (rnd, s.name))
                s.duplicates += n
                self.stats.add("replay_duplicates", n)
        want_dir = self.check_dir(rnd, "after the replays")
        st, dstats = post_json(d.addr[0], d.addr[1], "GET", "/directory/stats", None)
        self.assertEqual(dstats["num_keys"], len(want_dir))
        self.assertEqual(dstats["num_placements"], sum(len(p) for p in want_dir.values()))
        self.stats.add("checked_dir_keys", len(want_dir))
        st, ans = post_json(d.addr[0], d.addr[1], "GET", "/directory/streams", None)
        cursors = {c["instance_id"]: c for c in ans["streams"]}
        for s in self.streams:
            self.check_cursor(rnd, s, cursors.get(s.name), "after the replays")
            self.stats.add("checked_cursors")

        # Registrations.
        st, ans = post_json(d.addr[0], d.addr[1], "GET", "/instances", None)
        self.assertEqual(st, 200)
        listed_inst = {i["instance_id"]: (i["ip"], i["http_port"], i["metadata"],
                                          i["registration_time"]) for i in ans["instances"]}
        self.assertEqual(len(listed_inst), len(ans["instances"]), "an instance listed twice")
        self.registrar.resolve(listed_inst)
        self.registrar.check(rnd, listed_inst, [s.name for s in self.streams])
        self.stats.add("checked_registrations", len(listed_inst))

        # Counts.
        r = self.d.request("GET", "/v1/stats")
        self.assertEqual(r.json()["keys"]["total"], len(listed))

        # The sources converge to their stores (the writers are stopped).
        self.converge(rnd)

    def converge(self, rnd):
        last = {}

        def same():
            listed = self.listing()
            ok = True
            got = self.part(listed, FS_MODEL)
            want = self.fs.expected()
            last["fs"] = (want, got)
            ok = got == want
            if self.rw:
                got_r = self.part(listed, REDIS_MODEL)
                want_r = self.rw.expected()
                last["redis"] = (want_r, got_r)
                ok = ok and got_r == want_r
            return ok
        try:
            wait_until(same, 15, "the sources to converge", interval=0.05)
        except AssertionError:
            msgs = []
            for name, (want, got) in last.items():
                msgs.append("%s: %d listed, %d in the store; missing %s extra %s" % (
                    name, len(got), len(want), sorted(set(want) - set(got))[:3],
                    sorted(set(got) - set(want))[:3]))
            self.fail("round %d: %s\n%s" % (rnd, "; ".join(msgs), self.d.log()[-3000:]))
        self.stats.add("checked_fs_keys", len(self.fs.disk))
        if self.rw:
            self.stats.add("checked_redis_keys", len(last["redis"][0]))

    # -- one round of load ----------------------------------------------------
    def load(self, rnd, rng):
        stop = threading.Event()
        killed = threading.Event()
        failures = []
        d = self.d

        def run(name, fn, seed):
            r = random.Random(seed)
            try:
                while not stop.is_set():
                    try:
                        fn(r)
                    except Unsent:
                        return
            except Exception as e:
                # After the kill, a request cut off is in flight; before it,
                # any error is a failure.
                if not killed.is_set() or isinstance(e, AssertionError):
                    failures.append("%s: %r" % (name, e))

        def keys(w):
            return lambda r: w.step(d, r)

        def events(w):
            return lambda r: w.step(d, r, rnd)

        def unsent_reg(r):
            try:
                self.registrar.step(d, r)
            except Unsent:
                self.registrar.inflight = None
                raise

        threads = []
        jobs = [("keys-%d" % i, keys(w)) for i, w in enumerate(self.key_writers)]
        jobs += [("events-%d" % i, events(w)) for i, w in enumerate(self.event_writers)]
        jobs += [("instances", unsent_reg), ("fs", self.fs_step)]
        if self.rw:
            jobs.append(("redis", self.redis_step))
        for name, fn in jobs:
            t = threading.Thread(target=run, args=(name, fn, rng.random()), daemon=True)
            t.start()
            threads.append(t)
        delay = rng.uniform(0, LOAD_MAX_S)
        time.sleep(delay)
        killed.set()
        self.kill9()
        stop.set()
        for t in threads:
            t.join(20)
            self.assertFalse(t.is_alive(), "a writer is stuck")
        self.assertEqual(failures, [], "round %d" % rnd)
        return delay

    def fs_step(self, r):
        self.fs.step(r)
        time.sleep(0.002)

    def redis_step(self, r):
        self.rw.step(r)
        time.sleep(0.001)

    # -- the whole run ------------------------------------------------------------
    def test_kill9_during_load(self):
        asan = is_asan(kvidxd_path())
        rounds = int(os.environ.get("KVIDX_CRASH_ROUNDS", "0")) or ROUNDS
        rng = random.Random(SEED)
        self.log_line("%d rounds%s, seed %d" % (rounds, " (ASan build)" if asan else "", SEED))
        self.sources = ["fs:" + self.fs_dir]
        self.rw = None
        if have_redis():
            self.redis = RedisServer(args=("--notify-keyspace-events", "AKE"))
            self.sources.append("redis://127.0.0.1:%d/0?prefix=%s"
                                % (self.redis.port, REDIS_PREFIX))
            self.rw = RedisWriter(self.redis)
        else:
            self.log_line("redis-server not installed: the Redis source part is skipped")
        self.fs = FsWriter(self.fs_dir)
        self.key_writers = [KeyWriter(self, 0), KeyWriter(self, 1),
                            KeyWriter(self, 2, pipeline=True)]
        self.streams = [Stream("mp-a", 1000), Stream("mp-b", 2000), Stream("mp-c", 3000),
                        Stream("mp-gap", 4000)]
        self.stream_by_name = {s.name: s for s in self.streams}
        self.event_writers = [EventWriter(self, self.streams[:2]),
                              EventWriter(self, self.streams[2:], skipper=self.streams[3],
                                          skip_round=rng.randrange(1, max(2, rounds // 2)))]
        self.registrar = Registrar(self)
        self.startup_s = 0.0
        t_start = time.monotonic()
        delays = []
        torn_made = False
        for rnd in range(rounds + 1):
            self.start(rnd, rng, torn_made)
            if rnd == 0:
                for s in self.streams:
                    s.e.host, s.e.port = self.d.addr
                    self.assertEqual(s.e.register()[0], 200)
            self.check_restart(rnd)
            if rnd == rounds:
                break
            delays.append(self.load(rnd, rng))
            torn_made = rng.random() < 0.1 and self.tear_tail(rng)
            # The stores change while the daemon is down, too.
            for _ in range(rng.randint(0, 5)):
                self.fs.step(rng)
                if self.rw:
                    self.rw.step(rng)
        self.assertEqual(self.d.stop(), 0, self.d.log()[-3000:])
        elapsed = time.monotonic() - t_start
        c = self.stats.get
        acked = {k[4:]: v for k, v in sorted(self.stats.c.items()) if k.startswith("ack_")}
        self.log_line("figures: %d rounds in %.1f s (starts to ready %.1f s, load %.1f s, "
                      "mean kill point %.0f ms)"
                      % (rounds, elapsed, self.startup_s, sum(delays),
                         1000 * sum(delays) / max(1, len(delays))))
        self.log_line("acknowledged writes checked by kind: %s" % acked)
        self.log_line("checked after each restart (sums): keys %d, directory keys %d, "
                      "cursors %d, registrations %d, fs keys %d, redis keys %d"
                      % (c("checked_keys"), c("checked_dir_keys"), c("checked_cursors"),
                         c("checked_registrations"), c("checked_fs_keys"),
                         c("checked_redis_keys")))
        self.log_line("in flight at the kill, applied / not applied: keys %d / %d, events %d / "
                      "%d (partly: %d), instances %d / %d"
                      % (c("inflight_keys_applied"), c("inflight_keys_not_applied"),
                         c("inflight_events_applied"), c("inflight_events_not_applied"),
                         c("inflight_events_partly_applied"),
                         c("inflight_instances_applied"), c("inflight_instances_not_applied")))
        self.log_line("torn tails the kill itself left: %d" % c("torn_tails_real"))
        self.log_line("duplicates on replay %d; torn tails %d (%d of them made by the test; "
                      "fleet batches dropped with them %d); batches skipped on purpose %d; "
                      "snapshots started %d, written %d; emitter restarts (new incarnations) %d"
                      % (c("replay_duplicates"), c("torn_tails"), c("torn_tails_made"),
                         c("torn_fleet_batches_dropped"), c("batches_skipped_on_purpose"),
                         c("snapshots_started"), c("snapshots_written"),
                         c("emitter_restarts")))
        self.log_line("kills a few ms into a start (mostly during the restore) %d"
                      % c("kills_during_start"))
        self.assertGreater(c("ack_put_batch") + c("ack_put_single"), 0)
        self.assertGreater(c("ack_events_requests"), 0)


class TornFleetBatch(unittest.TestCase):
    """A store batch big enough for several journal records (its token ids
    pass the 1 MiB a record holds), torn inside its last record as a write
    cut short by a crash leaves it: the restart logs the torn tail (cut at
    the request's BEGIN: its frame never got its COMMIT), applies none of
    its entries and leaves the cursor at the batch before; the emitter's replay applies it once, and it stays
    applied once over the next kill -9 and restarts."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvidx-crash-torn-")
        self.d = None

    def tearDown(self):
        if self.d is not None:
            self.d.kill()
            shutil.rmtree(self.d.tmp, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self):
        self.d = Daemon(settings={"data_dir": self.dir, "fsync": "always"}, start_timeout=60)
        return self.d

    def kill9(self):
        self.d.proc.send_signal(signal.SIGKILL)
        self.d.proc.wait(10)
        self.d.kill()
        shutil.rmtree(self.d.tmp, ignore_errors=True)

    def stop(self):
        self.assertEqual(self.d.stop(), 0, self.d.log()[-3000:])
        self.d.kill()
        shutil.rmtree(self.d.tmp, ignore_errors=True)

    def journal(self):
        js = sorted(n for n in os.listdir(self.dir) if re.match(r"^journal-[0-9a-f]{16}\.kvj$", n))
        return os.path.join(self.dir, js[-1])

    def state(self):
        d = self.d
        keys = post_json(d.addr[0], d.addr[1], "GET", "/directory/keys?limit=10000", None)[1]
        streams = post_json(d.addr[0], d.addr[1], "GET", "/directory/streams", None)[1]
        rows = {canon(r["key"]): (r["num_tokens"], sorted((p["instance_id"], p["tier"],
                                                            p["backend"], p["size_bytes"])
                                                           for p in r["placements"]))
                for r in keys["keys"]}
        c = streams["streams"][0]
        return rows, (c["incarnation"], c["last_seq"], c["gap_detected"], c["applied"])

    def test_torn_inside_a_batch_of_several_records(self):
        d = self.start()
        e = Emitter(d.addr[0], d.addr[1], "mp-torn", incarnation=7)
        e.store("l1", "dram", key(DIR_MODEL, 1), 10)
        self.assertEqual(e.flush(), (200, {"applied": 1, "duplicates": 0, "stale": 0}))
        before = os.path.getsize(self.journal())
        n = 1500
        for i in range(n):
            e.store("l2", "fs", key(DIR_MODEL, 1000 + i), 20, token_ids=range(256),
                    token_offset=0)
        big = {"batches": e._take()}
        st, ans = post_json(d.addr[0], d.addr[1], "POST", "/events", big, timeout=60)
        self.assertEqual((st, ans), (200, {"applied": 1, "duplicates": 0, "stale": 0}))
        self.kill9()
        path = self.journal()
        with open(path, "rb") as f:
            data = f.read()
        recs, off = [], before
        while off + 8 <= len(data):
            recs.append(off)
            off += 8 + struct.unpack_from("<I", data, off)[0]
        self.assertEqual(off, len(data), "the journal does not end at a record's end")
        kinds = [data[r + 8] for r in recs]
        dirs = [r for r, k in zip(recs, kinds) if k == 6]
        self.assertGreaterEqual(len(dirs), 2, "the batch fits one record: no tear inside it")
        # The request's records are framed: BEGIN (7) first, COMMIT (8) last.
        self.assertEqual((kinds[0], kinds[-1]), (7, 8))
        # Cut inside the batch's last record: as if it had not been written
        # whole, and never acknowledged. The whole request goes, from its
        # BEGIN on.
        with open(path, "r+b") as f:
            f.truncate(dirs[-1] + 8 + 100)
        d = self.start()
        log = d.log()
        self.assertRegex(log, r"torn or corrupt record at byte %d of %d;"
                         % (recs[0], dirs[-1] + 108))
        rows, cursor = self.state()
        self.assertEqual(set(rows), {canon(key(DIR_MODEL, 1))}, "a part of the torn batch stayed")
        self.assertEqual(cursor, (7, 1, False, 1))
        # The emitter sends it again: applied now, once.
        st, ans = post_json(d.addr[0], d.addr[1], "POST", "/events", big, timeout=60)
        self.assertEqual((st, ans), (200, {"applied": 1, "duplicates": 0, "stale": 0}))
        want = self.state()
        self.assertEqual(len(want[0]), n + 1)
        self.assertEqual(want[0][canon(key(DIR_MODEL, 1000))],
                         (256, [("mp-torn", "l2", "fs", 20)]))
        self.assertEqual(want[1], (7, 2, False, 2))
        # Over a kill -9 and a clean restart: the same, the replay a duplicate.
        self.kill9()
        d = self.start()
        self.assertEqual(self.state(), want)
        st, ans = post_json(d.addr[0], d.addr[1], "POST", "/events", big, timeout=60)
        self.assertEqual((st, ans), (200, {"applied": 0, "duplicates": 1, "stale": 0}))
        self.stop()
        d = self.start()
        self.assertEqual(self.state(), want)
        self.stop()


if __name__ == "__main__":
    unittest.main()
