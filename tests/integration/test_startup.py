"""Start-up refusals: settings the daemon cannot honour stop it with a message."""
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import kvidxd_path  # noqa: E402


class StartupTest(unittest.TestCase):
    def test_data_dir_is_refused_until_persistence_exists(self):
        # Persistence (issue #6) is not built: a data_dir must not be
        # silently ignored, since an operator would expect a warm restart.
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run([kvidxd_path(), "--set", "listen=127.0.0.1:0",
                                "--set", "data_dir=" + d],
                               capture_output=True, timeout=10)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(b"data_dir", p.stderr)

    def test_no_arguments_check_config_uses_defaults(self):
        p = subprocess.run([kvidxd_path(), "--check-config"], capture_output=True, timeout=10)
        self.assertEqual(p.returncode, 0, p.stderr)


if __name__ == "__main__":
    unittest.main()
