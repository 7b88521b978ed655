"""scripts/check_layers.py on small made-up trees: it must pass a clean one
and name each kind of problem it exists to find."""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.environ.get("KVIDX_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                      "scripts", "check_layers.py")


def run(tree):
    with tempfile.TemporaryDirectory() as root:
        for path, text in tree.items():
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        p = subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)
        return p.returncode, p.stdout


CLEAN = {
    "lib/key.c": '#include "kvidx/key.h"\n',
    "lib/include/kvidx/key.h": "",
    "daemon/util/log.c": '#include "util/log.h"\n',
    "daemon/util/log.h": "",
    "daemon/net/conn.c": '#include "net/conn.h"\n#include "util/log.h"\n#include "kvidx/key.h"\n',
    "daemon/net/conn.h": "",
    "daemon/state/store.c": '#include "net/conn.h"\n',
    "daemon/api/keys.c": '#include "state/store.h"\n#include "state/store.h"\n',
    "daemon/state/store.h": "",
    "daemon/app.c": '#include "api/keys.h"\n#include "net/conn.h"\n',
    "daemon/api/keys.h": "",
}


class CheckLayers(unittest.TestCase):
    def test_clean_tree_passes(self):
        rc, out = run(CLEAN)
        self.assertEqual(rc, 0, out)
        self.assertIn("0 problem(s)", out)

    def test_upward_include_fails(self):
        tree = dict(CLEAN)
        tree["daemon/net/conn.c"] += '#include "state/store.h"\n'
        rc, out = run(tree)
        self.assertEqual(rc, 1)
        self.assertIn("upward include: daemon/net/conn.c", out)

    def test_lib_reaching_daemon_fails(self):
        tree = dict(CLEAN)
        tree["lib/key.c"] += '#include "../daemon/util/log.h"\n'
        rc, out = run(tree)
        self.assertEqual(rc, 1)
        self.assertIn("upward include: lib/key.c", out)

    def test_lib_including_a_daemon_library_fails(self):
        tree = dict(CLEAN)
        tree["lib/key.c"] += "#include <uv.h>\n"
        rc, out = run(tree)
        self.assertEqual(rc, 1)
        self.assertIn("lib includes a daemon library: lib/key.c", out)

    def test_cycle_in_one_layer_fails(self):
        tree = dict(CLEAN)
        tree["daemon/util/a.c"] = '#include "util/a.h"\n#include "util/b.h"\n'
        tree["daemon/util/a.h"] = ""
        tree["daemon/util/b.c"] = '#include "util/b.h"\n#include "util/a.h"\n'
        tree["daemon/util/b.h"] = ""
        rc, out = run(tree)
        self.assertEqual(rc, 1)
        self.assertIn("include cycle: daemon/util/a <-> daemon/util/b", out)

    def test_long_file_fails(self):
        tree = dict(CLEAN)
        tree["daemon/util/log.c"] += "int x;\n" * 901
        rc, out = run(tree)
        self.assertEqual(rc, 1)
        self.assertIn("daemon/util/log.c: 902 lines", out)


if __name__ == "__main__":
    unittest.main()
