"""Redis/Valkey servers and a RESP client for the source tests (stdlib only).

* ``RedisServer(args=(), port=None)``: a ``redis-server`` of our own on a
  free 127.0.0.1 port (``free_cluster_port()`` for a cluster node) with a fresh temp dir, ``--save "" --appendonly no``
  unless ``args`` say otherwise; ``r.client()``; ``r.kill()`` (SIGKILL, by
  PID); ``r.restart(keep_dir=True)`` starts it again on the same port;
  ``r.stop()`` kills it and removes the dir (call it in tearDown). Never a
  system service.
* ``Client(port)``: ``c.cmd(*args)`` (one command, its reply: bytes, int,
  list, None, or a ``RedisError`` instance), ``c.pipeline(list_of_args)``.
* ``keyspace(client, prefix=None)``: {canonical key string: STRLEN} of every
  LMCache key (SCAN + STRLEN), as kvidx should list it.
* ``kvidx_keys(daemon)``: {canonical: size_bytes} of a full kvidx listing.
* ``wait_until(fn, timeout, what)``: polls fn() until truthy, with a deadline.
* ``lmc_key(i, prefix=None, model="m/llama", salt="")``: an LMCache wire key.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse

__all__ = ["RedisServer", "Client", "RedisError", "keyspace", "kvidx_keys", "wait_until",
           "lmc_key", "canonical", "free_port", "free_cluster_port", "have_redis"]


def have_redis():
    return shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def free_cluster_port():
    """A free port for a cluster node: at most 55535, since the node also
    listens on its port + 10000 (the cluster bus), which must be free too."""
    for _ in range(1000):
        p = free_port()
        if p > 55535:
            continue
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p + 10000))
        except OSError:
            continue
        finally:
            s.close()
        return p
    raise RuntimeError("no free port pair for a cluster node")


class RedisError(Exception):
    pass


class Client:
    def __init__(self, port, timeout=10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout)
        self.buf = b""

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    @staticmethod
    def encode(args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            if not isinstance(a, (bytes, bytearray)):
                a = str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def read(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t == b"+":
            return rest
        if t == b"-":
            return RedisError(rest.decode(errors="replace"))
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise ValueError("bad RESP line %r" % line)

    def cmd(self, *args):
        self.sock.sendall(self.encode(args))
        return self.read()

    def pipeline(self, cmds, chunk=2000):
        out = []
        for i in range(0, len(cmds), chunk):
            part = cmds[i:i + chunk]
            self.sock.sendall(b"".join(self.encode(c) for c in part))
            out += [self.read() for _ in part]
        return out


class RedisServer:
    def __init__(self, args=(), port=None, name="redis"):
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="kvidx-%s-" % name)
        self.args = list(args)
        self.proc = None
        self.start()

    def command(self):
        base = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", self.dir, "--daemonize", "no", "--logfile", os.path.join(self.dir, "log"),
                "--protected-mode", "no"]
        if "--save" not in self.args:
            base += ["--save", ""]
        if "--appendonly" not in self.args:
            base += ["--appendonly", "no"]
        return base + self.args

    def start(self, timeout=10.0):
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                c = Client(self.port, 1.0)
                r = c.cmd("PING")
                c.close()
                if r == b"PONG" or isinstance(r, RedisError):
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.log()[-2000:]
                self.kill()
                shutil.rmtree(self.dir, ignore_errors=True)
                raise RuntimeError("redis-server did not start: " + log)
            time.sleep(0.05)

    def log(self):
        try:
            with open(os.path.join(self.dir, "log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def client(self):
        return Client(self.port)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def restart(self, keep_dir=True):
        self.kill()
        if not keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            os.makedirs(self.dir)
        self.start()

    def stop(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def lmc_key(i, prefix=None, model="m/llama", salt="", group=0, rank=0x01000100):
    h = "%016x" % (i * 2654435761 % (1 << 64))
    k = "%s@%08x@%x@%s" % (model, rank, group, h)
    if salt:
        k += "@" + salt
    return (prefix + "@" + k) if prefix else k


def canonical(key_obj):
    k = "%s@%08x@%x@%s" % (key_obj["model_name"], key_obj["kv_rank"], key_obj["object_group_id"],
                           key_obj["chunk_hash_hex"])
    if key_obj["cache_salt"]:
        k += "@" + key_obj["cache_salt"]
    return k


def _is_wire_key(rest):
    f = rest.split("@")
    if len(f) not in (4, 5):
        return False
    model, rank, group, h = f[:4]
    if not model or len(rank) != 8 or any(c not in "0123456789abcdef" for c in rank + group + h):
        return False
    if not group or (len(group) > 1 and group[0] == "0") or int(group, 16) > 65535:
        return False
    if len(h) < 2 or len(h) > 128 or len(h) % 2:
        return False
    if len(f) == 5 and (not f[4] or any(c in f[4] for c in "/\\")):
        return False
    return True


def keyspace(client, prefix=None):
    """{canonical: STRLEN} of the LMCache string keys in the client's db."""
    names, cur = [], b"0"
    while True:
        cur, batch = client.cmd("SCAN", cur, "COUNT", 1000)
        names += batch
        if cur == b"0":
            break
    out = {}
    names = sorted(set(names))
    types = client.pipeline([("TYPE", n) for n in names])
    lens = client.pipeline([("STRLEN", n) for n in names])
    for n, t, ln in zip(names, types, lens):
        s = n.decode(errors="replace")
        if prefix:
            if not s.startswith(prefix + "@"):
                continue
            s = s[len(prefix) + 1:]
        if t != b"string" or not isinstance(ln, int) or ln <= 0 or not _is_wire_key(s):
            continue
        out[s] = ln
    return out


def kvidx_keys(daemon):
    """{canonical: size_bytes} of a full listing of the daemon."""
    out, tok = {}, None
    for _ in range(100000):
        q = {"page_size": 5000}
        if tok:
            q["page_token"] = tok
        r = daemon.request("GET", "/v1/keys?" + urllib.parse.urlencode(q), timeout=30)
        if r.status != 200:
            raise AssertionError("listing answered %d: %r" % (r.status, r.body[:300]))
        j = r.json()
        for e in j["entries"]:
            out[canonical(e["key"])] = e["size_bytes"]
        tok = j["next_page_token"]
        if tok is None:
            return out
    raise AssertionError("listing does not end")


def wait_until(fn, timeout=10.0, what="condition", interval=0.05):
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.1f s waiting for %s" % (timeout, what))
        time.sleep(interval)
