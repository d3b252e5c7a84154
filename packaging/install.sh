#!/usr/bin/env bash
# Install gpuckpt from this source tree into /opt/gpuckpt/venv (Debian's python3) and put
# `gpuckpt`, `gpuckpt-runtime`, `gpuckpt-hook` and `gpuckptd` in /usr/local/bin (GPUCKPT_BINDIR;
# `none`: the venv only, as the test bed has it beside the installed .deb). Idempotent; run as root.
#
# The runtime's launcher starts the interpreter directly with -I -S and adds only our
# site-packages: engines run it for every container operation, and a pyenv shim or
# site's .pth processing would cost more than the work itself (docs/speed.md).
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
prefix=${GPUCKPT_PREFIX:-/opt/gpuckpt}
bindir=${GPUCKPT_BINDIR:-/usr/local/bin}
python=${GPUCKPT_PYTHON:-/usr/bin/python3}
extras=${GPUCKPT_EXTRAS:-gpu}

[ -x "$python" ] || { echo "install.sh: $python not found (apt-get install python3 python3-venv)" >&2; exit 1; }
if [ ! -x "$prefix/venv/bin/python3" ]; then
    "$python" -m venv "$prefix/venv"
fi
# Built from a copy of the tree: setuptools' build/ keeps the files of modules that have since
# moved (and would ship them), and two installs at once would share it.
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
tar -C "$src" --exclude=./.git --exclude=./build --exclude='./*.egg-info' --exclude='./.carry*' \
    --exclude=./.gpusnap --exclude='__pycache__' --exclude=./results -cf - . | tar -C "$build" -xf -
site=$("$prefix/venv/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ ! -L "$site/systemd" ] || rm -f "$site/systemd"  # an earlier install's link to Debian's: pip must not write through it
"$prefix/venv/bin/python3" -m pip install -q --disable-pip-version-check --upgrade "$build[$extras]"
# gpuckptd's python-systemd: the `service` extra builds it from PyPI's sdist (libsystemd-dev, gcc);
# without it, Debian's python3-systemd (built for this same python3) is linked in.
debian_systemd=/usr/lib/python3/dist-packages/systemd
if ! "$prefix/venv/bin/python3" -c 'import systemd.daemon' 2>/dev/null && [ -d "$debian_systemd" ]; then
    ln -sfn "$debian_systemd" "$site/systemd"
fi

write_launcher() {  # NAME MODULE
    local target="$bindir/$1" tmp
    tmp=$(mktemp "$bindir/.$1.XXXXXX")
    cat >"$tmp" <<LAUNCHER
#!$prefix/venv/bin/python3 -IS
import sys
sys.path.insert(0, "$site")
try:
    from $2 import main
except KeyboardInterrupt:  # Ctrl-C while the modules load: an interrupt's exit status, no traceback
    sys.exit(130)
sys.exit(main())
LAUNCHER
    chmod 0755 "$tmp"
    mv -f "$tmp" "$target"
}
install -d -m 0755 /etc/gpuckpt
version=$("$prefix/venv/bin/python3" -c 'import importlib.metadata as m; print(m.version("gpuckpt"))')
if [ "$bindir" = none ]; then
    echo "gpuckpt $version installed in $prefix (no launchers)"
    exit 0
fi
mkdir -p "$bindir"
write_launcher gpuckpt-runtime gpuckpt.shim.main
# The compiled launcher where this machine can build it (shim/resident/build.sh: cc, zlib1g-dev): the
# pass-through without the interpreter's start. Otherwise the Python launcher above does it all.
launcher_tmp=$(mktemp "$bindir/.gpuckpt-runtime.XXXXXX")
if bash "$src/shim/resident/build.sh" "$launcher_tmp" "$prefix/venv/bin/python3" "$site"; then
    chmod 0755 "$launcher_tmp"
    mv -f "$launcher_tmp" "$bindir/gpuckpt-runtime"
else
    rm -f "$launcher_tmp"
    echo "install.sh: gpuckpt-runtime keeps the Python launcher (no compiled one; apt-get install gcc zlib1g-dev)" >&2
fi
write_launcher gpuckpt-runtimed gpuckpt.shim.resident.server
write_launcher gpuckpt gpuckpt.cli.main
write_launcher gpuckpt-hook gpuckpt.hooks.main
write_launcher gpuckptd gpuckpt.service.main
echo "gpuckpt $version installed in $prefix; $bindir/gpuckpt-runtime ready"
