"""Layouts over HTTP: PUT/GET/DELETE /v1/layouts (docs/api.md).

size_bytes = Σ prod(shape) × itemsize(dtype); shapes/dtypes must have the
same length, every dimension ≥ 1, dtypes by torch name; world_size
defaults to 1; a key stored without size_bytes takes its layout's size.
"""

import os
import sys
import unittest
from urllib.parse import urlencode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon  # noqa: E402

PROBLEM = "application/problem+json"
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1,
            "float8_e5m2": 1, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1,
            "bool": 1}


def prod(xs):
    out = 1
    for x in xs:
        out *= x
    return out


class LayoutTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.d.kill()

    def put(self, body):
        return self.d.request("PUT", "/v1/layouts", body)

    def put_ok(self, body):
        r = self.put(body)
        self.assertEqual(r.status, 200, r)
        self.assertTrue(r.headers.get("content-type", "").startswith("application/json"), r)
        return r.json()

    def problem(self, r, status, code=None):
        self.assertEqual(r.status, status, r)
        self.assertTrue(r.headers.get("content-type", "").startswith(PROBLEM), r.headers)
        j = r.json()
        for f in ("type", "title", "status", "detail", "code"):
            self.assertIn(f, j)
        self.assertEqual(j["status"], status)
        if code:
            self.assertEqual(j["code"], code, j)
        return j

    def layouts(self):
        r = self.d.request("GET", "/v1/layouts")
        self.assertEqual(r.status, 200, r)
        j = r.json()
        self.assertIn("layouts", j)
        return j["layouts"]

    def find(self, model, ws):
        return [x for x in self.layouts() if x["model_name"] == model and x["world_size"] == ws]

    def delete(self, model, ws=None):
        q = {"model_name": model}
        if ws is not None:
            q["world_size"] = ws
        return self.d.request("DELETE", "/v1/layouts?" + urlencode(q))

    # -- size ------------------------------------------------------------
    def test_size_example(self):
        # a typical LMCache layout: K and V of 32 layers, 256 tokens, 8 heads, 128 dims
        shapes = [[2, 32, 256, 8, 128]]
        j = self.put_ok({"model_name": "size/example", "shapes": shapes, "dtypes": ["bfloat16"]})
        self.assertEqual(j["size_bytes"], 2 * 32 * 256 * 8 * 128 * 2)

    def test_size_sum_of_products(self):
        shapes = [[2, 3], [4], [5, 6, 7], [1]]
        dtypes = ["bfloat16", "float32", "float8_e4m3fn", "float64"]
        j = self.put_ok({"model_name": "size/sum", "world_size": 4, "shapes": shapes,
                         "dtypes": dtypes})
        self.assertEqual(j["size_bytes"], 6 * 2 + 4 * 4 + 210 * 1 + 1 * 8)
        self.assertEqual(j["world_size"], 4)
        self.assertEqual(j["model_name"], "size/sum")

    def test_every_dtype(self):
        for i, (dt, sz) in enumerate(sorted(ITEMSIZE.items())):
            with self.subTest(dt):
                j = self.put_ok({"model_name": "dtype-%s" % dt, "shapes": [[3, 5]],
                                 "dtypes": [dt]})
                self.assertEqual(j["size_bytes"], 15 * sz)
        all_dt = sorted(ITEMSIZE)
        j = self.put_ok({"model_name": "dtype-all", "shapes": [[7]] * len(all_dt),
                         "dtypes": all_dt})
        self.assertEqual(j["size_bytes"], 7 * sum(ITEMSIZE.values()))

    def test_integral_floats_accepted(self):
        j = self.put_ok({"model_name": "floats", "world_size": 2.0, "shapes": [[2.0, 3]],
                         "dtypes": ["int16"]})
        self.assertEqual(j["size_bytes"], 12)
        self.assertEqual(j["world_size"], 2)

    # -- rejections ------------------------------------------------------
    def test_length_mismatch(self):
        for shapes, dtypes in (([[2], [3]], ["bfloat16"]), ([[2]], ["bfloat16", "float32"])):
            with self.subTest(shapes=shapes, dtypes=dtypes):
                r = self.put({"model_name": "mismatch", "shapes": shapes, "dtypes": dtypes})
                self.problem(r, 400)
        self.assertEqual(self.find("mismatch", 1), [])

    def test_dimension_zero(self):
        for shape in ([0], [2, 0, 3], [-1, 2], [1.5], ["2"], []):
            with self.subTest(shape=shape):
                r = self.put({"model_name": "dimzero", "shapes": [shape], "dtypes": ["uint8"]})
                self.problem(r, 400)
        self.assertEqual(self.find("dimzero", 1), [])

    def test_unknown_dtype(self):
        for dt in ("bf16", "float", "torch.bfloat16", "BFloat16", "", "float8", 2):
            with self.subTest(dt=dt):
                r = self.put({"model_name": "baddtype", "shapes": [[2]], "dtypes": [dt]})
                self.problem(r, 400)
        self.assertEqual(self.find("baddtype", 1), [])

    def test_bad_model_and_world_size(self):
        for body in ({"shapes": [[2]], "dtypes": ["uint8"]},
                     {"model_name": "", "shapes": [[2]], "dtypes": ["uint8"]},
                     {"model_name": "a@b", "shapes": [[2]], "dtypes": ["uint8"]},
                     {"model_name": "ws", "world_size": 0, "shapes": [[2]], "dtypes": ["uint8"]},
                     {"model_name": "ws", "world_size": 256, "shapes": [[2]],
                      "dtypes": ["uint8"]},
                     {"model_name": "ws", "world_size": 1.5, "shapes": [[2]],
                      "dtypes": ["uint8"]},
                     {"model_name": "ws", "world_size": "2", "shapes": [[2]],
                      "dtypes": ["uint8"]},
                     {"model_name": "ws", "shapes": [], "dtypes": []},
                     {"model_name": "ws", "shapes": [[2]]},
                     {"model_name": "ws", "dtypes": ["uint8"]},
                     {"model_name": "ws", "shapes": [[2]], "dtypes": ["uint8"], "extra": 1},
                     [1]):
            with self.subTest(body=body):
                self.problem(self.put(body), 400)
        self.assertEqual([x for x in self.layouts() if x["model_name"] == "ws"], [])

    def test_too_large(self):
        # 2^41 bytes: above the 2^40 size limit of §2
        r = self.put({"model_name": "huge", "shapes": [[1 << 20, 1 << 20, 2]],
                      "dtypes": ["uint8"]})
        self.problem(r, 400)
        j = self.put_ok({"model_name": "huge-ok", "shapes": [[1 << 20, 1 << 20]],
                         "dtypes": ["uint8"]})
        self.assertEqual(j["size_bytes"], 1 << 40)

    def test_too_many_shapes_or_too_much_json(self):
        # A layout must fit one journal record: bounded shapes and JSON.
        r = self.put({"model_name": "many", "shapes": [[1]] * 1025, "dtypes": ["uint8"] * 1025})
        self.problem(r, 400, "invalid_argument")
        r = self.put({"model_name": "wide", "shapes": [[1] * 64] * 1000,
                      "dtypes": ["uint8"] * 1000})
        self.problem(r, 400, "invalid_argument")
        self.assertEqual(self.find("many", 1), [])
        self.assertEqual(self.find("wide", 1), [])
        j = self.put_ok({"model_name": "ok1024", "shapes": [[2]] * 1024,
                         "dtypes": ["uint8"] * 1024})
        self.assertEqual(j["size_bytes"], 2048)

    def test_wrong_content_type(self):
        r = self.d.request("PUT", "/v1/layouts",
                           '{"model_name":"ct","shapes":[[1]],"dtypes":["uint8"]}',
                           {"Content-Type": "text/plain"})
        self.problem(r, 415, "unsupported_media_type")
        r = self.d.request("PUT", "/v1/layouts", "{", {"Content-Type": "application/json"})
        self.problem(r, 400, "invalid_json")

    # -- registry --------------------------------------------------------
    def test_world_size_default_1(self):
        j = self.put_ok({"model_name": "ws-default", "shapes": [[4]], "dtypes": ["int32"]})
        self.assertEqual(j["world_size"], 1)
        self.assertEqual(len(self.find("ws-default", 1)), 1)
        # a key of world size 1 takes this size; world size 2 has none
        k1 = {"model_name": "ws-default", "kv_rank": 0x01000100, "chunk_hash_hex": "ab"}
        k2 = {"model_name": "ws-default", "kv_rank": 0x02000200, "chunk_hash_hex": "ab"}
        r = self.d.request("PUT", "/v1/keys", {"entries": [{"key": k1}]})
        self.assertEqual(r.status, 200, r)
        r = self.d.request("GET", "/v1/keys/ws-default@01000100@0@ab")
        self.assertEqual(r.json()["size_bytes"], 16)
        r = self.d.request("PUT", "/v1/keys", {"entries": [{"key": k2}]})
        self.problem(r, 409, "conflict")
        # delete without world_size removes world size 1
        self.assertEqual(self.delete("ws-default").status, 204)
        self.assertEqual(self.find("ws-default", 1), [])

    def test_list(self):
        a = self.put_ok({"model_name": "list/a", "world_size": 1, "shapes": [[2, 2]],
                         "dtypes": ["float16"]})
        b = self.put_ok({"model_name": "list/a", "world_size": 2, "shapes": [[3]],
                         "dtypes": ["float32"]})
        c = self.put_ok({"model_name": "list/b", "shapes": [[5]], "dtypes": ["bool"]})
        got = self.find("list/a", 1)
        self.assertEqual(len(got), 1)
        self.assertEqual(got[0]["size_bytes"], a["size_bytes"])
        self.assertEqual(got[0]["shapes"], [[2, 2]])
        self.assertEqual(got[0]["dtypes"], ["float16"])
        self.assertEqual(self.find("list/a", 2)[0]["size_bytes"], b["size_bytes"])
        self.assertEqual(self.find("list/b", 1)[0]["size_bytes"], c["size_bytes"])
        self.assertEqual((a["size_bytes"], b["size_bytes"], c["size_bytes"]), (8, 12, 5))

    def test_replace(self):
        self.put_ok({"model_name": "replace", "shapes": [[2]], "dtypes": ["uint8"]})
        self.put_ok({"model_name": "replace", "shapes": [[3]], "dtypes": ["uint8"]})
        got = self.find("replace", 1)
        self.assertEqual(len(got), 1)
        self.assertEqual(got[0]["size_bytes"], 3)

    def test_delete(self):
        self.put_ok({"model_name": "del/m", "world_size": 2, "shapes": [[2]],
                     "dtypes": ["uint8"]})
        self.put_ok({"model_name": "del/m", "world_size": 3, "shapes": [[2]],
                     "dtypes": ["uint8"]})
        r = self.delete("del/m", 2)
        self.assertEqual(r.status, 204, r)
        self.assertEqual(r.body, b"")
        self.assertEqual(self.find("del/m", 2), [])
        self.assertEqual(len(self.find("del/m", 3)), 1)      # the other one stays
        self.problem(self.delete("del/m", 2), 404, "not_found")
        self.problem(self.delete("never-registered", 1), 404, "not_found")
        # keys of world size 2 no longer get a size
        k = {"model_name": "del/m", "kv_rank": 0x02000200, "chunk_hash_hex": "ab"}
        r = self.d.request("PUT", "/v1/keys", {"entries": [{"key": k}]})
        self.problem(r, 409, "conflict")

    def test_delete_bad_query(self):
        for q in ("", "?world_size=1", "?model_name=a%40b&world_size=1",
                  "?model_name=x&world_size=0", "?model_name=x&world_size=abc",
                  "?model_name=x&world_size=256"):
            with self.subTest(q):
                r = self.d.request("DELETE", "/v1/layouts" + q)
                self.problem(r, 400)


if __name__ == "__main__":
    unittest.main()
