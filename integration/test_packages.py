"""The packages (packaging/build.sh): what the .deb and the .rpm hold, and both installed into a
fresh Debian 12 root where their commands run.

Phases: both packages are built once (about a minute: PyPI's wheels; build.sh fails on lintian's
errors); their file lists, control data and the files an operator reads are checked; a bookworm root
made by debootstrap from the machine's Debian mirror (cached as a tarball beside the test image)
gets the .deb by `apt-get install ./gpuckpt_*.deb`, as the README tells operators, and its
commands run there through chroot; then the .rpm's files are installed into the same root by
rpm (no dependency check: that root's python3.11 and libc are dpkg's) and run. The root is
removed at the end.
"""

from __future__ import annotations

import glob
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from bed import sh
from pydantic import BaseModel

import gpuckpt
from gpuckpt.node import engines
from gpuckpt.node.config import Config, parse_config
from gpuckpt.node.hooks_d import PACKAGED_HOOK_PATH, PACKAGED_HOOKS_DIR, hooks_d_files

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parent.parent
ROOT_TAR = "/var/cache/gpuckpt-testbed/bookworm-minbase.tar"
VENV = "/usr/lib/gpuckpt/venv"
SITE = f"{VENV}/lib/python3.11/site-packages"
with open(REPO / "pyproject.toml", "rb") as pyproject:
    COMMANDS = tuple(f"/usr/bin/{name}" for name in tomllib.load(pyproject)["project"]["scripts"])  # a launcher each
CONFIG = "/etc/gpuckpt/config.toml"
EXAMPLES = "/usr/share/doc/gpuckpt/examples"
MAN_PAGES = "/usr/share/man/man8"  # cli/manual.py's, gzipped by stage.sh
COMPLETIONS = "/usr/share/bash-completion/completions"
# Every file of either package lies below one of these: nothing strays into the system.
OWN_PLACES = ("/usr/bin/gpuckpt", "/usr/lib/gpuckpt/", "/etc/gpuckpt/", "/usr/share/doc/gpuckpt/",
              f"{PACKAGED_HOOKS_DIR}/gpuckpt-", "/lib/systemd/system/", "/usr/lib/systemd/system/",
              "/usr/share/lintian/overrides/gpuckpt", f"{MAN_PAGES}/gpuckpt", f"{COMPLETIONS}/gpuckpt")
# What debhelper adds to the .deb alone (the README it compresses).
DEBIAN_ONLY = {"/usr/share/doc/gpuckpt/changelog.gz", "/usr/share/doc/gpuckpt/copyright",
               "/usr/share/doc/gpuckpt/README.md.gz", "/usr/share/lintian/overrides/gpuckpt"}
UNITS = sorted(os.path.basename(path) for pattern in ("*.service", "*.timer", "*.socket")
               for path in glob.glob(str(REPO / "packaging" / "systemd" / pattern)))


class Packages:
    def __init__(self, directory: Path, build_output: str) -> None:
        self.deb = next(directory.glob(f"gpuckpt_{gpuckpt.__version__}_*.deb"))
        self.rpm = next(directory.glob(f"gpuckpt-{gpuckpt.__version__}-*.rpm"))
        # lintian's tags as build.sh prints them ("build.sh: lintian: W: gpuckpt: TAG ...")
        self.lintian = [line.split("lintian: ", 1)[1] for line in build_output.splitlines()
                        if line.startswith("build.sh: lintian: ")]
        self.lintian_ran = "build.sh: lintian took" in build_output


@pytest.fixture(scope="module")
def packages(built_packages: tuple[Path, str]) -> Packages:
    return Packages(*built_packages)


def deb_files(deb: Path) -> dict[str, tarfile.TarInfo]:
    """The .deb's data archive: absolute path -> entry (directories left out)."""
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return {member.name.removeprefix("."): member for member in archive.getmembers() if not member.isdir()}


def deb_file_text(deb: Path, path: str) -> str:
    return sh("sh", "-c", f"dpkg-deb --fsys-tarfile '{deb}' | tar -xO '.{path}'").stdout


def rpm_query(rpm: Path, *options: str) -> list[str]:
    return sh("rpm", "-qp", *options, str(rpm)).stdout.splitlines()


def test_deb_holds_the_commands_venv_config_hooks_and_examples(packages) -> None:
    files = deb_files(packages.deb)
    expected = {*COMMANDS, CONFIG, f"{VENV}/bin/python3", f"{SITE}/gpuckpt/shim/main.py",
                f"{SITE}/gpuckpt/shim/__pycache__/main.cpython-311.pyc", f"{SITE}/pydantic/__init__.py",
                f"{EXAMPLES}/containers.conf", f"{EXAMPLES}/daemon.json", f"{EXAMPLES}/README",
                *(f"{PACKAGED_HOOKS_DIR}/{name}" for name in hooks_d_files(PACKAGED_HOOK_PATH)),
                *(f"/lib/systemd/system/{unit}" for unit in UNITS)}
    assert expected <= files.keys(), sorted(expected - files.keys())
    assert [path for path in files if not path.startswith(OWN_PLACES)] == []
    assert not [path for path in files if "/pip/" in path or path.startswith(f"{VENV}/bin/pip")]
    for command in COMMANDS:
        assert files[command].mode == 0o755 and (files[command].uname, files[command].gname) == ("root", "root")
    assert files[CONFIG].mode == 0o644


def test_deb_has_a_manual_page_for_each_command_and_completion(packages) -> None:
    """cli/manual.py's pages and completion, one page per command in /usr/bin; lintian's no-manual-page
    (a W: tag, which build.sh prints and does not fail on) is gone."""
    files = deb_files(packages.deb)
    names = [os.path.basename(command) for command in COMMANDS]
    assert {f"{MAN_PAGES}/{name}.8.gz" for name in names} <= files.keys()
    assert {f"{COMPLETIONS}/gpuckpt", f"{COMPLETIONS}/gpuckptd"} <= files.keys()
    assert all(files[path].mode == 0o644 for path in files if path.startswith((MAN_PAGES, COMPLETIONS)))
    assert packages.lintian_ran
    assert [line for line in packages.lintian if "manual-page" in line or "manpage" in line] == []
    page = sh("sh", "-c", f"dpkg-deb --fsys-tarfile '{packages.deb}' | tar -xO '.{MAN_PAGES}/gpuckpt.8.gz' | "
                          "gzip -d").stdout
    assert '.SS "gpuckpt store prune"' in page and "\\-\\-keep" in page  # the parser's, walked


def test_deb_holds_the_manual_pages_the_man_pages_name(packages) -> None:
    """docs/PAGE.md, which the man pages, --help texts and doctor's fixes name, on the node as the tree has it."""
    files = deb_files(packages.deb)
    pages = sorted(path.name for path in (REPO / "docs").glob("*.md"))
    assert pages and {f"/usr/share/doc/gpuckpt/docs/{page}" for page in pages} <= files.keys()
    assert deb_file_text(packages.deb, "/usr/share/doc/gpuckpt/docs/node.md") == (REPO / "docs" / "node.md").read_text()


def test_deb_control_names_the_version_dependencies_and_conffile(packages) -> None:
    fields = dict(line.split(": ", 1) for line in
                  sh("dpkg-deb", "-f", str(packages.deb), "Package", "Version", "Architecture", "Depends")
                  .stdout.splitlines())
    assert fields["Package"] == "gpuckpt" and fields["Version"] == gpuckpt.__version__
    assert fields["Architecture"] == sh("dpkg", "--print-architecture").stdout.strip()
    assert "python3.11" in [dependency.split()[0] for dependency in fields["Depends"].split(", ")]
    control = sh("sh", "-c", f"dpkg-deb --ctrl-tarfile '{packages.deb}' | tar -xO ./conffiles").stdout
    assert control.split() == [CONFIG]


def test_rpm_holds_the_same_files_as_the_deb(packages) -> None:
    deb_paths = {path.replace("/lib/systemd/system/", "/usr/lib/systemd/system/") for path in deb_files(packages.deb)}
    deb_paths -= DEBIAN_ONLY
    deb_paths.add("/usr/share/doc/gpuckpt/README.md")
    listing = rpm_query(packages.rpm, "--queryformat", "[%{FILEMODES:perms} %{FILENAMES}\\n]")
    rpm_paths = {line.split(" ", 1)[1] for line in listing if not line.startswith("d")}
    assert rpm_paths == deb_paths, (sorted(rpm_paths - deb_paths), sorted(deb_paths - rpm_paths))
    assert rpm_query(packages.rpm, "--configfiles") == [CONFIG]
    assert "/usr/bin/python3.11" in rpm_query(packages.rpm, "--requires")


def test_packaged_hooks_d_files_are_those_gpuckpt_install_writes(packages) -> None:
    for name, text in hooks_d_files(PACKAGED_HOOK_PATH).items():
        assert deb_file_text(packages.deb, f"{PACKAGED_HOOKS_DIR}/{name}") == text


def model_keys(model: type[BaseModel] = Config, table: str = "") -> set[str]:
    """Every key of the config model, as `table.key`."""
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        key = f"{table}{field.alias or name}"
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys |= model_keys(field.annotation, f"{key}.")
        else:
            keys.add(key)
    return keys


def test_packaged_config_is_every_key_at_its_default(packages) -> None:
    text = deb_file_text(packages.deb, CONFIG)
    assert parse_config(text, CONFIG) == Config()
    uncommented = "\n".join(line[1:] if line.startswith("#") and " = " in line else line for line in text.splitlines())
    assert parse_config(uncommented, CONFIG) == Config()  # the commented values are the defaults, and valid
    keys, table = set(), ""
    for line in text.splitlines():
        if line.startswith("["):
            table = line.strip("[]") + "."
        elif line.startswith("#") and " = " in line:
            keys.add(table + line[1:].split(" = ")[0])
    assert keys == model_keys()


def test_examples_register_the_packaged_runtime(packages, tmp_path) -> None:
    conf = tmp_path / "containers.conf"
    conf.write_text(deb_file_text(packages.deb, f"{EXAMPLES}/containers.conf"))
    assert engines.podman_registration(str(conf)) == (["/usr/bin/gpuckpt-runtime"], True)
    daemon_json = tmp_path / "daemon.json"
    daemon_json.write_text(deb_file_text(packages.deb, f"{EXAMPLES}/daemon.json"))
    assert engines.docker_registration(str(daemon_json)) == ("/usr/bin/gpuckpt-runtime", True)
    assert json.loads(daemon_json.read_text())["experimental"] is True


# --- installed ----------------------------------------------------------------------------------

def _debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (as integration/testbed/install-system.sh finds it)."""
    for source in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            words = source.read_text().split()
        except OSError:
            continue
        for word in words:
            if word.startswith(("http://", "https://")) and word.rstrip("/").endswith("/debian"):
                return word.rstrip("/")
    return "http://deb.debian.org/debian"


@pytest.fixture(scope="module")
def fresh_root() -> Iterator[Path]:
    """A Debian 12 minbase root, unpacked from the cached debootstrap (made on first use)."""
    if not os.path.exists(ROOT_TAR):
        with tempfile.TemporaryDirectory(dir=os.path.dirname(ROOT_TAR)) as build:
            sh("debootstrap", "--variant=minbase", "bookworm", f"{build}/root", _debian_mirror(), timeout=900)
            sh("tar", "-C", f"{build}/root", "--one-file-system", "--numeric-owner", "--exclude=./proc/*",
               "--exclude=./sys/*", "-cf", f"{ROOT_TAR}.tmp", ".")
            os.replace(f"{ROOT_TAR}.tmp", ROOT_TAR)
    root = Path(tempfile.mkdtemp(prefix="gpuckpt-pkgroot-"))
    try:
        sh("tar", "-C", str(root), "--numeric-owner", "-xf", ROOT_TAR)
        shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
        in_root(root, "apt-get", "update", "-q", timeout=300)  # the cached lists may name versions since replaced
        yield root
    finally:
        shutil.rmtree(root)


def in_root(root: Path, *argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LANG": "C.UTF-8"}
    return sh("chroot", str(root), *argv, check=check, env=env, **kwargs)


def installed_files(root: Path) -> set[str]:
    return {str(Path("/", path.relative_to(root))) for path in (root / "usr/lib/gpuckpt").rglob("*")
            if path.is_file() or path.is_symlink()}


def run_commands(root: Path) -> None:
    """The runtime, the CLI and the hook as an engine and an operator run them; the hook on a container with no GPU."""
    assert in_root(root, "gpuckpt", "--version").stdout.strip() == f"gpuckpt {gpuckpt.__version__}"
    runtime = in_root(root, "gpuckpt-runtime", "--version").stdout
    assert runtime.startswith(f"gpuckpt-runtime version {gpuckpt.__version__}\n") and "\nrunc version" in runtime
    bundle = root / "tmp" / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"},
                                                    "process": {"args": ["sh"], "cwd": "/"},
                                                    "linux": {"devices": []}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "pkgtest", "status": "creating", "pid": 1,
                        "bundle": "/tmp/bundle"})
    in_root(root, "gpuckpt-hook", "createRuntime", input=state)


def test_apt_installs_the_deb_and_its_commands_run(packages, fresh_root) -> None:
    shutil.copy(packages.deb, fresh_root / "tmp")
    in_root(fresh_root, "apt-get", "install", "-y", "-q", f"/tmp/{packages.deb.name}", timeout=600)  # runc: Recommends
    status = in_root(fresh_root, "dpkg-query", "-W", "-f", "${Status} ${Conffiles}", "gpuckpt").stdout
    assert status.startswith("install ok installed") and CONFIG in status
    packaged = set(in_root(fresh_root, "dpkg-query", "-L", "gpuckpt").stdout.splitlines())
    run_commands(fresh_root)
    # The shipped bytecode served: running wrote nothing into the package's tree.
    assert installed_files(fresh_root) <= packaged
    config = fresh_root / CONFIG.lstrip("/")
    assert (config.stat().st_uid, config.stat().st_mode & 0o777) == (0, 0o644)

    # An operator's change to the conffile survives a reinstall; a purge removes it.
    config.write_text(config.read_text().replace("#lock_timeout_ms = 10000", "lock_timeout_ms = 5000"))
    in_root(fresh_root, "dpkg", "-i", f"/tmp/{packages.deb.name}")
    assert "\nlock_timeout_ms = 5000" in config.read_text()
    in_root(fresh_root, "apt-get", "purge", "-y", "-q", "gpuckpt")
    assert not (fresh_root / "usr/lib/gpuckpt").exists() and not config.exists()
    assert not any((fresh_root / command.lstrip("/")).exists() for command in COMMANDS)


def test_rpm_files_installed_run(packages, fresh_root) -> None:
    """The .rpm's payload where an RPM system puts it: its commands work (dependencies are not
    checked: the root's python3.11 and runc are dpkg's, left by the test above or installed here)."""
    in_root(fresh_root, "apt-get", "install", "-y", "-q", "python3.11", "runc", timeout=600)
    rpm = ["rpm", "--root", str(fresh_root), "--dbpath", "/var/lib/rpm"]
    sh(*rpm, "-i", "--nodeps", str(packages.rpm))
    run_commands(fresh_root)
    sh(*rpm, "-e", "gpuckpt")
    assert not (fresh_root / "usr/lib/gpuckpt").exists()
