"""The launchers the packages (packaging/stage.sh) and install.sh write for each entry point: the same text, and a
Ctrl-C while the modules load ends with an interrupt's exit status, not a traceback (the operator's trial met one)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = [REPO / "packaging" / "stage.sh", REPO / "packaging" / "install.sh"]


def launcher_text(script: Path) -> str:
    """The here-document between `<<LAUNCHER` and `LAUNCHER`, without its #! line (each script names its venv)."""
    found = re.search(r"<<LAUNCHER\n#![^\n]*\n(.*?)\nLAUNCHER\n", script.read_text(), re.S)
    assert found, f"{script}: no launcher here-document"
    return found.group(1)


def test_the_packages_and_install_sh_write_the_same_launcher() -> None:
    assert launcher_text(SCRIPTS[0]) == launcher_text(SCRIPTS[1])


def run_launcher(tmp_path: Path, module_source: str) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "entry.py").write_text(module_source)
    text = launcher_text(SCRIPTS[0]).replace("$site", str(site)).replace("$2", "entry")
    launcher = tmp_path / "launcher"
    launcher.write_text(text + "\n")
    return subprocess.run([sys.executable, "-IS", str(launcher)], capture_output=True, text=True, timeout=60)


def test_ctrl_c_while_the_modules_load_exits_130_without_a_traceback(tmp_path: Path) -> None:
    done = run_launcher(tmp_path, "raise KeyboardInterrupt\n")
    assert (done.returncode, done.stderr) == (130, "")


def test_the_launcher_exits_with_what_main_returns(tmp_path: Path) -> None:
    done = run_launcher(tmp_path, "def main():\n    print('ran')\n    return 3\n")
    assert (done.returncode, done.stdout) == (3, "ran\n")
