"""Hostile JSON bodies on every route that takes one, sent as raw bytes to a
real kvidxd.

RFC 8259 forbids raw control characters (bytes below 0x20) inside strings.
cJSON copies them, and a raw NUL then ends the C string early: the model
name "llama<NUL>@evil" used to be stored as the valid model "llama". The
daemon checks bodies once, where they are parsed (the cJSON path and the
fast key scanner alike), so each route below answers 400 invalid_json for
a raw 0x00, 0x01, 0x0a or 0x1f at either end of any string of its body
(member names and values, key form and ipc form), and for a number outside
the JSON grammar (01, 1., -01, 1.e5, .5, +1): cJSON reads those as numbers.
After every rejected batch the state (keys with their tiers, pins and
sizes, layouts, handles, load tasks, gauges) is what it was. Each body is
also sent untouched at the end and accepted, so every rejection above is
owed to the one byte or number changed. An escaped NUL (\u0000) is valid
JSON and read as '@': an enum value or member name holding one names
nothing (invalid_argument), a key field holding one is invalid_key.
"""

import json
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Conn, Daemon  # noqa: E402

PROBLEM = "application/problem+json"
CONTROL_BYTES = (b"\x00", b"\x01", b"\x0a", b"\x1f")
# kv_rank of an ipc-form key with world_size 1 and worker 0: pack(1, 0, 1, 0).
IPC_RANK = 0x01000100


def key(h, model="hj", salt=None, group=None, rank=IPC_RANK):
    k = {"chunk_hash_hex": h, "model_name": model, "kv_rank": rank}
    if group is not None:
        k["object_group_id"] = group
    if salt is not None:
        k["cache_salt"] = salt
    return k


def canonical(k):
    s = "%s@%08x@%x@%s" % (k["model_name"], k["kv_rank"], k.get("object_group_id", 0),
                           k["chunk_hash_hex"])
    return s + ("@" + k["cache_salt"] if k.get("cache_salt") else "")


KEY_L1 = key("aa")           # in L1: the handle's pinned key
KEY_L2 = key("bb")           # in L2 only: the pending load's key
KEY_DEL = key("dd", salt="s")  # stored, unpinned: the batch DELETE's target
KEY_NEW = key("cc", salt="s", group=0)  # absent: what the PUTs would store
IPC = {"model_name": "hj", "world_size": 1, "worker_id": None, "cache_salt": "",
       "chunk_hashes": ["aa", "bb"], "object_group_ids": [0], "attn_window": [-1]}

STRING_RE = re.compile(rb'"(?:[^"\\]|\\.)*"')
NUMBER_RE = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")


def spans(text, rx):
    """(start, end) of each match of rx in text outside strings (for numbers)
    or of each string (for STRING_RE)."""
    if rx is STRING_RE:
        return [m.span() for m in STRING_RE.finditer(text)]
    out, pos = [], 0
    for s, e in spans(text, STRING_RE) + [(len(text), len(text))]:
        out += [(pos + m.start(), pos + m.end()) for m in rx.finditer(text[pos:s])]
        pos = e
    return out


def with_control_bytes(text):
    """(label, body) for every string of text with each control byte put
    first and last inside it."""
    for s, e in spans(text, STRING_RE):
        name = text[s:e].decode()
        for b in CONTROL_BYTES:
            yield "%s first %r" % (name, b), text[:s + 1] + b + text[s + 1:]
            yield "%s last %r" % (name, b), text[:e - 1] + b + text[e - 1:]


def with_bad_numbers(text):
    """(label, body) for every number of text spelt outside the JSON grammar
    in each of six ways that cJSON accepts or that could pass for it."""
    for s, e in spans(text, NUMBER_RE):
        n = text[s:e]
        neg = n.startswith(b"-")
        digits = n[1:] if neg else n
        sign = b"-" if neg else b""
        for bad in (sign + b"0" + digits, n + b".", b"-0" + digits, n + b".e0",
                    sign + b"." + digits, b"+" + digits):
            yield "%s as %s" % (n.decode(), bad.decode()), text[:s] + bad + text[e:]


class HostileJson(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon(settings={"loader": "external", "load_timeout_ms": 600000,
                                 "max_lease_ms": 600000})
        try:
            cls._setup_state()
        except Exception:
            cls.d.kill()
            raise

    @classmethod
    def _setup_state(cls):
        d = cls.d

        def ok(r, status=200):
            assert r.status == status, r
            return r.json() if r.body else None

        ok(d.request("PUT", "/v1/keys", {"tier": "l1", "entries": [
            {"key": KEY_L1, "size_bytes": 5}, {"key": KEY_DEL, "size_bytes": 6}]}))
        ok(d.request("PUT", "/v1/keys", {"tier": "l2", "entries": [
            {"key": KEY_L2, "size_bytes": 7}]}))
        ok(d.request("PUT", "/v1/layouts", {"model_name": "hj", "world_size": 1,
                                            "shapes": [[2, 3]], "dtypes": ["bfloat16"]}))
        cls.handle = ok(d.request("POST", "/v1/prefetches",
                                  {"keys": [KEY_L1], "lease_ms": 600000}), 201)["id"]
        cls.waiting = ok(d.request("POST", "/v1/prefetches",
                                   {"keys": [KEY_L2], "lease_ms": 600000}), 201)["id"]
        tasks = ok(d.request("GET", "/v1/loads"))["tasks"]
        assert len(tasks) == 1, tasks
        cls.task = tasks[0]["task"]

    @classmethod
    def tearDownClass(cls):
        cls.d.kill()

    def routes(self):
        """(name, method, path, body, status of the untouched body), in the
        order the untouched bodies can be sent one after another."""
        h, t = self.handle, self.task
        return [
            ("lookup, key form", "POST", "/v1/lookup", {"tier": "any", "keys": [KEY_L1, KEY_L2]},
             200),
            ("lookup, ipc form", "POST", "/v1/lookup", dict(IPC, tier="any"), 200),
            ("layouts", "PUT", "/v1/layouts",
             {"model_name": "hj-2", "world_size": 2, "shapes": [[2, 3], [4]],
              "dtypes": ["bfloat16", "int8"]}, 200),
            ("batch store", "PUT", "/v1/keys",
             {"tier": "l2", "entries": [{"key": KEY_NEW, "size_bytes": 9}]}, 200),
            ("single store", "PUT", "/v1/keys/" + canonical(key("ee", salt="s")),
             {"tier": "l1", "size_bytes": 9}, 200),
            ("prefetch, key form", "POST", "/v1/prefetches",
             {"mode": "LOOKUP", "trim_policy": "PREFIX", "extra_count": 1,
              "external_request_id": "req-1", "lease_ms": 1000, "keys": [KEY_L1]}, 201),
            ("prefetch, ipc form", "POST", "/v1/prefetches",
             dict(IPC, mode="WARM", trim_policy="SPARSE", external_request_id="req-2"), 201),
            ("extend", "POST", "/v1/prefetches/%d/extend" % h, {"lease_ms": 500000}, 200),
            ("release", "POST", "/v1/prefetches/%d/release" % h, {"indices": [0]}, 200),
            ("load completion", "POST", "/v1/loads/%d" % t,
             {"loaded": [KEY_L2], "failed": []}, 200),
            ("batch delete", "DELETE", "/v1/keys",
             {"tier": "all", "force": False, "keys": [KEY_DEL]}, 200),
        ]

    # -- state ---------------------------------------------------------
    def state(self, c):
        def get(path):
            r = c.request("GET", path)
            self.assertEqual(r.status, 200, (path, r))
            return r.json()

        keys = get("/v1/keys?page_size=5000")["entries"]
        out = {"keys": keys, "layouts": get("/v1/layouts"),
               "handles": [get("/v1/prefetches/%d" % i) for i in (self.handle, self.waiting)],
               "tasks": get("/v1/loads")["tasks"]}
        for e in keys:
            out[canonical(e["key"])] = get("/v1/keys/" + canonical(e["key"]))
        stats = get("/v1/stats")
        for f in ("keys", "bytes", "l1_loading", "l1_pinned", "pins", "namespaces"):
            out["stats." + f] = stats[f]
        r = c.request("GET", "/metrics")
        for ln in r.body.decode().splitlines():
            if ln.startswith(("kvidx_prefetch_", "kvidx_load")):
                out[ln.split(" ")[0]] = ln
        return out

    def assert_same_state(self, now, before, what):
        """now == before, but for the millisecond times the daemon derives
        from its clock at each answer (expires_at_ms, deadline_ms), which
        may differ by rounding: within 100 ms. An extend moves them by far
        more."""
        def times(x, path="", out=None):
            out = [] if out is None else out
            if isinstance(x, dict):
                for k, v in sorted(x.items()):
                    times(v, path + "/" + k, out)
            elif isinstance(x, list):
                for i, v in enumerate(x):
                    times(v, "%s[%d]" % (path, i), out)
            elif path.endswith("_ms") and isinstance(x, int):
                out.append((path, x))
            return out
        a, b = times(now), times(before)
        self.assertEqual([p for p, _ in a], [p for p, _ in b], what)
        for (p, x), (_, y) in zip(a, b):
            self.assertLessEqual(abs(x - y), 100, (what, p, x, y))

        def strip(x, path=""):
            if isinstance(x, dict):
                return {k: strip(v, k) for k, v in x.items() if not k.endswith("_ms")}
            if isinstance(x, list):
                return [strip(v, path) for v in x]
            return x
        self.assertEqual(strip(now), strip(before), what)

    def send(self, c, method, path, body):
        return c.request(method, path, body, {"Content-Type": "application/json"})

    def assert_invalid_json(self, r, what):
        self.assertEqual(r.status, 400, (what, r))
        self.assertTrue(r.headers.get("content-type", "").startswith(PROBLEM), (what, r))
        self.assertEqual(r.json()["code"], "invalid_json", (what, r.body))

    def check_rejected(self, variants):
        """Sends every (label, body) of each route's variants; each must be
        400 invalid_json, and the state after each route's batch the one
        before it."""
        with Conn(self.d) as c:
            before = self.state(c)
            for name, method, path, body, _ in self.routes():
                text = json.dumps(body, separators=(",", ":")).encode()
                sent = 0
                for label, hostile in variants(text):
                    with self.subTest(route=name, change=label):
                        self.assert_invalid_json(self.send(c, method, path, hostile),
                                                 "%s: %s" % (name, label))
                    sent += 1
                self.assertGreater(sent, 0, name)
                with self.subTest(route=name, check="state unchanged"):
                    self.assert_same_state(self.state(c), before, name)
        return before

    # -- tests ---------------------------------------------------------
    def test_1_raw_control_bytes_in_any_string(self):
        self.check_rejected(with_control_bytes)

    def test_2_numbers_outside_the_json_grammar(self):
        self.check_rejected(with_bad_numbers)

    def test_3_bodies_untouched_are_accepted(self):
        with Conn(self.d) as c:
            for name, method, path, body, status in self.routes():
                text = json.dumps(body, separators=(",", ":")).encode()
                r = self.send(c, method, path, text)
                self.assertEqual(r.status, status, (name, r))
            self.assertEqual(c.request("GET", "/v1/keys/" + canonical(KEY_NEW)).status, 200)
            self.assertEqual(c.request("GET", "/v1/keys/" + canonical(KEY_DEL)).status, 404)

    def test_0_escaped_nul_is_never_cut_short(self):
        """An escaped NUL is valid JSON: it is read as '@' (see docs/keys.md),
        so an enum value or member name holding one names nothing, and a key
        field holding one is invalid_key; nothing is stored or changed."""
        esc = "\\u0000"
        a = '{"chunk_hash_hex":"aa","model_name":"hj","kv_rank":%d}' % IPC_RANK
        cases = [
            ("PUT", "/v1/keys", '{"tier":"l1%sx","entries":[{"key":%s,"size_bytes":1}]}'
             % (esc, a), "invalid_argument"),
            ("PUT", "/v1/keys", '{"tier%sjunk":"l1","entries":[{"key":%s,"size_bytes":1}]}'
             % (esc, a), "invalid_argument"),
            # an unknown member, and the entry has no key
            ("PUT", "/v1/keys", '{"entries":[{"key%s":%s,"size_bytes":1}]}' % (esc, a),
             "invalid_key"),
            ("PUT", "/v1/keys", '{"entries":[{"key":{"chunk_hash_hex":"aa","model_name":'
             '"hj%s","kv_rank":0},"size_bytes":1}]}' % esc, "invalid_key"),
            ("PUT", "/v1/keys", '{"entries":[{"key":{"chunk_hash_hex":"aa%s","model_name":'
             '"hj","kv_rank":0},"size_bytes":1}]}' % esc, "invalid_key"),
            ("PUT", "/v1/keys", '{"entries":[{"key":{"chunk_hash_hex":"aa","model_name":'
             '"hj","kv_rank":0,"cache_salt%s":""},"size_bytes":1}]}' % esc, "invalid_key"),
            ("DELETE", "/v1/keys", '{"tier":"all%s","keys":[%s]}' % (esc, a),
             "invalid_argument"),
            ("PUT", "/v1/keys/" + canonical(KEY_NEW), '{"tier":"l2%s","size_bytes":1}' % esc,
             "invalid_argument"),
            ("POST", "/v1/lookup", '{"tier":"l1%s","keys":[%s]}' % (esc, a), "invalid_argument"),
            ("POST", "/v1/lookup", '{"model_name":"hj%s","world_size":1,"chunk_hashes":["aa"]}'
             % esc, "invalid_key"),
            ("POST", "/v1/prefetches", '{"mode":"WARM%s","keys":[%s]}' % (esc, a),
             "invalid_argument"),
            ("PUT", "/v1/layouts", '{"model_name":"hj-nul","shapes":[[2]],"dtypes":["int8%s"]}'
             % esc, "invalid_argument"),
        ]
        with Conn(self.d) as c:
            before = self.state(c)
            for method, path, body, code in cases:
                with self.subTest(body=body):
                    r = self.send(c, method, path, body.encode())
                    self.assertEqual(r.status, 400, (body, r))
                    self.assertEqual(r.json()["code"], code, (body, r.body))
            self.assert_same_state(self.state(c), before, "escaped NUL")

    def test_0_the_probes_of_the_report(self):
        """The bodies that were accepted before: nothing of them is stored."""
        bodies = [
            ("PUT", "/v1/keys", b'{"entries":[{"key":{"chunk_hash_hex":"aa","model_name":'
                                b'"llama\x00@evil","kv_rank":0},"size_bytes":1}]}'),
            ("PUT", "/v1/keys", b'{"entries":[{"key":{"chunk_hash_hex":"bb\x00zz",'
                                b'"model_name":"nul","kv_rank":0},"size_bytes":1}]}'),
            ("PUT", "/v1/keys", b'{"tier":"l1\x00x","entries":[{"key":{"chunk_hash_hex":"cc",'
                                b'"model_name":"nul","kv_rank":0},"size_bytes":1}]}'),
            ("PUT", "/v1/keys", b'{"tier\x00junk":"l1","entries":[{"key":{"chunk_hash_hex":'
                                b'"dd","model_name":"nul","kv_rank":0},"size_bytes":1}]}'),
            ("PUT", "/v1/keys", b'{"entries":[{"key":{"chunk_hash_hex":"ee","model_name":'
                                b'"nul","kv_rank":01},"size_bytes":1.}]}'),
            ("POST", "/v1/lookup", b'{"keys":[{"chunk_hash_hex":"aa","model_name":'
                                   b'"nul\x00other","kv_rank":0}]}'),
            ("POST", "/v1/lookup", b'{"model_name":"nul\x00other","world_size":1,'
                                   b'"chunk_hashes":["aa"]}'),
            ("POST", "/v1/lookup", b'{"model_name":"nul","world_size":1,'
                                   b'"chunk_hashes":["aa\x00zz"]}'),
        ]
        with Conn(self.d) as c:
            before = self.state(c)
            for method, path, body in bodies:
                self.assert_invalid_json(self.send(c, method, path, body), body)
            for model in ("llama", "nul"):
                r = c.request("GET", "/v1/keys?model_name=" + model)
                self.assertEqual(r.json()["entries"], [], model)
            self.assert_same_state(self.state(c), before, "probes")


if __name__ == "__main__":
    unittest.main()
