#!/usr/bin/env bash
# Build gpuckpt's Debian package (debhelper, packaging/deb/debian; checked by lintian) and/or
# its RPM (rpmbuild, packaging/rpm/gpuckpt.spec) from this tree, on Debian 12 as root or with
# the build dependencies installed. Both ship packaging/stage.sh's tree; the wheels come from PyPI.
#
# Usage: packaging/build.sh [deb|rpm|all] OUTDIR
# Writes OUTDIR/gpuckpt_VERSION_ARCH.deb and/or OUTDIR/gpuckpt-VERSION-1.ARCH.rpm.
# Environment: GPUCKPT_LINTIAN=1 (the default, as debuild does: lintian's errors fail the build) or 0
# (no lintian: neither its install, 70-130 Perl packages, nor its ~30 s over the .deb), for a caller
# that only needs the .deb installed (testbed/setup.sh); the package tests (integration/test_packages.py)
# keep it on, so CI still fails on lintian's errors.
set -euo pipefail

usage="usage: build.sh [deb|rpm|all] OUTDIR"
what=${1:?$usage}
out=${2:?$usage}
case $what in deb|rpm|all) ;; *) echo "$usage" >&2; exit 2;; esac
lintian=${GPUCKPT_LINTIAN:-1}
case $lintian in 0|1) ;; *) echo "build.sh: GPUCKPT_LINTIAN=$lintian: give 1 (run lintian) or 0 (skip it)" >&2; exit 2;; esac
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$(date +%s)
phase_start=$start
took() {  # PHASE: how long it took since the previous one
    local now; now=$(date +%s)
    echo "build.sh: $1 took $((now - phase_start)) s"
    phase_start=$now
}

# --- build dependencies, from Debian's archive ----------------------------------------------
# python3.11-dev, libsystemd-dev, pkg-config, gcc: the `service` extra's systemd-python builds from its sdist;
# gcc and zlib1g-dev: gpuckpt-runtime's launcher (shim/resident/*.c).
needs=(python3.11-venv python3.11-dev libsystemd-dev pkg-config gcc binutils zlib1g-dev)
# build-essential: dpkg-buildpackage refuses to start without it (a minimal Debian 12 lacks it).
case $what in deb|all) needs+=(dpkg-dev debhelper build-essential); [ "$lintian" = 0 ] || needs+=(lintian);; esac
case $what in rpm|all) needs+=(rpm);; esac
missing=()
for package in "${needs[@]}"; do
    dpkg-query -W -f='${Status}\n' "$package" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "build.sh: missing build dependencies (as root: apt-get install ${missing[*]})" >&2; exit 1; }
    echo "build.sh: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    took "installing build dependencies"
fi

version=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
          "$src/pyproject.toml")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
copy_tree() {  # DIR: this tree without what is not source (as install.sh copies it)
    mkdir -p "$1"
    tar -C "$src" --exclude=./.git --exclude=./build --exclude=./dist --exclude='./*.egg-info' --exclude='./.carry*' \
        --exclude=./.gpusnap --exclude='__pycache__' --exclude=./results -cf - . | tar -C "$1" -xf -
}

if [ "$what" != rpm ]; then
    tree=$work/deb/gpuckpt-$version
    copy_tree "$tree"
    cp -a "$src/packaging/deb/debian" "$tree/debian"
    changelog_version=$(cd "$tree" && dpkg-parsechangelog -S Version)
    [ "$changelog_version" = "$version" ] || {
        echo "build.sh: packaging/deb/debian/changelog is at $changelog_version, pyproject.toml at $version:" \
             "add a changelog entry" >&2; exit 1; }
    (cd "$tree" && dpkg-buildpackage -b -us -uc) >"$work/deb.log" 2>&1 || {
        tail -n 40 "$work/deb.log" >&2; echo "build.sh: dpkg-buildpackage failed" >&2; exit 1; }
    deb=$(cd "$work/deb" && ls gpuckpt_"$version"_*.deb)
    took "dpkg-buildpackage"
    if [ "$lintian" = 1 ]; then
        # As debuild does: lintian's errors fail the build (debian/gpuckpt.lintian-overrides says
        # which are by design); its warnings are printed.
        lintian_report=$(lintian --no-tag-display-limit "$work/deb/$deb" 2>/dev/null || true)
        [ -z "$lintian_report" ] || echo "$lintian_report" | sed 's/^/build.sh: lintian: /'
        if grep -q '^E:' <<<"$lintian_report"; then echo "build.sh: lintian found errors in $deb" >&2; exit 1; fi
        took "lintian"
    else
        echo "build.sh: lintian not run (GPUCKPT_LINTIAN=0)"
    fi
    mv -f "$work/deb/$deb" "$out/"
    echo "build.sh: $out/$deb ($(du -k "$out/$deb" | cut -f1) KiB)"
fi

if [ "$what" != deb ]; then
    tree=$work/rpm/src
    copy_tree "$tree"
    # --nodeps: BuildRequires name Fedora's packages; on Debian they were checked above.
    rpmbuild -bb --nodeps --define "_topdir $work/rpm" --define "gpuckpt_version $version" \
        --define "gpuckpt_src $tree" "$tree/packaging/rpm/gpuckpt.spec" >"$work/rpm.log" 2>&1 || {
        tail -n 40 "$work/rpm.log" >&2; echo "build.sh: rpmbuild failed" >&2; exit 1; }
    rpm=$(cd "$work/rpm/RPMS" && ls ./*/gpuckpt-"$version"-*.rpm)
    took "rpmbuild"
    mv -f "$work/rpm/RPMS/$rpm" "$out/"
    echo "build.sh: $out/$(basename "$rpm") ($(du -k "$out/$(basename "$rpm")" | cut -f1) KiB)"
fi
echo "build.sh: done in $(( $(date +%s) - start )) s"
