"""A cache-event emitter that talks to a coordinator the way LMCache's MP
server does (its CacheEventSubscriber with the HTTP sink, and its
registrar), for the fleet directory's integration tests and benchmarks.
Python 3 stdlib only.

* Events are buffered into one pending batch per (event_type, tier,
  backend, shared), in first-use order; a flush turns each into one
  CacheEventBatch, stamps consecutive seq numbers from 1 (per emitter
  object, i.e. per incarnation) and ts, and sends them all in one
  ``POST /events``. ``tick()`` flushes when ``flush_interval`` has passed.
* A failed flush drops its batches: their seq numbers are consumed, so the
  coordinator sees a gap (LMCache's HTTP sink cannot repair it either).
  ``skip_flush()`` does the same on purpose.
* ``incarnation`` defaults to the start time in whole seconds; a restarted
  server is a new emitter object with a higher one.
* Registration: ``register()`` POSTs /instances; ``heartbeat()`` PUTs
  /instances/{id}/heartbeat and registers again on 404; ``start_heartbeats``
  runs them every ``heartbeat_interval`` seconds (LMCache: 5) in a thread.
* ``sent`` keeps every request body sent, so a test can replay one.
"""

import http.client
import json
import threading
import time
import urllib.parse


def key(model, chunk_hash_hex, kv_rank=0, group=0, salt=""):
    return {"model_name": model, "kv_rank": kv_rank, "object_group_id": group,
            "chunk_hash_hex": chunk_hash_hex, "cache_salt": salt}


def post_json(host, port, method, path, obj, timeout=10.0):
    """One request on a fresh connection: (status, parsed body or None)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        body = b"" if obj is None else json.dumps(obj).encode()
        headers = {"Content-Type": "application/json"} if obj is not None else {}
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = None
        return r.status, parsed
    finally:
        conn.close()


class Emitter:
    def __init__(self, host, port, instance_id, incarnation=None,
                 flush_interval=1.0, heartbeat_interval=5.0, ip="127.0.0.1",
                 http_port=8080):
        self.host, self.port = host, port
        self.instance_id = instance_id
        self.incarnation = int(time.time()) if incarnation is None else incarnation
        self.flush_interval = flush_interval
        self.heartbeat_interval = heartbeat_interval
        self.ip, self.http_port = ip, http_port
        self.seq = 0
        self.pending = {}  # (event_type, tier, backend, shared) -> entries, insertion order
        self.last_flush = time.monotonic()
        self.sent = []      # every body sent, in order
        self.results = []   # (status, answer) per flush
        self.registrations = 0
        self._hb_stop = threading.Event()
        self._hb_thread = None
        self._lock = threading.Lock()

    # ---- events ----
    def _add(self, event_type, tier, backend, shared, entry):
        with self._lock:
            self.pending.setdefault((event_type, tier, backend, shared), []).append(entry)

    def store(self, tier, backend, k, size_bytes, token_ids=None, token_offset=-1,
              shared=False):
        e = {"key": k, "size_bytes": size_bytes}
        if token_ids:
            e["token_ids"] = list(token_ids)
            e["token_offset"] = token_offset
        self._add("store", tier, backend, shared, e)

    def delete(self, tier, backend, k, shared=False):
        self._add("delete", tier, backend, shared, {"key": k})

    def access(self, tier, k):
        # LMCache's access batches carry no backend.
        self._add("access", tier, "", False, {"key": k})

    def _take(self):
        with self._lock:
            batches = []
            for (et, tier, backend, shared), entries in self.pending.items():
                self.seq += 1
                batches.append({"instance_id": self.instance_id,
                                "incarnation": self.incarnation, "seq": self.seq,
                                "event_type": et, "tier": tier, "backend": backend,
                                "entries": entries, "shared": shared,
                                "ts": time.time(), "capacity_bytes": 0,
                                "capacity_revision": 0})
            self.pending = {}
            self.last_flush = time.monotonic()
            return batches

    def flush(self):
        """Sends every pending batch in one request: the answer, or None when
        there was nothing to send."""
        batches = self._take()
        if not batches:
            return None
        body = {"batches": batches}
        self.sent.append(body)
        try:
            status, ans = post_json(self.host, self.port, "POST", "/events", body)
        except OSError:
            status, ans = None, None
        self.results.append((status, ans))
        return status, ans

    def skip_flush(self):
        """Takes the pending batches and loses them (a failed delivery):
        their seq numbers are consumed. Returns the lost batches."""
        return self._take()

    def tick(self):
        if time.monotonic() - self.last_flush >= self.flush_interval:
            return self.flush()
        return None

    def replay(self, index):
        """Sends an earlier request body again, unchanged."""
        return post_json(self.host, self.port, "POST", "/events", self.sent[index])

    # ---- registration ----
    def register(self):
        status, ans = post_json(self.host, self.port, "POST", "/instances",
                                {"instance_id": self.instance_id, "ip": self.ip,
                                 "http_port": self.http_port, "metadata": {}})
        if status == 200:
            self.registrations += 1
        return status, ans

    def heartbeat(self):
        path = "/instances/%s/heartbeat" % urllib.parse.quote(self.instance_id, safe="")
        status, ans = post_json(self.host, self.port, "PUT", path, None)
        if status == 404:
            self.register()
        return status

    def start_heartbeats(self):
        def loop():
            while not self._hb_stop.wait(self.heartbeat_interval):
                try:
                    self.heartbeat()
                except OSError:
                    pass
        self._hb_stop.clear()
        self._hb_thread = threading.Thread(target=loop, daemon=True)
        self._hb_thread.start()

    def stop_heartbeats(self):
        self._hb_stop.set()
        if self._hb_thread:
            self._hb_thread.join(timeout=5)
            self._hb_thread = None

    def deregister(self):
        path = "/instances/%s" % urllib.parse.quote(self.instance_id, safe="")
        return post_json(self.host, self.port, "DELETE", path, None)[0]
