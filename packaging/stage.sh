#!/usr/bin/env bash
# The installed file tree of the .deb and the .rpm, built under DESTDIR: both packages ship
# what this script writes, so they cannot drift apart. Run by debian/rules and the spec's %install.
#
# Phases: a private venv at /usr/lib/gpuckpt/venv (python3.11, gpuckpt with every extra but
# the tests' (`test`, `*-test`) and its wheels from PyPI, no pip, bytecode compiled ahead); a launcher in /usr/bin for
# each of pyproject.toml's [project.scripts], started as install.sh starts them (-IS, our
# site-packages only: engines run the runtime on every container operation); the
# default config (every key of node/config.py commented with its default); the hooks.d files
# (hooks/oci-hooks.d); systemd units and drop-ins (packaging/systemd, when there); engine registration
# examples written by the same code as `gpuckpt install`; manual pages and bash completion generated from the
# commands' parsers; then a check that no staging path
# leaked into a file.
#
# Usage: stage.sh DESTDIR. Environment: GPUCKPT_UNITDIR (default /usr/lib/systemd/system;
# Debian 12's debhelper looks in /lib/systemd/system), GPUCKPT_PYTHON (default /usr/bin/python3.11).
set -euo pipefail

dest=${1:?usage: stage.sh DESTDIR}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
python=${GPUCKPT_PYTHON:-/usr/bin/python3.11}
unitdir=${GPUCKPT_UNITDIR:-/usr/lib/systemd/system}
prefix=/usr/lib/gpuckpt
venv=$prefix/venv
bindir=/usr/bin
hook_path=$bindir/gpuckpt-hook
hooks_d=/usr/share/containers/oci/hooks.d  # node/hooks_d.py PACKAGED_HOOKS_DIR
docdir=/usr/share/doc/gpuckpt

[ -x "$python" ] || { echo "stage.sh: $python not found (apt-get install python3.11-venv)" >&2; exit 1; }
read_pyproject() {  # extras: the runtime extras (all but the tests': test, cri-test); scripts: NAME MODULE FUNCTION lines
    "$python" - "$src/pyproject.toml" "$1" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as pyproject:
    project = tomllib.load(pyproject)["project"]
if sys.argv[2] == "extras":
    print(",".join(sorted(name for name in project.get("optional-dependencies", {}) if not name.endswith("test"))))
else:
    for name, entry in project["scripts"].items():
        print(name, *entry.split(":"))
PY
}
extras=$(read_pyproject extras)

# --- the venv -------------------------------------------------------------------------------
# Made in DESTDIR, then checked to name no path of it (the end of this script).
rm -rf "$dest$venv"
"$python" -m venv "$dest$venv"
# From a copy of the tree, as install.sh does (setuptools' build/ would ship moved modules).
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
tar -C "$src" --exclude=./.git --exclude=./build --exclude='./*.egg-info' --exclude='./.carry*' \
    --exclude=./.gpusnap --exclude='__pycache__' --exclude=./results -cf - . | tar -C "$build" -xf -
"$dest$venv/bin/python3" -m pip install -q --disable-pip-version-check --no-compile "$build[$extras]"
# pip and setuptools only served the install: the package manager owns this tree.
"$dest$venv/bin/python3" -m pip uninstall -q -y pip setuptools
# The venv's own scripts (activate, pip, the wheels' console scripts) name no path an
# operator needs: /usr/bin has gpuckpt's. Its interpreter links stay.
find "$dest$venv/bin" -type f -delete
rm -rf "$dest$venv/include"
# Wheels keep their files' modes (protobuf's are all executable); nothing in site-packages is run directly.
find "$dest$venv/lib" -type f -perm /111 ! -name '*.so' ! -name '*.so.*' -exec chmod a-x {} +
# Some wheels carry their debug info (zstandard: 24 MiB of 26); both packages ship them stripped.
find "$dest$venv" -name '*.so*' -type f -exec strip --strip-unneeded {} +
site=$("$dest$venv/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
site=${site#"$dest"}
# Unchecked-hash bytecode: valid whatever mtimes the package manager gives the sources, and no
# source read at start-up (the runtime's start-up is the engines' cost); -s/-p name the final paths.
"$dest$venv/bin/python3" -m compileall -q -j 0 --invalidation-mode unchecked-hash -s "$dest" -p / \
    "$dest$venv/lib" >/dev/null
rm -rf "$dest$site"/gpuckpt-*.dist-info/direct_url.json  # names the temporary build copy

# --- launchers: one per entry point (the same text as install.sh's) --------------------------
mkdir -p "$dest$bindir"
write_launcher() {  # NAME MODULE
    cat >"$dest$bindir/$1" <<LAUNCHER
#!$venv/bin/python3 -IS
import sys
sys.path.insert(0, "$site")
try:
    from $2 import main
except KeyboardInterrupt:  # Ctrl-C while the modules load: an interrupt's exit status, no traceback
    sys.exit(130)
sys.exit(main())
LAUNCHER
    chmod 0755 "$dest$bindir/$1"
}
while read -r name module function; do
    [ "$function" = main ] || { echo "stage.sh: entry point $name calls $function, launchers call main" >&2; exit 1; }
    write_launcher "$name" "$module"
done < <(read_pyproject scripts)
# gpuckpt-runtime's pass-through without an interpreter (shim/resident/launcher.c): the packages'
# build has a compiler, so no fallback here.
bash "$src/shim/resident/build.sh" "$dest$bindir/gpuckpt-runtime" "$venv/bin/python3" "$site"
chmod 0755 "$dest$bindir/gpuckpt-runtime"
[ -x "$dest$hook_path" ] || { echo "stage.sh: no entry point made $hook_path" >&2; exit 1; }

staged_python() {  # the staged venv's interpreter with the staged gpuckpt importable
    "$dest$venv/bin/python3" -I "$@"
}

# --- default config ---------------------------------------------------------------------------
install -d -m 0755 "$dest/etc/gpuckpt"
staged_python "$src/packaging/default_config.py" >"$dest/etc/gpuckpt/config.toml"
chmod 0644 "$dest/etc/gpuckpt/config.toml"

# --- hooks.d ----------------------------------------------------------------------------------
install -d -m 0755 "$dest$hooks_d"
shopt -s nullglob
hook_files=("$src"/hooks/oci-hooks.d/*.json)
[ ${#hook_files[@]} -gt 0 ] || { echo "stage.sh: no hooks.d files in $src/hooks/oci-hooks.d" >&2; exit 1; }
for file in "${hook_files[@]}"; do
    staged_python - "$file" "$hook_path" <<'CHECK'
import json, sys
from gpuckpt.node.hooks_d import HooksDFile
with open(sys.argv[1]) as hook_file:
    hook = HooksDFile.model_validate(json.load(hook_file))
if hook.hook.path != sys.argv[2]:
    sys.exit(f"stage.sh: {sys.argv[1]} runs {hook.hook.path}, the packages install {sys.argv[2]}")
CHECK
    install -m 0644 "$file" "$dest$hooks_d/"
done

# --- systemd units ----------------------------------------------------------------------------
units=("$src"/packaging/systemd/*.service "$src"/packaging/systemd/*.timer "$src"/packaging/systemd/*.socket)
if [ ${#units[@]} -gt 0 ]; then
    install -d -m 0755 "$dest$unitdir"
    install -m 0644 "${units[@]}" "$dest$unitdir/"
fi
# Drop-ins for units of others (UNIT.d/NAME.conf; a prefix such as libpod-.scope.d reaches every
# unit whose name starts so, transient ones included).
for dropins in "$src"/packaging/systemd/*.d; do
    install -d -m 0755 "$dest$unitdir/${dropins##*/}"
    install -m 0644 "$dropins"/*.conf "$dest$unitdir/${dropins##*/}/"
done
shopt -u nullglob

# --- manual pages and bash completion ---------------------------------------------------------
# Generated from the commands' parsers (cli/manual.py), so a flag added to one is in the next package's
# page and completion. Gzipped here (no timestamp: reproducible), as Debian's policy has them: the RPM's
# build on Debian compresses nothing, and both packages ship the same files.
staged_python -m gpuckpt.cli.manual "$dest" >/dev/null
gzip -n -9 "$dest"/usr/share/man/man8/*.8

# --- engine registration examples -------------------------------------------------------------
# Written by node/engines.py itself, as `gpuckpt install --engine ... --default` writes them
# into an empty file, so they cannot differ from what the command does.
examples=$dest$docdir/examples
install -d -m 0755 "$examples"
staged_python - "$examples" "$bindir/gpuckpt-runtime" <<'EXAMPLES'
import os, sys
from gpuckpt.node import engines
examples, runtime = sys.argv[1], sys.argv[2]
engines.register_podman(runtime, default=True, conf_path=os.path.join(examples, "containers.conf"), hooks=True)
engines.register_docker(runtime, default=True, daemon_json=os.path.join(examples, "daemon.json"))
from gpuckpt.node.containerd import register_containerd
register_containerd(runtime, config_path=os.path.join(examples, "containerd-config.toml"))
EXAMPLES
{
    echo "# podman: what \`gpuckpt install --engine podman --default\` adds to /etc/containers/containers.conf"
    echo "# (or copy it to /etc/containers/containers.conf.d/gpuckpt.conf). Without --default, no"
    echo "# \`runtime\` line: choose per container with \`podman run --runtime gpuckpt-runtime\`."
    echo "# hooks_dir: this package's hooks.d and the one \`gpuckpt install\` writes to (a podman"
    echo "# without containers-common reads only $hooks_d unless told)."
    cat "$examples/containers.conf"
} >"$examples/containers.conf.new"
mv -f "$examples/containers.conf.new" "$examples/containers.conf"
install -m 0644 "$src/packaging/examples/README" "$src/packaging/examples/runtimeclass.yaml" \
    "$src/packaging/examples/crio-gpuckpt.conf" "$examples/"
install -m 0644 "$src/README.md" "$dest$docdir/README.md"
# the manual: the pages the man pages, --help texts and doctor's fixes name as docs/PAGE.md
install -d "$dest$docdir/docs"
install -m 0644 "$src"/docs/*.md "$dest$docdir/docs/"
chmod 0644 "$examples"/*

# --- no staging path left in any file -------------------------------------------------------
# pyvenv.cfg's `command` names where the venv was made; nothing else may.
sed -i "s|$dest||g" "$dest$venv/pyvenv.cfg"
leaked=$(grep -rlF "$dest" "$dest" || true)
[ -z "$leaked" ] || { echo "stage.sh: files name the staging directory $dest:" >&2; echo "$leaked" >&2; exit 1; }
echo "stage.sh: gpuckpt $(staged_python -c 'import gpuckpt; print(gpuckpt.__version__)') staged in $dest" \
     "($(du -sm "$dest" | cut -f1) MiB)"
