"""Shared helpers for kvidxd integration tests (Python 3 stdlib only).

Typical use::

    import unittest
    from harness import Daemon, http, raw

    class T(unittest.TestCase):
        def setUp(self):
            self.d = Daemon(settings={"log_level": "debug"})   # starts it
        def tearDown(self):
            self.d.kill()                                       # always safe
        def test_livez(self):
            r = self.d.request("GET", "/livez")
            self.assertEqual(r.status, 200)

API (everything bounded in time; default timeouts of a few seconds):

* ``Daemon(settings=None, args=None, config_text=None, env=None,
  notify=False, start=True)``: runs ``$KVIDXD`` with ``--set
  listen=127.0.0.1:0`` plus one ``--set name=value`` per settings item
  (values are str()'d), extra ``args``, and ``-c FILE`` when ``config_text``
  is given (written to a temp file, ``d.config_path``; rewrite it with
  ``d.write_config(text)`` before ``d.reload()``). ``notify=True`` creates a
  fake ``NOTIFY_SOCKET`` (AF_UNIX datagram); read it with
  ``d.notifications(timeout)`` / ``d.wait_notify("READY=1")``.
  stderr goes to ``d.log_path``; ``d.log()`` returns it so far,
  ``d.wait_log(regex, timeout)`` waits for a match. ``d.port`` and
  ``d.addr`` are the bound address (parsed from the "listening on" log line).
* ``d.request(method, path, body=None, headers=None, timeout=5)`` → a
  ``Response`` (status, reason, headers dict with lower-case names, body
  bytes, ``json()``); one request on a fresh connection with
  ``Connection: close``. ``body`` may be bytes, str or a JSON-able object
  (then Content-Type application/json is added unless given).
* ``d.connect(timeout=5)`` → a connected socket; ``send_all(sock, data)``;
  ``read_response(sock, head=False)`` reads exactly one HTTP/1.1 response
  (Content-Length or chunked) from a socket with its own read buffer
  (use ``Conn`` for several responses on one socket).
* ``Conn(d)``: a keep-alive connection: ``c.send(bytes)``,
  ``c.request(method, path, body=None, headers=None)`` (sends and reads one
  answer), ``c.read_response(head=False)``, ``c.closed_by_peer(timeout)``,
  ``c.close()``.
* ``d.stop(sig=SIGTERM, timeout=10)`` → exit code (the tests assert 0);
  ``d.reload()`` sends SIGHUP; ``d.send_signal(sig)`` sends any signal;
  ``d.kill()`` SIGKILLs if still running and
  cleans up temp files (call it in tearDown).
* ``build_request(method, path, body=b"", headers=None, version="1.1")``
  → raw bytes for pipelining tests.
"""

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time

__all__ = ["Daemon", "Conn", "Response", "build_request", "read_response",
           "send_all", "kvidxd_path", "source_dir"]

LISTEN_RE = re.compile(r"listening on (\[[^\]]+\]|[0-9.]+):(\d+)")


def kvidxd_path():
    """Path of the daemon under test: $KVIDXD, else build*/kvidxd near the source."""
    p = os.environ.get("KVIDXD")
    if p:
        return p
    src = source_dir()
    for d in ("build", "build-h2", "build-asan"):
        cand = os.path.join(src, d, "kvidxd")
        if os.access(cand, os.X_OK):
            return cand
    raise RuntimeError("set KVIDXD to the kvidxd binary")


def source_dir():
    return os.environ.get("KVIDX_SOURCE_DIR") or os.path.abspath(
        os.path.join(os.path.dirname(__file__), "..", ".."))


class Response:
    def __init__(self, status, reason, headers, body, version):
        self.status = status
        self.reason = reason
        self.headers = headers  # lower-case name -> value (last wins)
        self.body = body
        self.version = version

    def json(self):
        return json.loads(self.body.decode("utf-8"))

    def __repr__(self):
        return "<Response %d %r %r>" % (self.status, self.headers, self.body[:200])


def send_all(sock, data):
    if isinstance(data, str):
        data = data.encode()
    sock.sendall(data)


def build_request(method, path, body=b"", headers=None, version="1.1"):
    """Raw request bytes. Adds Host, and Content-Length when body is non-empty."""
    if isinstance(body, str):
        body = body.encode()
    elif body is not None and not isinstance(body, (bytes, bytearray)):
        body = json.dumps(body).encode()
        headers = dict(headers or {})
        headers.setdefault("Content-Type", "application/json")
    body = body or b""
    h = {"Host": "127.0.0.1"}
    h.update(headers or {})
    if body and not any(k.lower() in ("content-length", "transfer-encoding") for k in h):
        h["Content-Length"] = str(len(body))
    lines = ["%s %s HTTP/%s" % (method, path, version)]
    lines += ["%s: %s" % (k, v) for k, v in h.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + bytes(body)


class _Reader:
    """Buffered reader over a socket (keeps bytes between responses)."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.eof = False

    def _fill(self):
        if self.eof:
            raise EOFError("connection closed by peer")
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.eof = True
            raise EOFError("connection closed by peer")
        self.buf += chunk

    def line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        i = self.buf.index(b"\r\n")
        out, self.buf = self.buf[:i], self.buf[i + 2:]
        return out

    def exact(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self, head=False):
        status_line = self.line().decode("latin-1")
        parts = status_line.split(" ", 2)
        version, status = parts[0], int(parts[1])
        reason = parts[2] if len(parts) > 2 else ""
        headers = {}
        while True:
            ln = self.line()
            if not ln:
                break
            k, _, v = ln.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        body = b""
        if head or status in (204, 304) or 100 <= status < 200:
            pass
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int(self.line().split(b";")[0], 16)
                if size == 0:
                    while self.line():
                        pass
                    break
                body += self.exact(size)
                self.line()
        elif "content-length" in headers:
            body = self.exact(int(headers["content-length"]))
        else:
            try:
                while True:
                    self._fill()
            except EOFError:
                body, self.buf = self.buf, b""
        return Response(status, reason, headers, body, version)


def read_response(sock, head=False):
    """One response from sock. Bytes after it are lost: use Conn for more."""
    return _Reader(sock).response(head)


class Conn:
    """A keep-alive client connection to a Daemon."""

    def __init__(self, daemon, timeout=5.0):
        self.sock = daemon.connect(timeout)
        self.reader = _Reader(self.sock)

    def send(self, data):
        send_all(self.sock, data)

    def read_response(self, head=False):
        return self.reader.response(head)

    def request(self, method, path, body=b"", headers=None, version="1.1"):
        self.send(build_request(method, path, body, headers, version))
        return self.read_response(head=(method == "HEAD"))

    def closed_by_peer(self, timeout=3.0):
        """True when the peer closes (EOF or reset) within timeout; unread
        data is discarded."""
        self.sock.settimeout(timeout)
        end = time.monotonic() + timeout
        try:
            while time.monotonic() < end:
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False
        return False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


class Daemon:
    def __init__(self, settings=None, args=None, config_text=None, env=None,
                 notify=False, start=True, start_timeout=10.0):
        self.tmp = tempfile.mkdtemp(prefix="kvidxd-test-")
        self.log_path = os.path.join(self.tmp, "kvidxd.log")
        self.config_path = None
        self.settings = dict(settings or {})
        self.args = list(args or [])
        self.env = dict(os.environ)
        self.env.update(env or {})
        self.proc = None
        self.port = None
        self.host = None
        self.notify_sock = None
        self._notes = []
        if config_text is not None:
            self.write_config(config_text)
        if notify:
            path = os.path.join(self.tmp, "notify.sock")
            self.notify_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.notify_sock.bind(path)
            self.env["NOTIFY_SOCKET"] = path
        if start:
            self.start(start_timeout)

    # -- lifecycle -------------------------------------------------------
    def command(self):
        cmd = [kvidxd_path(), "--set", "listen=127.0.0.1:0"]
        if self.config_path:
            cmd += ["-c", self.config_path]
        for k, v in self.settings.items():
            cmd += ["--set", "%s=%s" % (k, v)]
        return cmd + self.args

    def start(self, timeout=10.0):
        self._logf = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL,
                                     stdout=self._logf, stderr=self._logf, env=self.env)
        m = self.wait_log(LISTEN_RE, timeout)
        if not m:
            self.kill()
            raise RuntimeError("kvidxd did not report its port; log:\n" + self.log())
        self.host = m.group(1).strip("[]")
        self.port = int(m.group(2))
        self.addr = (self.host, self.port)
        return self

    def write_config(self, text):
        self.config_path = self.config_path or os.path.join(self.tmp, "kvidxd.conf")
        with open(self.config_path, "w") as f:
            f.write(text)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def send_signal(self, sig):
        if self.running():
            self.proc.send_signal(sig)

    def reload(self):
        self.send_signal(signal.SIGHUP)

    def stop(self, sig=signal.SIGTERM, timeout=10.0):
        """Sends sig and waits; returns the exit code (None on timeout, then kills)."""
        if self.proc is None:
            return None
        self.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            return None

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if getattr(self, "_logf", None):
            self._logf.close()
            self._logf = None
        if self.notify_sock:
            self.notify_sock.close()
            self.notify_sock = None

    # -- log and notify --------------------------------------------------
    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def wait_log(self, pattern, timeout=5.0, start=0):
        """Waits until pattern (str or compiled regex) matches the log from
        offset start; returns the match or None."""
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        end = time.monotonic() + timeout
        while True:
            m = rx.search(self.log(), start)
            if m or time.monotonic() >= end:
                return m
            if self.proc is not None and self.proc.poll() is not None:
                return rx.search(self.log(), start)
            time.sleep(0.02)

    def notifications(self, timeout=0.5):
        """Every datagram received so far (waiting up to timeout for the first new one)."""
        if not self.notify_sock:
            return []
        self.notify_sock.settimeout(timeout)
        try:
            while True:
                self._notes.append(self.notify_sock.recv(4096).decode())
                self.notify_sock.settimeout(0.05)
        except (socket.timeout, BlockingIOError):
            pass
        return list(self._notes)

    def wait_notify(self, text, timeout=5.0):
        """True once a datagram containing the line `text` has arrived."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for n in self.notifications(0.1):
                if text in n.split("\n"):
                    return True
        return False

    # -- clients ---------------------------------------------------------
    def connect(self, timeout=5.0):
        s = socket.create_connection(self.addr, timeout)
        s.settimeout(timeout)
        return s

    def request(self, method, path, body=b"", headers=None, timeout=5.0):
        h = {"Connection": "close"}
        h.update(headers or {})
        s = self.connect(timeout)
        try:
            send_all(s, build_request(method, path, body, h))
            return read_response(s, head=(method == "HEAD"))
        finally:
            s.close()
