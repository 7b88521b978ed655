"""Operations surface of kvidxd (docs/operations.md): --check-config, /livez, /readyz,
/metrics (parsed as Prometheus text 0.0.4), /v1/stats, /v1/limits (reflecting
--set, the file and SIGHUP), json logs, and the systemd units
(systemd-analyze verify, skipped when the tool is missing).

The notify protocol itself (READY=1, STOPPING=1) is covered by H2's server
tests; here only the parts that belong to configuration and operations.
"""

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, kvidxd_path, source_dir  # noqa: E402

CONF = os.path.join(source_dir(), "conf", "kvidxd.conf")

LIMITS = {
    "max_body_bytes": 64 << 20,
    "max_keys_per_request": 262144,
    "max_header_bytes": 16 << 10,
    "max_uri_bytes": 8 << 10,
    "max_json_depth": 32,
    "header_timeout_ms": 10000,
    "idle_timeout_ms": 60000,
    "max_connections": 10000,
    "max_conn_output_bytes": 64 << 20,
    "page_token_ttl_s": 3600,
    "default_lease_ms": 30000,
    "max_lease_ms": 600000,
    "handle_grace_ms": 60000,
    "load_timeout_ms": 10000,
}


def run(args, timeout=10):
    return subprocess.run([kvidxd_path()] + args, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


# ---- a small Prometheus text-format (0.0.4) parser ----------------------

METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE_RE = re.compile(r"^(%s)(\{(.*)\})? (\S+)$" % METRIC_NAME)
LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')


def parse_labels(text):
    labels, pos = {}, 0
    while pos < len(text):
        m = LABEL_RE.match(text, pos)
        if not m:
            raise ValueError("bad labels: %r" % text)
        labels[m.group(1)] = re.sub(r"\\(.)", lambda x: {"n": "\n"}.get(x.group(1), x.group(1)),
                                    m.group(2))
        pos = m.end()
    return labels


def parse_prometheus(text):
    """Returns {family: {"type", "help", "samples": [(name, labels, value)]}};
    raises AssertionError when the exposition breaks the format's rules."""
    fams, current = {}, None
    assert text.endswith("\n"), "exposition ends with a newline"
    for line in text.split("\n")[:-1]:
        assert line, "no empty lines"
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert re.fullmatch(METRIC_NAME, name), name
            assert name not in fams, "second HELP for " + name
            assert help_text, "empty HELP for " + name
            fams[name] = {"type": None, "help": help_text, "samples": []}
            current = name
        elif line.startswith("# TYPE "):
            name, _, typ = line[7:].partition(" ")
            assert name == current, "TYPE %s right after its HELP" % name
            assert fams[name]["type"] is None and not fams[name]["samples"]
            assert typ in ("counter", "gauge", "histogram", "summary", "untyped"), typ
            fams[name]["type"] = typ
        elif line.startswith("#"):
            continue
        else:
            m = SAMPLE_RE.match(line)
            assert m, "bad sample line %r" % line
            name, labels, value = m.group(1), parse_labels(m.group(3) or ""), m.group(4)
            fam = name
            if fam not in fams:
                for suf in ("_bucket", "_sum", "_count"):
                    if name.endswith(suf) and fams.get(name[:-len(suf)], {}).get("type") == "histogram":
                        fam = name[:-len(suf)]
            assert fam in fams, "sample %s before its HELP/TYPE" % name
            assert fam == current, "samples of %s are not contiguous" % fam
            assert fams[fam]["type"], "sample before TYPE: " + name
            v = float(value)  # accepts +Inf, NaN
            fams[fam]["samples"].append((name, labels, v))
    for name, f in fams.items():
        if f["type"] == "counter":
            assert name.endswith("_total"), "counter %s must end in _total" % name
        else:
            assert not name.endswith("_total"), "%s %s ends in _total" % (f["type"], name)
        if f["type"] == "histogram":
            check_histogram(name, f["samples"])
    return fams


def check_histogram(name, samples):
    series = {}
    for sname, labels, v in samples:
        key = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
        s = series.setdefault(key, {"buckets": [], "sum": None, "count": None})
        if sname == name + "_bucket":
            s["buckets"].append((float(labels["le"]), v))
        elif sname == name + "_sum":
            s["sum"] = v
        elif sname == name + "_count":
            s["count"] = v
    for key, s in series.items():
        les = [le for le, _ in s["buckets"]]
        assert les == sorted(les) and len(set(les)) == len(les), "le rises: %r" % (key,)
        assert les and math.isinf(les[-1]), "+Inf bucket last: %r" % (key,)
        counts = [c for _, c in s["buckets"]]
        assert counts == sorted(counts), "buckets cumulative: %r" % (key,)
        assert s["count"] == counts[-1], "+Inf == _count: %r" % (key,)
        assert s["sum"] is not None and s["sum"] >= 0


def value(fams, name, **labels):
    """The first sample called name whose labels include labels; None when absent."""
    fam = fams.get(name)
    for suf in ("_bucket", "_sum", "_count"):
        if fam is None and name.endswith(suf):
            fam = fams.get(name[:-len(suf)])
    if fam is None:
        return None
    for sname, lab, v in fam["samples"]:
        if sname == name and all(lab.get(k) == x for k, x in labels.items()):
            return v
    return None


class ParserSelfTest(unittest.TestCase):
    """The parser above must reject what a scraper would reject."""

    def test_rejects(self):
        bad = [
            "x_total 1\n",                                         # no HELP/TYPE
            "# HELP x h\n# TYPE x counter\nx 1\n",                 # counter without _total
            "# HELP a h\n# TYPE a gauge\na 1\n# HELP b h\n# TYPE b gauge\nb 1\na 2\n",
            "# HELP h h\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
            "h_sum 1\nh_count 1\n",                                # not cumulative
            "# HELP h h\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n",
            "# HELP g h\n# TYPE g gauge\ng{a=\"x} 1\n",            # bad labels
        ]
        for text in bad:
            with self.assertRaises((AssertionError, ValueError), msg=text):
                parse_prometheus(text)

    def test_accepts(self):
        f = parse_prometheus('# HELP h h\n# TYPE h histogram\nh_bucket{r="a\\"b",le="0.1"} 1\n'
                             'h_bucket{r="a\\"b",le="+Inf"} 2\nh_sum{r="a\\"b"} 0.3\n'
                             'h_count{r="a\\"b"} 2\n')
        self.assertEqual(f["h"]["samples"][0][1]["r"], 'a"b')


# ---- --check-config -----------------------------------------------------

class CheckConfig(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kvidx-ops-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write(self, text):
        path = os.path.join(self.tmp, "k.conf")
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_shipped_conf_is_valid(self):
        r = run(["-c", CONF, "--check-config"])
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_no_config_is_valid(self):
        self.assertEqual(run(["--check-config"]).returncode, 0)

    def test_good_file_and_sets(self):
        path = self.write("max_body_bytes = 1MiB\nlog_format = json\n# comment\n")
        r = run(["-c", path, "--set", "max_keys_per_request=10", "--check-config"])
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_bad_value_names_setting_and_line(self):
        path = self.write("log_level = info\nmax_body_bytes = lots\n")
        r = run(["-c", path, "--check-config"])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("%s:2:" % path, r.stderr)
        self.assertIn("max_body_bytes", r.stderr)
        self.assertIn("64MiB", r.stderr)  # says what is expected

    def test_unknown_setting_in_file(self):
        path = self.write("max_bodybytes = 1MiB\n")
        r = run(["-c", path, "--check-config"])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("unknown setting 'max_bodybytes'", r.stderr)

    def test_section_rejected(self):
        path = self.write("[kvidxd]\nlisten = 127.0.0.1:0\n")
        r = run(["-c", path, "--check-config"])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("sections are not used", r.stderr)

    def test_bad_set(self):
        for arg, needle in [("fsync=sometimes", "fsync"),
                            ("max_connections=0", "max_connections"),
                            ("listen=localhost", "listen"),
                            ("nosuch=1", "unknown setting 'nosuch'")]:
            r = run(["--set", arg, "--check-config"])
            self.assertNotEqual(r.returncode, 0, arg)
            self.assertIn(needle, r.stderr, arg)

    def test_huge_value_not_echoed(self):
        r = run(["--set", "max_body_bytes=" + "9" * 5000 + "x", "--check-config"])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("max_body_bytes", r.stderr)
        self.assertLess(len(r.stderr), 400)

    def test_cross_check(self):
        r = run(["--set", "default_lease_ms=700000", "--check-config"])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("default_lease_ms", r.stderr)

    def test_missing_file(self):
        r = run(["-c", os.path.join(self.tmp, "absent.conf"), "--check-config"])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("absent.conf", r.stderr)


# ---- endpoints -----------------------------------------------------------

class Endpoints(unittest.TestCase):
    def setUp(self):
        self.d = Daemon()

    def tearDown(self):
        self.d.kill()

    def test_livez(self):
        r = self.d.request("GET", "/livez")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json(), {"status": "ok"})
        self.assertTrue(r.headers["content-type"].startswith("application/json"))

    def test_readyz(self):
        r = self.d.request("GET", "/readyz")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json()["status"], "ready")

    def test_metrics(self):
        for _ in range(3):
            self.assertEqual(self.d.request("GET", "/livez").status, 200)
        self.d.request("GET", "/no/such/path")
        r = self.d.request("GET", "/metrics")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8")
        fams = parse_prometheus(r.body.decode("utf-8"))
        for name in ("kvidx_http_requests_total", "kvidx_http_request_duration_seconds",
                     "kvidx_connections_open", "kvidx_connections_accepted_total",
                     "kvidx_connections_rejected_total", "kvidx_up", "process_start_time_seconds"):
            self.assertIn(name, fams)
        self.assertEqual(fams["kvidx_http_request_duration_seconds"]["type"], "histogram")
        self.assertGreaterEqual(
            value(fams, "kvidx_http_requests_total", route="livez", code_class="2xx"), 3)
        self.assertGreaterEqual(
            value(fams, "kvidx_http_request_duration_seconds_count", route="livez",
                  code_class="2xx"), 3)
        self.assertGreaterEqual(
            value(fams, "kvidx_http_requests_total", route="unknown", code_class="4xx"), 1)
        # Connections: at least the 5 above were accepted; this one is open.
        self.assertGreaterEqual(value(fams, "kvidx_connections_accepted_total"), 5)
        self.assertGreaterEqual(value(fams, "kvidx_connections_open"), 1)
        self.assertEqual(value(fams, "kvidx_up"), 1)

    def test_head_metrics(self):
        r = self.d.request("HEAD", "/metrics")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.body, b"")

    def test_stats(self):
        self.d.request("GET", "/livez")
        r = self.d.request("GET", "/v1/stats")
        self.assertEqual(r.status, 200)
        s = r.json()
        self.assertIsInstance(s["version"], str)
        self.assertIsInstance(s["uptime_ms"], int)
        self.assertTrue(s["ready"])
        self.assertGreaterEqual(s["connections"]["accepted"], 2)
        self.assertGreaterEqual(s["connections"]["open"], 1)
        self.assertEqual(s["connections"]["rejected"], 0)
        self.assertGreaterEqual(s["requests"]["total"], 1)

    def test_limits_defaults(self):
        r = self.d.request("GET", "/v1/limits")
        self.assertEqual(r.status, 200)
        got = r.json()
        for k, v in LIMITS.items():
            self.assertEqual(got[k], v, k)

    def test_wrong_method(self):
        r = self.d.request("POST", "/livez", body=b"{}")
        self.assertEqual(r.status, 405)


class LimitsFromSettings(unittest.TestCase):
    def test_set_values_published(self):
        sets = {"max_body_bytes": "1MiB", "max_keys_per_request": 1000,
                "max_header_bytes": "32KiB", "max_uri_bytes": "4KiB", "max_json_depth": 16,
                "header_timeout_ms": 5000, "idle_timeout_ms": 7000, "max_connections": 50,
                "max_conn_output_bytes": "1MiB", "page_token_ttl_s": 60,
                "default_lease_ms": 1000, "max_lease_ms": 2000, "handle_grace_ms": 0,
                "load_timeout_ms": 1500}
        d = Daemon(settings=sets)
        try:
            got = d.request("GET", "/v1/limits").json()
        finally:
            d.kill()
        self.assertEqual(got["max_body_bytes"], 1 << 20)
        self.assertEqual(got["max_header_bytes"], 32 << 10)
        self.assertEqual(got["max_uri_bytes"], 4 << 10)
        self.assertEqual(got["max_conn_output_bytes"], 1 << 20)
        for k in ("max_keys_per_request", "max_json_depth", "header_timeout_ms",
                  "idle_timeout_ms", "max_connections", "page_token_ttl_s", "default_lease_ms",
                  "max_lease_ms", "handle_grace_ms", "load_timeout_ms"):
            self.assertEqual(got[k], int(sets[k]), k)

    def test_command_line_wins_and_reload(self):
        d = Daemon(config_text="max_keys_per_request = 100\nmax_body_bytes = 2MiB\n",
                   settings={"max_keys_per_request": 200})
        try:
            got = d.request("GET", "/v1/limits").json()
            self.assertEqual(got["max_keys_per_request"], 200)
            self.assertEqual(got["max_body_bytes"], 2 << 20)
            # SIGHUP: a reloadable limit changes, --set still wins, a
            # setting that needs a restart is kept and logged.
            d.write_config("max_keys_per_request = 100\nmax_body_bytes = 3MiB\n"
                           "fsync = always\n")
            mark = len(d.log())
            d.reload()
            self.assertTrue(d.wait_log(r"reload: \d+ setting", 5, mark), d.log())
            got = d.request("GET", "/v1/limits").json()
            self.assertEqual(got["max_body_bytes"], 3 << 20)
            self.assertEqual(got["max_keys_per_request"], 200)
            self.assertIn("fsync", d.log()[mark:])
            # A broken file keeps everything as it was.
            d.write_config("max_body_bytes = lots\n")
            mark = len(d.log())
            d.reload()
            self.assertTrue(d.wait_log(r"max_body_bytes", 5, mark), d.log())
            self.assertEqual(d.request("GET", "/v1/limits").json()["max_body_bytes"], 3 << 20)
            self.assertEqual(d.stop(), 0)
        finally:
            d.kill()


class JsonLogs(unittest.TestCase):
    def test_every_line_is_json(self):
        d = Daemon(settings={"log_format": "json", "log_level": "debug"})
        try:
            d.request("GET", "/livez")
            self.assertEqual(d.stop(), 0)
            lines = [ln for ln in d.log().split("\n") if ln]
        finally:
            d.kill()
        self.assertTrue(lines)
        for ln in lines:
            obj = json.loads(ln)
            self.assertEqual(set(obj), {"ts", "level", "msg"}, ln)
            self.assertIn(obj["level"], ("error", "warn", "info", "debug"))
            self.assertRegex(obj["ts"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        self.assertTrue(any("listening on" in json.loads(ln)["msg"] for ln in lines))

    def test_text_format(self):
        d = Daemon()
        try:
            line = d.log().split("\n")[0]
        finally:
            d.kill()
        self.assertRegex(line, r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (error|warn|info|debug) ")


class Systemd(unittest.TestCase):
    @unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze not installed")
    def test_units_verify(self):
        tmp = tempfile.mkdtemp(prefix="kvidx-unit-")
        try:
            # The unit names /usr/local/bin/kvidxd; verify a copy that runs
            # the binary under test, so a missing install is not an error.
            with open(os.path.join(source_dir(), "systemd", "kvidxd.service")) as f:
                unit = f.read()
            self.assertIn("ExecStart=/usr/local/bin/kvidxd ", unit)
            unit = unit.replace("ExecStart=/usr/local/bin/kvidxd ",
                                "ExecStart=%s " % os.path.abspath(kvidxd_path()))
            with open(os.path.join(tmp, "kvidxd.service"), "w") as f:
                f.write(unit)
            shutil.copy(os.path.join(source_dir(), "systemd", "kvidxd.socket"), tmp)
            r = subprocess.run(["systemd-analyze", "verify",
                                os.path.join(tmp, "kvidxd.service"),
                                os.path.join(tmp, "kvidxd.socket")],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_unit_contents(self):
        with open(os.path.join(source_dir(), "systemd", "kvidxd.service")) as f:
            unit = f.read()
        for line in ("Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "WatchdogSec=30",
                     "DynamicUser=yes", "StateDirectory=kvidxd", "ProtectSystem=strict",
                     "NoNewPrivileges=yes", "CapabilityBoundingSet=\n", "KillSignal=SIGTERM"):
            self.assertIn(line, unit)
        with open(os.path.join(source_dir(), "systemd", "kvidxd.socket")) as f:
            self.assertIn("ListenStream=127.0.0.1:8077", f.read())


if __name__ == "__main__":
    unittest.main(verbosity=2)
