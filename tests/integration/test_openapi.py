"""docs/openapi.yaml: a well-formed OpenAPI 3.1 document that is true to kvidxd.

Document checks (no daemon): the file is YAML, `openapi` is 3.1.x, `info`
has a title and a version, every operation has responses (each with a
description) and a unique operationId, every `$ref` resolves inside the
document, and every `{param}` of a path template is declared as a path
parameter (and nothing else is).

Daemon checks (a real kvidxd on loopback): every documented operation
reaches the route whose metrics label is its operationId (or its
`x-metrics-route`), never "unknown", never 405; and a walk through every
operation, successes and errors, gets only documented status codes with
bodies that match the documented schemas. The schemas are checked by a
small validator of the JSON Schema keywords the document uses; a keyword it
does not know fails the test instead of being ignored.

Needs PyYAML (Debian: python3-yaml).
"""

import json
import os
import re
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, source_dir  # noqa: E402

try:
    import yaml
except ImportError:  # pragma: no cover - a missing dependency, said plainly
    sys.exit("test_openapi.py needs PyYAML: apt-get install python3-yaml (scripts/deps.sh test)")

DOC_PATH = os.path.join(source_dir(), "docs", "openapi.yaml")
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
PROBLEM = "application/problem+json"


def load_doc():
    with open(DOC_PATH, encoding="utf-8") as f:
        return yaml.safe_load(f)


def pointer(doc, ref):
    """The value a local reference ('#/a/b') names; KeyError when none."""
    if not ref.startswith("#/"):
        raise KeyError(ref)
    node = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list):
            node = node[int(part)]
        else:
            node = node[part]
    return node


def walk(node, path=()):
    """Yields (path, dict) for every mapping in the document."""
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from walk(v, path + (str(k),))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, path + (str(i),))


def operations(doc):
    for tpl, item in doc["paths"].items():
        for m in METHODS:
            if m in item:
                yield tpl, m, item, item[m]


def deref(doc, node):
    while isinstance(node, dict) and "$ref" in node:
        node = pointer(doc, node["$ref"])
    return node


# --------------------------------------------------------------------------
# A validator for the JSON Schema keywords this document uses.

ANNOTATIONS = {"description", "default", "example", "examples", "title", "format",
               "deprecated", "readOnly", "writeOnly"}
KEYWORDS = {"$ref", "type", "enum", "const", "required", "properties",
            "additionalProperties", "unevaluatedProperties", "items", "minItems",
            "maxItems", "minimum", "maximum", "minLength", "maxLength", "pattern", "allOf",
            "oneOf", "anyOf", "not"} | ANNOTATIONS

TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or
    (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


class Validator:
    def __init__(self, doc):
        self.doc = doc

    def errors(self, schema, value, where="$"):
        """A list of messages; empty when value matches schema."""
        errs, _ = self._check(schema, value, where)
        return errs

    def _check(self, schema, v, where):
        """(errors, property names this schema evaluated on v)."""
        if schema is True or schema == {}:
            return [], set()
        if schema is False:
            return ["%s: no value allowed" % where], set()
        unknown = set(schema) - KEYWORDS
        if unknown:
            return ["%s: validator does not know %s" % (where, sorted(unknown))], set()
        errs = []
        seen = set()
        if "$ref" in schema:
            e, s = self._check(pointer(self.doc, schema["$ref"]), v, where)
            errs += e
            seen |= s
        if "type" in schema:
            types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if not any(TYPES[t](v) for t in types):
                return errs + ["%s: %r is not %s" % (where, v, "/".join(types))], seen
        if "enum" in schema and v not in schema["enum"]:
            errs.append("%s: %r not in %r" % (where, v, schema["enum"]))
        if "const" in schema and v != schema["const"]:
            errs.append("%s: %r is not %r" % (where, v, schema["const"]))
        if TYPES["number"](v):
            if "minimum" in schema and v < schema["minimum"]:
                errs.append("%s: %r < %r" % (where, v, schema["minimum"]))
            if "maximum" in schema and v > schema["maximum"]:
                errs.append("%s: %r > %r" % (where, v, schema["maximum"]))
        if isinstance(v, str):
            if len(v) < schema.get("minLength", 0):
                errs.append("%s: shorter than %d" % (where, schema["minLength"]))
            if "maxLength" in schema and len(v.encode()) > schema["maxLength"]:
                errs.append("%s: longer than %d" % (where, schema["maxLength"]))
            if "pattern" in schema and not re.search(schema["pattern"], v):
                errs.append("%s: %r does not match %s" % (where, v, schema["pattern"]))
        if isinstance(v, list):
            if len(v) < schema.get("minItems", 0):
                errs.append("%s: fewer than %d items" % (where, schema["minItems"]))
            if "maxItems" in schema and len(v) > schema["maxItems"]:
                errs.append("%s: more than %d items" % (where, schema["maxItems"]))
            if "items" in schema:
                for i, x in enumerate(v):
                    errs += self.errors(schema["items"], x, "%s[%d]" % (where, i))
        if isinstance(v, dict):
            for name in schema.get("required", []):
                if name not in v:
                    errs.append("%s: member %s missing" % (where, name))
            props = schema.get("properties", {})
            for name, sub in props.items():
                if name in v:
                    errs += self.errors(sub, v[name], "%s.%s" % (where, name))
            seen |= set(props) & set(v)
            extra = schema.get("additionalProperties", True)
            for name in set(v) - set(props):
                if extra is False:
                    errs.append("%s: member %s not allowed" % (where, name))
                elif isinstance(extra, dict):
                    errs += self.errors(extra, v[name], "%s.%s" % (where, name))
            if "additionalProperties" in schema:
                seen |= set(v)
        for sub in schema.get("allOf", []):
            e, s = self._check(sub, v, where)
            errs += e
            seen |= s
        for key in ("oneOf", "anyOf"):
            if key not in schema:
                continue
            good = []
            for sub in schema[key]:
                e, s = self._check(sub, v, where)
                if not e:
                    good.append(s)
            if not good or (key == "oneOf" and len(good) > 1):
                errs.append("%s: matches %d of the %s branches" % (where, len(good), key))
            for s in good:
                seen |= s
        if "not" in schema and not self.errors(schema["not"], v, where):
            errs.append("%s: %r matches a 'not' schema" % (where, v))
        if schema.get("unevaluatedProperties") is False and isinstance(v, dict):
            for name in set(v) - seen:
                errs.append("%s: member %s not allowed" % (where, name))
            seen |= set(v)
        return errs, seen


# --------------------------------------------------------------------------


class DocumentTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.doc = load_doc()

    def test_version_and_info(self):
        self.assertIsInstance(self.doc, dict)
        self.assertRegex(str(self.doc.get("openapi")), r"^3\.1\.\d+$")
        info = self.doc.get("info") or {}
        self.assertTrue(info.get("title"), "info.title")
        self.assertTrue(info.get("version"), "info.version")
        self.assertTrue(self.doc.get("paths"), "paths")

    def test_every_operation_has_responses(self):
        n = 0
        for tpl, m, _, op in operations(self.doc):
            n += 1
            with self.subTest(op="%s %s" % (m, tpl)):
                responses = op.get("responses")
                self.assertIsInstance(responses, dict)
                self.assertTrue(responses, "no responses")
                for code, r in responses.items():
                    self.assertRegex(str(code), r"^([1-5][0-9][0-9]|[1-5]XX|default)$")
                    self.assertTrue(deref(self.doc, r).get("description"),
                                    "response %s has no description" % code)
        self.assertGreater(n, 0)

    def test_operation_ids_present_and_unique(self):
        ids = {}
        for tpl, m, _, op in operations(self.doc):
            with self.subTest(op="%s %s" % (m, tpl)):
                oid = op.get("operationId")
                self.assertTrue(oid, "no operationId")
                self.assertNotIn(oid, ids, "operationId %s also on %s" % (oid, ids.get(oid)))
                ids[oid] = "%s %s" % (m, tpl)

    def test_every_ref_resolves(self):
        refs = 0
        for where, node in walk(self.doc):
            ref = node.get("$ref")
            if not isinstance(ref, str):
                continue
            refs += 1
            with self.subTest(at="/".join(where), ref=ref):
                self.assertTrue(ref.startswith("#/"), "a reference outside the document")
                try:
                    pointer(self.doc, ref)
                except (KeyError, IndexError, ValueError, TypeError):
                    self.fail("does not resolve")
        self.assertGreater(refs, 0)

    def test_path_parameters_match_templates(self):
        for tpl, item in self.doc["paths"].items():
            names = set(re.findall(r"\{([^}/]+)\}", tpl))
            for m in METHODS:
                if m not in item:
                    continue
                with self.subTest(op="%s %s" % (m, tpl)):
                    params = [deref(self.doc, p)
                              for p in item.get("parameters", []) + item[m].get("parameters", [])]
                    declared = {p["name"] for p in params if p.get("in") == "path"}
                    self.assertEqual(declared, names)
                    for p in params:
                        if p.get("in") == "path":
                            self.assertIs(p.get("required"), True, p["name"])

    def test_schemas_use_known_keywords(self):
        # The daemon checks below would silently skip a keyword the small
        # validator does not know; refuse such a keyword here instead.
        v = Validator(self.doc)
        for name, schema in self.doc["components"]["schemas"].items():
            with self.subTest(schema=name):
                for where, node in walk(schema):
                    if where and where[-1] == "properties":
                        continue  # member names, not keywords
                    unknown = set(node) - KEYWORDS
                    self.assertFalse(unknown, "%s at %s" % (sorted(unknown), "/".join(where)))
        self.assertEqual(v.errors({"type": "integer", "minimum": 1}, 2.0), [])
        self.assertTrue(v.errors({"type": "integer"}, True))
        self.assertTrue(v.errors({"$ref": "#/components/schemas/SizeBytes"}, 0))
        self.assertTrue(v.errors({"$ref": "#/components/schemas/EncodedObjectKey"},
                                 {"model_name": "m", "kv_rank": 1, "chunk_hash_hex": "00",
                                  "chunk_hash": "00"}))


# --------------------------------------------------------------------------

KEY = "m@01000100@0@00"
PARAM_VALUES = {"canonical": KEY, "id": "1", "task": "1"}


def route_counts(d):
    text = d.request("GET", "/metrics").body.decode()
    out = {}
    for m in re.finditer(r'^kvidx_http_requests_total\{route="([^"]*)",code_class="[^"]*"\} (\d+)$',
                         text, re.M):
        out[m.group(1)] = out.get(m.group(1), 0) + int(m.group(2))
    return out


class RoutesTest(unittest.TestCase):
    """Every documented operation is served by the route it names."""

    @classmethod
    def setUpClass(cls):
        cls.doc = load_doc()
        cls.d = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.d.kill()

    def test_operations_reach_their_route(self):
        for tpl, m, _, op in operations(self.doc):
            path = re.sub(r"\{([^}]+)\}", lambda g: PARAM_VALUES[g.group(1)], tpl)
            with self.subTest(op="%s %s" % (m, tpl)):
                before = route_counts(self.d)
                body = b"{}" if m in ("put", "post") else b""
                r = self.d.request(m.upper(), path, body,
                                   {"Content-Type": "application/json"} if body else None)
                self.assertNotEqual(r.status, 405, r)
                after = route_counts(self.d)
                delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
                delta["metrics"] -= 1  # the request that read `before`
                delta = {k: n for k, n in delta.items() if n}
                want = op.get("x-metrics-route", op["operationId"])
                self.assertEqual(delta, {want: 1}, r)


class AnswersTest(unittest.TestCase):
    """A walk through every operation: documented statuses, documented bodies."""

    @classmethod
    def setUpClass(cls):
        cls.doc = load_doc()
        cls.v = Validator(cls.doc)
        cls.d = Daemon(settings={"loader": "external"})
        cls.seen = set()

    @classmethod
    def tearDownClass(cls):
        cls.d.kill()

    def call(self, method, tpl, path, body=None, status=None, ctype="application/json"):
        op = self.doc["paths"][tpl][method.lower()]
        raw = b"" if body is None else (body if isinstance(body, bytes) else
                                        json.dumps(body).encode())
        r = self.d.request(method, path, raw, {"Content-Type": ctype} if raw else None)
        where = "%s %s -> %d %r" % (method, path, r.status, r.body[:300])
        if status is not None:
            self.assertEqual(r.status, status, where)
        doc_r = op["responses"].get(str(r.status))
        self.assertIsNotNone(doc_r, "status not documented: " + where)
        doc_r = deref(self.doc, doc_r)
        content = doc_r.get("content")
        if not content:
            self.assertEqual(r.body, b"", where)
            self.seen.add((method, tpl))
            return None
        mt = r.headers.get("content-type", "").split(";")[0].strip()
        self.assertIn(mt, content, where)
        self.seen.add((method, tpl))
        if not mt.endswith("json"):
            return r.body
        value = json.loads(r.body)
        errs = self.v.errors(content[mt]["schema"], value)
        self.assertEqual(errs, [], where)
        return value

    def test_walk(self):
        K = lambda h: {"model_name": "m", "kv_rank": 16777472, "chunk_hash_hex": h}  # noqa
        c = self.call
        for p in ("/livez", "/readyz", "/metrics", "/v1/stats", "/v1/limits"):
            c("GET", p, p, status=200)
        # keys
        c("PUT", "/v1/keys", "/v1/keys", {"tier": "l1", "entries": [
            {"key": K("00"), "size_bytes": 10}, {"key": K("01"), "size_bytes": 10}]}, 200)
        c("PUT", "/v1/keys", "/v1/keys", {"entries": [
            {"key": K("02"), "size_bytes": 10}, {"key": K("03"), "size_bytes": 10}]}, 200)
        c("PUT", "/v1/keys", "/v1/keys", {"entries": [{"key": K("0"), "size_bytes": 1}]}, 400)
        c("PUT", "/v1/keys", "/v1/keys", {"entries": [{"key": K("aa")}]}, 409)
        c("PUT", "/v1/keys", "/v1/keys", b"{}", 415, ctype="text/plain")
        c("PUT", "/v1/keys", "/v1/keys", b"{", 400)
        c("GET", "/v1/keys", "/v1/keys?page_size=1", status=200)
        c("GET", "/v1/keys", "/v1/keys?tier=l1&cache_salt=&kv_rank=0x01000100", status=200)
        c("GET", "/v1/keys", "/v1/keys?modelname=m", status=400)
        c("GET", "/v1/keys", "/v1/keys?page_token=" + "A" * 80, status=400)
        tpl = "/v1/keys/{canonical}"
        c("GET", tpl, "/v1/keys/" + KEY, status=200)
        c("GET", tpl, "/v1/keys/m@01000100@0@02", status=200)
        c("GET", tpl, "/v1/keys/m@01000100@0@0", status=400)
        c("GET", tpl, "/v1/keys/m@01000100@0@09", status=404)
        c("PUT", tpl, "/v1/keys/m@01000100@0@04", {"size_bytes": 10, "tier": "l2"}, 200)
        c("PUT", tpl, "/v1/keys/m@01000100@0@05", {}, 409)
        c("DELETE", tpl, "/v1/keys/m@01000100@0@04?tier=x", status=400)
        c("DELETE", tpl, "/v1/keys/m@01000100@0@04", status=204)
        c("DELETE", tpl, "/v1/keys/m@01000100@0@04", status=404)
        c("DELETE", "/v1/keys", "/v1/keys", {"tier": "all", "force": False, "keys": [K("09")]},
          200)
        c("DELETE", "/v1/keys", "/v1/keys", {"keys": [K("9")]}, 400)
        # layouts
        lay = {"model_name": "m", "shapes": [[2, 3]], "dtypes": ["bfloat16"]}
        c("PUT", "/v1/layouts", "/v1/layouts", lay, 200)
        c("PUT", "/v1/layouts", "/v1/layouts", dict(lay, dtypes=["x"]), 400)
        c("GET", "/v1/layouts", "/v1/layouts", status=200)
        c("DELETE", "/v1/layouts", "/v1/layouts?model_name=m", status=204)
        c("DELETE", "/v1/layouts", "/v1/layouts?model_name=m", status=404)
        c("DELETE", "/v1/layouts", "/v1/layouts", status=400)
        # lookup
        c("POST", "/v1/lookup", "/v1/lookup", {"keys": [K("00"), K("02"), K("09")]}, 200)
        c("POST", "/v1/lookup", "/v1/lookup", {"model_name": "m", "world_size": 1,
                                               "chunk_hashes": ["00", "01"],
                                               "attn_window": [-1], "tier": "l1"}, 200)
        c("POST", "/v1/lookup", "/v1/lookup", {"keys": [], "model_name": "m"}, 400)
        # prefetches and loads (loader = external: the walk completes the loads)
        h = c("POST", "/v1/prefetches", "/v1/prefetches",
              {"keys": [K("00"), K("02"), K("03")], "external_request_id": "x"}, 201)
        c("POST", "/v1/prefetches", "/v1/prefetches", {"keys": [K("00")], "mode": "X"}, 400)
        one = "/v1/prefetches/{id}"
        rel = "/v1/prefetches/{id}/release"
        ext = "/v1/prefetches/{id}/extend"
        hp = "/v1/prefetches/%d" % h["id"]
        c("GET", one, hp, status=200)
        c("POST", rel, hp + "/release", status=409)  # pending
        tasks = c("GET", "/v1/loads", "/v1/loads", status=200)
        c("GET", "/v1/loads", "/v1/loads?wait_ms=x", status=400)
        task = "/v1/loads/%d" % tasks["tasks"][0]["task"]
        c("POST", "/v1/loads/{task}", task, {"loaded": [0], "failed": [K("03")]}, 200)
        c("POST", "/v1/loads/{task}", task, {"loaded": [0]}, 404)
        c("GET", one, hp + "?wait_ms=1000", status=200)
        c("POST", ext, hp + "/extend", {"lease_ms": 60000}, 200)
        c("POST", ext, hp + "/extend", {"lease_ms": 0}, 400)
        c("POST", rel, hp + "/release", {"indices": [0]}, 200)
        c("POST", rel, hp + "/release", {"indices": [0]}, 409)
        c("POST", rel, hp + "/release", {"indices": [7]}, 400)
        c("POST", rel, hp + "/release", status=200)
        c("POST", ext, hp + "/extend", {"lease_ms": 5}, 409)  # released
        c("GET", one, hp, status=200)
        c("DELETE", one, hp, status=204)
        c("DELETE", one, "/v1/prefetches/999999999999", status=404)
        c("GET", one, "/v1/prefetches/999999999999", status=404)
        w = c("POST", "/v1/prefetches", "/v1/prefetches",
              {"model_name": "m", "world_size": 1, "chunk_hashes": ["00"], "mode": "WARM",
               "lease_ms": 1}, 201)
        time.sleep(0.2)
        wp = "/v1/prefetches/%d" % w["id"]
        c("GET", one, wp, status=410)
        c("POST", rel, wp + "/release", status=410)
        c("POST", ext, wp + "/extend", {"lease_ms": 5}, 410)
        # the fleet directory (docs/fleet.md)
        batch = {"instance_id": "mp-1", "incarnation": 1, "seq": 1, "event_type": "store",
                 "tier": "l1", "backend": "dram",
                 "entries": [{"key": K("00"), "size_bytes": 10, "token_ids": [1, 2]}]}
        c("POST", "/events", "/events", {"batches": [batch]}, 200)
        c("POST", "/events", "/events", {"batches": [dict(batch, seq=0)]}, 422)
        c("POST", "/events", "/events", b"{", 400)
        c("GET", "/directory/keys", "/directory/keys?tier=l1&limit=5", status=200)
        c("GET", "/directory/keys", "/directory/keys?limit=0", status=422)
        c("GET", "/directory/keys", "/directory/keys?limit=1&page_token=", status=200)
        c("GET", "/directory/keys", "/directory/keys?page_token=AAAA", status=400)
        for p in ("/directory/lookup", "/directory/score"):
            c("POST", p, p, {"keys": [K("00"), K("09")]}, 200)
            c("POST", p, p, {"token_ids": [1] * 300, "model_name": "m", "world_size": 2}, 200)
            c("POST", p, p, {}, 422)
            c("POST", p, p, {"token_ids": [1], "model_name": "m@"}, 400)
        c("GET", "/directory/stats", "/directory/stats", status=200)
        c("GET", "/directory/streams", "/directory/streams", status=200)
        reg = c("POST", "/instances", "/instances", {"ip": "10.0.0.1", "http_port": 80}, 200)
        c("POST", "/instances", "/instances", {"ip": "10.0.0.1"}, 422)
        c("GET", "/instances", "/instances", status=200)
        hb = "/instances/{id}/heartbeat"
        c("PUT", hb, "/instances/%s/heartbeat" % reg["instance_id"], status=200)
        c("PUT", hb, "/instances/nobody/heartbeat", status=404)
        c("DELETE", "/instances/{id}", "/instances/" + reg["instance_id"], status=204)
        c("GET", "/healthz", "/healthz", status=200)
        # every operation of the document was answered at least once
        documented = {(m.upper(), t) for t, m, _, _ in operations(self.doc)}
        self.assertEqual(documented - self.seen, set())


if __name__ == "__main__":
    unittest.main()
