#!/usr/bin/env python3
"""Large answers on a real socket: a listing page is handed to the kernel
from its own buffer, behind the headers of its answer and between the
answers pipelined around it.

Every check compares bytes: the answers a pipelined sequence receives,
read through a small receive buffer a few bytes at a time (so the daemon's
writes stop part-way through headers and bodies), must be exactly the
answers the same requests get one by one. Also HEAD of a large answer, a
large answer before a Connection: close, and the output limit counting the
bodies the connection holds.

Run: KVIDXD=build/kvidxd python3 tests/integration/test_http_big_answers.py
"""

import os
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, build_request  # noqa: E402

# Complete pages (no next_page_token, so no timestamp): the same bytes
# every time they are asked for.
BIG = "/v1/keys?model_name=big&page_size=5000"      # 1500 entries, ~230 KB
MID = "/v1/keys?model_name=mid&page_size=5000"      # 120 entries, ~18 KB
SMALL = "/v1/keys?model_name=small&page_size=5000"  # 10 entries, ~1.5 KB
FILL = 24  # large answers that fill the socket before a sequence (~5.5 MB)


def keys(model, n):
    return [{"model_name": model, "kv_rank": i % 4, "object_group_id": 0,
             "chunk_hash_hex": "%064x" % (i * 2654435761), "cache_salt": ""}
            for i in range(n)]


def request_bytes(method, path, headers=None):
    return build_request(method, path, headers=headers)


def recv_answer(sock, head=False):
    """The raw bytes of one answer (status line to the end of its body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError("closed before the headers ended")
        data += chunk
    end = data.index(b"\r\n\r\n") + 4
    length = 0
    for line in data[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    want = end + (0 if head else length)
    while len(data) < want:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError("closed inside the body")
        data += chunk
    assert len(data) == want, "bytes after the answer on a fresh connection"
    return data


def small_rcvbuf_socket(addr, rcvbuf=2048, timeout=30.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(timeout)
    s.connect(addr)
    return s


def slow_read(sock, total, eof=False):
    """Reads total bytes a few at a time, pausing now and then so that the
    daemon's writes keep stopping part-way; with eof, then waits for the
    peer to close and returns everything received."""
    sizes = (1, 7, 13, 64, 333, 4096)
    data = bytearray()
    i = 0
    while len(data) < total:
        chunk = sock.recv(min(sizes[i % len(sizes)], total - len(data)))
        if not chunk:
            break
        data += chunk
        i += 1
        if i % 400 == 0:
            time.sleep(0.002)
    if eof:
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    return bytes(data)


class BigAnswers(unittest.TestCase):
    settings = {}

    def setUp(self):
        self.d = Daemon(settings=self.settings)
        for model, n in (("big", 1500), ("mid", 120), ("small", 10)):
            r = self.d.request("PUT", "/v1/keys", {"tier": "l2", "entries": [
                {"key": k, "size_bytes": 100 + j} for j, k in enumerate(keys(model, n))]},
                timeout=30)
            self.assertEqual(r.status, 200, r)
        self.alone = {}

    def tearDown(self):
        # A clean exit after the traffic: under ASan also the leak check.
        rc = self.d.stop() if self.d.running() else 0
        log = self.d.log()
        self.d.kill()
        self.assertEqual(rc, 0, log[-3000:])

    def one_by_one(self, method, path, headers=None):
        """The answer to one request alone on a fresh keep-alive connection."""
        key = (method, path, tuple(sorted((headers or {}).items())))
        if key not in self.alone:
            s = self.d.connect(10)
            try:
                s.sendall(request_bytes(method, path, headers))
                self.alone[key] = recv_answer(s, head=(method == "HEAD"))
            finally:
                s.close()
        return self.alone[key]

    def expected(self, seq):
        return b"".join(self.one_by_one(*r) for r in seq)

    def pipelined(self, seq, eof=False, total=None, stagger=True):
        """Sends seq on one connection and reads its answers slowly. With
        stagger, FILL large answers go first (more than the kernel buffers
        of a loopback socket hold) and the requests of seq follow one by one
        while the daemon is still writing: each answer then waits for the
        write in flight, and the next write starts with a uv_try_write that
        the full socket cuts short at some byte of some buffer."""
        sent = ([("GET", BIG)] * FILL if stagger else []) + list(seq)
        if total is None:
            total = len(self.expected(sent))
        s = small_rcvbuf_socket(self.d.addr)
        try:
            if stagger:
                s.sendall(b"".join(request_bytes(*r) for r in sent[:FILL]))

                def rest():
                    for r in seq:
                        time.sleep(0.01)
                        try:
                            s.sendall(request_bytes(*r))
                        except OSError:
                            return  # closed by the daemon (Connection: close)

                t = threading.Thread(target=rest)
                t.start()
            else:
                s.sendall(b"".join(request_bytes(*r) for r in seq))
            time.sleep(0.3)  # let the daemon fill the socket first
            got = slow_read(s, total, eof)
            if stagger:
                t.join(30)
            return got
        finally:
            s.close()

    def check_pipelined(self, seq, stagger=True):
        want = self.expected([("GET", BIG)] * (FILL if stagger else 0) + list(seq))
        got = self.pipelined(seq, stagger=stagger)
        self.assertEqual(len(got), len(want))
        # assertTrue: a diff of megabytes says nothing more than "differ".
        self.assertTrue(got == want, "pipelined answers differ from the answers one by one")

    def test_pages_are_complete_and_large(self):
        sizes = {}
        for path in (BIG, MID, SMALL):
            r = self.d.request("GET", path)
            self.assertEqual(r.status, 200)
            j = r.json()
            self.assertIsNone(j["next_page_token"])
            sizes[path] = len(r.body)
        # Both sides of the size at which the daemon stops copying bodies.
        self.assertGreater(sizes[BIG], 200000)
        self.assertGreater(sizes[MID], 16384)
        self.assertLess(sizes[SMALL], 16384)

    def test_pipelined_small_big_small_slow_reader(self):
        seq = [("GET", "/livez"), ("GET", BIG), ("GET", "/livez"), ("GET", "/nope"),
               ("GET", MID), ("GET", BIG), ("HEAD", BIG), ("GET", "/v1/limits"),
               ("GET", SMALL), ("GET", BIG), ("GET", MID), ("GET", "/livez")]
        self.check_pipelined(seq * 3)
        self.check_pipelined(seq, stagger=False)

    def test_many_big_pipelined(self):
        """More large answers than the connection holds as separate buffers
        at once: the later ones are copied, all arrive in order."""
        seq = []
        for i in range(40):
            seq += [("GET", BIG if i % 3 else MID), ("GET", "/livez")]
        self.check_pipelined(seq, stagger=False)

    def test_head_of_big_answer(self):
        head = self.one_by_one("HEAD", BIG)
        get = self.one_by_one("GET", BIG)
        self.assertTrue(head.endswith(b"\r\n\r\n"))
        self.assertTrue(get.startswith(head), "HEAD must give GET's status and headers")
        self.assertGreater(len(get) - len(head), 200000)
        seq = [("HEAD", BIG), ("GET", "/livez"), ("HEAD", BIG), ("GET", BIG), ("HEAD", MID),
               ("GET", "/livez")]
        self.check_pipelined(seq)

    def test_big_answer_then_connection_close(self):
        close = ("GET", BIG, {"Connection": "close"})
        seq = [("GET", BIG), ("GET", "/livez"), close, ("GET", "/livez"), ("GET", BIG)]
        want = self.expected([("GET", BIG)] * FILL + seq[:3])
        self.assertIn(b"\r\nConnection: close\r\n", self.one_by_one(*close))
        got = self.pipelined(seq, eof=True, total=len(want))
        # The answers up to the one that closes, then nothing but the close.
        self.assertEqual(len(got), len(want))
        self.assertTrue(got == want)

    def test_http10_big_answer_closes(self):
        s = small_rcvbuf_socket(self.d.addr)
        try:
            s.sendall(build_request("GET", BIG, version="1.0"))
            time.sleep(0.2)
            got = slow_read(s, 1 << 30, eof=True)
        finally:
            s.close()
        head, _, body = got.partition(b"\r\n\r\n")
        self.assertIn(b"\r\nContent-Length: %d" % len(body), head)
        self.assertEqual(body, self.one_by_one("GET", BIG).partition(b"\r\n\r\n")[2])


def lists_answered(d):
    """keys_list answers built so far (counted when serialized)."""
    for line in d.request("GET", "/metrics").body.decode().splitlines():
        if line.startswith('kvidx_http_requests_total{route="keys_list",code_class="2xx"}'):
            return int(line.split()[-1])
    return 0


class OutputLimit(BigAnswers):
    """The bodies a connection holds count against max_conn_output_bytes:
    a client that pipelines large requests and reads nothing stops being
    read once the unsent answers pass the limit."""
    settings = {"max_conn_output_bytes": "64KiB"}

    def test_unread_big_answers_stop_reading(self):
        first = 40  # ~9 MB of answers: more than the socket's buffers take
        before = lists_answered(self.d)
        s = small_rcvbuf_socket(self.d.addr)
        try:
            s.sendall(b"".join(request_bytes("GET", BIG) for _ in range(first)))
            time.sleep(0.5)
            self.assertEqual(lists_answered(self.d) - before, first)
            # Megabytes are unsent, nearly all of them in bodies the
            # connection took: the next requests are not even read.
            s.sendall(b"".join(request_bytes("GET", BIG) for _ in range(10)))
            time.sleep(0.5)
            self.assertEqual(lists_answered(self.d) - before, first)
            # Once the client reads, everything arrives, in order.
            one = self.one_by_one("GET", BIG)
            got = slow_read(s, (first + 10) * len(one))
            self.assertTrue(got == one * (first + 10))
        finally:
            s.close()

    def test_unread_big_answers_freed_on_close(self):
        s = small_rcvbuf_socket(self.d.addr)
        try:
            s.sendall(b"".join(request_bytes("GET", BIG) for _ in range(60)))
            time.sleep(0.5)
        finally:
            s.close()  # most answers unsent: the close frees them (ASan)
        self.assertEqual(self.d.request("GET", "/livez").status, 200)


if __name__ == "__main__":
    unittest.main()
