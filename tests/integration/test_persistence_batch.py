"""Batch writes in the journal (docs/persistence.md, "Formats"): the key
states of one request that share a namespace go to the journal as KEYS
records, the namespace written once per record.

What is checked, over a real kvidxd under fsync=always:

* a PUT of 3000 keys over two namespaces is journaled as one KEYS record
  per namespace inside the request's BEGIN/COMMIT frame, in a version 3
  journal, and costs far fewer bytes a key than a record a key would;
  interleaved namespaces, L1 stores and batch deletes (states "gone")
  go the same way; after kill -9 the restart lists exactly the state
  before it (sizes, L1 and L2 presence);
* a batch bigger than one record's payload (1 MiB) is split into several
  KEYS records, none past the bound, their counts adding up to the batch;
  it comes back whole after kill -9, and a journal torn inside its last
  record drops the whole request (every record of it), not a part;
* a KEYS record whose namespace breaks the key rules is skipped with all
  its keys (logged with its offset, counted in /metrics), the records
  around it applied.
"""

import os
import shutil
import struct
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_persistence import (  # noqa: E402
    JOURNAL_RE,
    KVIDX_JOURNAL_HEADER,
    PersistenceBase,
    canon,
    crc32c,
    frame,
    key,
    newest_journal,
)

BEGIN, COMMIT, KEY, KEYS = 7, 8, 1, 9
PAYLOAD_MAX = 1 << 20


def records(data, start=KVIDX_JOURNAL_HEADER):
    """[(offset, type, payload)] of the journal bytes from start on."""
    out, off = [], start
    while off + 8 <= len(data):
        n = struct.unpack_from("<I", data, off)[0]
        out.append((off, data[off + 8], data[off + 8:off + 8 + n]))
        off += 8 + n
    return out, off


def keys_namespace(payload):
    """(model, salt, count) of a KEYS payload."""
    ml, sl, count = payload[1], payload[2], struct.unpack_from("<I", payload, 3)[0]
    return payload[7:7 + ml], payload[7 + ml:7 + ml + sl], count


def keys_record(model, salt, states):
    """A KEYS record of (hash bytes, tiers, size) states, rank and group 0."""
    body = b"".join(struct.pack("<BBHIQ", tiers, len(h), 0, 0, size) + h
                    for h, tiers, size in states)
    return frame(struct.pack("<BBBI", KEYS, len(model), len(salt), len(states)) + model + salt +
                 body)


def journal_v3(gen, recs):
    h = b"KVIDXJNL" + struct.pack("<IIQ", 3, 0, gen)
    return h + struct.pack("<II", crc32c(h), 0) + b"".join(recs)


def key64(i, model, salt=""):
    """A key with a 32-byte hash (64 hex digits)."""
    k = key(i, model, salt=salt)
    k["chunk_hash_hex"] = "%064x" % (i * 0x9E3779B97F4A7C15 + 1)
    return k


class BatchRecords(PersistenceBase):
    base_settings = {"fsync": "always", "snapshot_journal_bytes": "1GiB"}

    def copy_dir(self, dd):
        copy = self.new_dir()
        for name in os.listdir(dd):
            if name != "lock":
                shutil.copy(os.path.join(dd, name), os.path.join(copy, name))
        return copy

    def test_a_batch_over_two_namespaces_survives_kill9(self):
        dd = self.new_dir()
        d = self.start(dd)
        a = [key(i, "batch-a") for i in range(1500)]
        b = [key(i, "batch-b", rank=3, group=1, salt="s1") for i in range(1500)]
        j = newest_journal(dd)
        with open(j, "rb") as f:
            version = struct.unpack_from("<I", f.read(32), 8)[0]
        self.assertEqual(version, 3, "journals are written in version 3")
        start = os.path.getsize(j)
        self.put(d, a + b, sizes=[1 + i for i in range(3000)])
        end = os.path.getsize(j)
        # Interleaved namespaces, L1 copies, and deletes (gone states).
        a2 = [key(2000 + i, "batch-a") for i in range(200)]
        b2 = [key(2000 + i, "batch-b", rank=3, group=1, salt="s1") for i in range(200)]
        self.put(d, [x for pair in zip(a2, b2) for x in pair], tier="l1", size=64)
        self.delete(d, a[1000:1100] + b[1000:1100])
        before = self.state(d)
        self.assertEqual(len(before), 3200)
        self.assertEqual(sum(1 for s in before.values() if s[1]), 400)
        self.kill9(d)

        with open(j, "rb") as f:
            data = f.read()
        recs, stop = records(data, start)
        self.assertEqual(stop, len(data), "the journal does not end at a record's end")
        first = [(t, p) for off, t, p in recs if off < end]
        kinds = [t for t, _ in first]
        self.assertEqual(kinds, [BEGIN, KEYS, KEYS, COMMIT],
                         "a 3000-key PUT over two namespaces is not one KEYS record each")
        self.assertEqual([keys_namespace(p) for _, p in first[1:3]],
                         [(b"batch-a", b"", 1500), (b"batch-b", b"s1", 1500)])
        per_key = (end - start) / 3000.0
        # 16 bytes of state and an 8-byte hash a key, the rest once a record;
        # a KEY record a key took 8 + 19 + 7 + 8 = 42 bytes or more.
        self.assertLess(per_key, 25.0, "%.1f journal bytes a key" % per_key)
        self.assertNotIn(KEY, [t for _, t, _ in recs], "a key change went out as a KEY record")

        d = self.start(dd)
        self.wait_ready(d)
        self.assert_same_state(before, self.state(d), "restart after kill -9")
        self.stop(d)
        # And once more, after a clean stop, the journal replayed again.
        d = self.start(dd)
        self.wait_ready(d)
        self.assert_same_state(before, self.state(d), "second restart")
        self.stop(d)

    def test_a_batch_past_one_record_is_split_and_torn_whole(self):
        dd = self.new_dir()
        d = self.start(dd)
        early = [key64(i, "early") for i in range(10)]
        self.put(d, early)
        j = newest_journal(dd)
        start = os.path.getsize(j)
        n = 30000
        big = [key64(i, "big") for i in range(n)]
        self.put(d, big, size=4096)
        self.kill9(d)

        with open(j, "rb") as f:
            data = f.read()
        recs, stop = records(data, start)
        self.assertEqual(stop, len(data))
        kinds = [t for _, t, _ in recs]
        self.assertEqual(kinds[0], BEGIN)
        self.assertEqual(kinds[-1], COMMIT)
        parts = [(off, p) for off, t, p in recs if t == KEYS]
        self.assertGreaterEqual(len(parts), 2, "30000 states of 48 bytes fit one record")
        self.assertEqual(len(parts), len(recs) - 2)
        counts = []
        for _, p in parts:
            self.assertLessEqual(len(p), PAYLOAD_MAX)
            model, salt, count = keys_namespace(p)
            self.assertEqual((model, salt), (b"big", b""))
            counts.append(count)
        self.assertEqual(sum(counts), n)
        # Every record but the last is filled: no room left for one more state.
        for _, p in parts[:-1]:
            self.assertGreater(len(p) + 48, PAYLOAD_MAX)

        # Torn inside the last of its records: the whole request goes.
        copy = self.copy_dir(dd)
        last = parts[-1][0]
        with open(os.path.join(copy, os.path.basename(j)), "r+b") as f:
            f.truncate(last + 8 + 1000)
        d = self.start(copy)
        self.wait_ready(d)
        self.assertRegex(d.log(), r"torn or corrupt record at byte %d\b" % start)
        self.assert_present(d, early)
        self.assertEqual(self.found(d, big), set(), "part of a torn batch came back")
        self.stop(d)

        # Whole: every key back.
        d = self.start(dd)
        self.wait_ready(d)
        self.assert_present(d, early + big)
        self.assertEqual(self.stats_keys(d)[0]["total"], n + len(early))
        self.stop(d)

    def test_a_keys_record_breaking_the_key_rules_is_skipped_whole(self):
        dd = self.new_dir()
        d = self.start(dd)
        kept = [key(i, "rules") for i in range(5)]
        self.put(d, kept)
        self.stop(d)
        newest = int(JOURNAL_RE.match(os.path.basename(newest_journal(dd))).group(1), 16)

        def h(i):
            return struct.pack(">Q", i)
        good = keys_record(b"rules", b"", [(h(100), 2, 7), (h(0), 0, 0)])  # a store, a delete
        bad = keys_record(b"has@at", b"", [(h(i), 2, 5) for i in range(3)])
        after = keys_record(b"rules", b"", [(h(101), 1, 9)])
        name = "journal-%016x.kvj" % (newest + 1)
        with open(os.path.join(dd, name), "wb") as f:
            f.write(journal_v3(newest + 1, [good, bad, after]))
        d = self.start(dd)
        self.wait_ready(d)
        got = self.list_all(d, page_size=2)
        want = [canon(k) for k in kept[1:]] + [canon(key(100, "rules")), canon(key(101, "rules"))]
        self.assertEqual(sorted(got), sorted(want))
        log = d.log()
        self.assertRegex(log, r"(?i)key rules")
        start = KVIDX_JOURNAL_HEADER + len(good)
        self.assertRegex(log, r"at bytes %d\.\.%d breaks" % (start, start + len(bad)))
        self.assertRegex(log, r"(?i)skipped 3\b")
        r = d.request("GET", "/metrics")
        self.assertRegex(r.body.decode(), r"(?m)^kvidx_restore_skipped_records 3$")
        self.stop(d)

    def test_each_skipped_keys_record_is_logged_whatever_its_size(self):
        # The first records of a file that break the key rules are logged one
        # by one: a KEYS record of many keys is one of them, not one per key.
        dd = self.new_dir()
        d = self.start(dd)
        self.put(d, [key(0, "rules")])
        self.stop(d)
        newest = int(JOURNAL_RE.match(os.path.basename(newest_journal(dd))).group(1), 16)

        def h(i):
            return struct.pack(">Q", i)
        bad1 = keys_record(b"has@at", b"", [(h(i), 2, 5) for i in range(12)])
        bad2 = keys_record(b"has@too", b"", [(h(i), 2, 5) for i in range(2)])
        name = "journal-%016x.kvj" % (newest + 1)
        with open(os.path.join(dd, name), "wb") as f:
            f.write(journal_v3(newest + 1, [bad1, bad2]))
        d = self.start(dd)
        self.wait_ready(d)
        log = d.log()
        start2 = KVIDX_JOURNAL_HEADER + len(bad1)
        self.assertRegex(log, r"at bytes %d\.\.%d breaks" % (KVIDX_JOURNAL_HEADER, start2))
        self.assertRegex(log, r"at bytes %d\.\.%d breaks" % (start2, start2 + len(bad2)))
        self.assertRegex(log, r"(?i)skipped 14 keys")
        r = d.request("GET", "/metrics")
        self.assertRegex(r.body.decode(), r"(?m)^kvidx_restore_skipped_records 14$")
        self.stop(d)


if __name__ == "__main__":
    unittest.main()
