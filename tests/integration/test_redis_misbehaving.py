"""l2_source = redis://... against a server that breaks the protocol: a fake
Redis on a free loopback port answers the source's session (CLIENT ID,
SUBSCRIBE, CONFIG GET, CLIENT TRACKING, SCAN, DBSIZE, PUBLISH delivered to
the subscribers) and then sends, one at a time, input that hiredis 0.14
would abort the process on: a reply no command asked for on the command
connection, and on the subscriber connection arrays too short, with a kind
or channel that is not a string, or an unsubscribe without a count. Each
time kvidxd must stay up, log one protocol error, drop the connection,
reconnect (a new subscriber connection, a new full scan) and answer /livez.
KVIDX_TEST_TRACE=1 prints what the source sends."""

import os
import re
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import Daemon  # noqa: E402
from redis_helper import free_port, wait_until  # noqa: E402

DEADLINE = 15.0
TRACE = bool(os.environ.get("KVIDX_TEST_TRACE"))
INV = b"__redis__:invalidate"


def bulk(b):
    return b"$%d\r\n%s\r\n" % (len(b), b)


def array(*items):
    return b"*%d\r\n" % len(items) + b"".join(items)


# What is pushed to the subscriber connection: hiredis 0.14 asserts on each
# but the last, which the source refuses as well (it subscribes to no
# pattern, and every unsubscribe message carries a count).
SUB_SHAPES = [
    ("one element", array(bulk(b"message"))),
    ("empty array", b"*0\r\n"),
    ("kind not a string", array(b":1\r\n", bulk(INV), bulk(b"x"))),
    ("kind a status", array(b"+message\r\n", bulk(INV), bulk(b"x"))),
    ("channel not a string", array(bulk(b"message"), b":1\r\n", bulk(b"x"))),
    ("channel nil", array(bulk(b"message"), b"$-1\r\n", bulk(b"x"))),
    ("unsubscribe without a count", array(bulk(b"unsubscribe"), bulk(INV), bulk(b"x"))),
    ("unsubscribe of two elements", array(bulk(b"unsubscribe"), bulk(INV))),
    ("punsubscribe without a count", array(bulk(b"punsubscribe"), bulk(b"p*"), b"$-1\r\n")),
]
# What follows the answer to the next command on the command connection,
# in the same write (hiredis 0.14 asserts: no command waits for it).
CMD_SHAPES = [
    ("an integer", b":1\r\n"),
    ("a status", b"+OK\r\n"),
    ("a pushed message", array(bulk(b"message"), bulk(INV), bulk(b"x"))),
]


def parse_command(buf):
    """(argv, rest) of the first RESP command in buf, or (None, buf)."""
    if not buf:
        return None, buf
    if not buf.startswith(b"*"):
        raise ValueError("not a RESP array: %r" % buf[:40])
    eol = buf.find(b"\r\n")
    if eol < 0:
        return None, buf
    n, off, argv = int(buf[1:eol]), eol + 2, []
    for _ in range(n):
        eol = buf.find(b"\r\n", off)
        if eol < 0:
            return None, buf
        ln = int(buf[off + 1:eol])
        if len(buf) < eol + 2 + ln + 2:
            return None, buf
        argv.append(buf[eol + 2:eol + 2 + ln])
        off = eol + 2 + ln + 2
    return argv, buf[off:]


class Conn:
    def __init__(self, server, sock, ident):
        self.server, self.sock, self.id = server, sock, ident
        self.channels = set()
        self.lock = threading.Lock()
        self.closed = False

    def send(self, data):
        with self.lock:
            try:
                self.sock.sendall(data)
            except OSError:
                pass

    def run(self):
        buf = b""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                buf += data
                while True:
                    argv, buf = parse_command(buf)
                    if argv is None:
                        break
                    self.answer(argv)
        except (OSError, ValueError) as e:
            if TRACE:
                print("conn %d: %r" % (self.id, e), file=sys.stderr)
        self.closed = True
        self.sock.close()

    def answer(self, argv):
        cmd = argv[0].upper()
        if TRACE:
            print("conn %d: %r" % (self.id, argv), file=sys.stderr)
        s = self.server
        if cmd == b"SUBSCRIBE":
            out = b""
            for i, ch in enumerate(argv[1:]):
                self.channels.add(ch)
                out += array(bulk(b"subscribe"), bulk(ch), b":%d\r\n" % (i + 1))
            self.send(out)
            with s.lock:
                s.subscribed.append(self)
            return
        if cmd == b"CLIENT" and len(argv) > 1 and argv[1].upper() == b"ID":
            out = b":%d\r\n" % self.id
        elif cmd == b"CONFIG" and len(argv) > 1 and argv[1].upper() == b"GET":
            out = array(bulk(b"notify-keyspace-events"), bulk(b"AKE"))
        elif cmd == b"SCAN":
            with s.lock:
                s.scans += 1
            out = array(bulk(b"0"), b"*0\r\n")
        elif cmd == b"DBSIZE":
            out = b":0\r\n"
        elif cmd == b"STRLEN":
            out = b":4\r\n"
        elif cmd == b"PUBLISH":
            n = 0
            with s.lock:
                subs = [c for c in s.subscribed if not c.closed and argv[1] in c.channels]
            for c in subs:
                c.send(array(bulk(b"message"), bulk(argv[1]), bulk(argv[2])))
                n += 1
            out = b":%d\r\n" % n
        elif cmd in (b"CLIENT", b"CONFIG", b"SELECT", b"AUTH"):
            out = b"+OK\r\n"
        else:
            out = b"-ERR unknown command '%s'\r\n" % cmd
        with s.lock:
            extra, s.cmd_extra = s.cmd_extra, None
        self.send(out + (extra or b""))


class FakeRedis:
    def __init__(self):
        self.port = free_port()
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", self.port))
        self.lsock.listen(16)
        self.lock = threading.Lock()
        self.subscribed = []  # subscriber connections, in order
        self.scans = 0
        self.cmd_extra = None  # sent after the next answer to a command
        self.conns = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        ident = 0
        while True:
            try:
                s, _ = self.lsock.accept()
            except OSError:
                return
            ident += 1
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c = Conn(self, s, ident)
            self.conns.append(c)
            threading.Thread(target=c.run, daemon=True).start()

    def stop(self):
        self.lsock.close()
        for c in self.conns:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class RedisMisbehavingTest(unittest.TestCase):
    def setUp(self):
        self.d = None
        self.srv = FakeRedis()
        self.addCleanup(self.cleanup)

    def cleanup(self):
        if self.d:
            self.d.kill()
        self.srv.stop()

    def start(self):
        self.d = Daemon(settings={"l2_source": "redis://127.0.0.1:%d/0" % self.srv.port,
                                  "l2_source_reconnect_max_ms": 300})
        self.live_session()

    def live_session(self):
        """Waits for a session that is subscribed and has scanned; returns
        its subscriber connection."""
        wait_until(lambda: self.d.request("GET", "/readyz").status == 200, DEADLINE,
                   "the first scan (/readyz 200)")

        def current():
            with self.srv.lock:
                subs = [c for c in self.srv.subscribed if not c.closed]
            return subs[-1] if subs else None
        wait_until(current, DEADLINE, "a subscriber connection")
        return current()

    def errors(self):
        """The node's own line for each failure (the source's state change
        repeats the reason)."""
        return len(re.findall(r"lost: protocol error: [^\n]*; reconnecting\n", self.d.log()))

    def expect_recovery(self, what, sub, scans, errors):
        """After one bad input: one more protocol error logged, the old
        subscriber connection dropped, a new one and a new scan, kvidxd up."""
        wait_until(lambda: not self.d.running() or self.errors() > errors, DEADLINE,
                   "%s: the protocol error in the log" % what)
        self.assertTrue(self.d.running(), "%s: kvidxd exited; log:\n%s"
                        % (what, self.d.log()[-4000:]))
        wait_until(lambda: sub.closed, DEADLINE, "%s: the connection dropped" % what)

        def reconnected():
            with self.srv.lock:
                return (self.srv.scans > scans and
                        any(not c.closed for c in self.srv.subscribed if c is not sub))
        wait_until(reconnected, DEADLINE, "%s: a new session (subscribed, scanned)" % what)
        self.assertEqual(self.d.request("GET", "/livez").status, 200, what)
        new = self.live_session()
        self.assertIsNot(new, sub, what)
        # Logged once per failure, not once per reply or per connection.
        self.assertEqual(self.errors(), errors + 1, "%s; log:\n%s" % (what, self.d.log()[-4000:]))
        return new

    def test_bad_pushes_on_the_subscriber_connection(self):
        self.start()
        sub = self.live_session()
        for what, data in SUB_SHAPES:
            with self.subTest(shape=what):
                scans, errors = self.srv.scans, self.errors()
                sub.send(data)
                sub = self.expect_recovery(what, sub, scans, errors)

    def test_replies_no_command_asked_for(self):
        self.start()
        sub = self.live_session()
        for what, data in CMD_SHAPES:
            with self.subTest(shape=what):
                scans, errors = self.srv.scans, self.errors()
                with self.srv.lock:
                    self.srv.cmd_extra = data
                # The probe (DBSIZE, PUBLISH) sends a command every second.
                sub = self.expect_recovery(what, sub, scans, errors)

    def test_cut_pushes_still_served(self):
        """A well-formed message split across writes is no protocol error."""
        self.start()
        sub = self.live_session()
        msg = array(bulk(b"message"), bulk(b"__keyevent@0__:del"), bulk(b"nokey"))
        for i in range(1, len(msg)):
            sub.send(msg[:i])
            time.sleep(0.002)
            sub.send(msg[i:])
        time.sleep(0.3)
        self.assertEqual(self.errors(), 0, self.d.log()[-4000:])
        self.assertFalse(sub.closed)
        self.assertEqual(self.d.request("GET", "/livez").status, 200)


if __name__ == "__main__":
    unittest.main()
