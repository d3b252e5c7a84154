"""`gpuckpt` runs where python-systemd is not installed (a pip install, the forky engine set's root): only gpuckptd
talks to systemd (service/systemd.py)."""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_imports_without_python_systemd() -> None:
    done = subprocess.run([sys.executable, "-c", "import sys; sys.modules['systemd'] = None; import gpuckpt.cli.main"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-800:]
