#!/bin/bash
# runc's own integration tests (a .bats file of runc's source, checkpoint.bats by default) run twice:
# once with plain runc as $RUNC and once with gpuckpt-runtime; TAP of each run and a side-by-side
# table under OUT. Root only (the tests need it); installs bats if missing.
#
# The tests come from Debian's source package of the installed runc (bookworm: 1.1.5), fetched
# through a private apt configuration (deb-src lines for the mirror this machine already uses; the
# system's sources are not changed). What runc's tests would download or build, the bed supplies:
#   - busybox image: made from Debian's busybox-static (GitHub, where get-images.sh looks, is
#     out of reach); get-images.sh is replaced by one that names it;
#   - recvtty: integration/runc-bats/recvtty.py (the Go one is built from runc's tree; this one
#     does what helpers.bash asks of it: --pid-file, --mode null);
#   - the operator's config for the shim: the node's config plus [criu] allow_container_config
#     for /tmp, where checkpoint.bats puts its org.criu.config file, and the plain run's runc as
#     its delegate.
# Usage: run.sh [OUT [BATS_FILE]]   (env: GPUCKPT_RUNC_BATS_CACHE, GPUCKPT_DEBIAN_MIRROR,
#        RUNC_PLAIN, RUNC_SHIM, BATS_TEST_TIMEOUT, RUNC_BATS_SKIP)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../results/runc-bats}
bats_file=${2:-checkpoint.bats}
cache=${GPUCKPT_RUNC_BATS_CACHE:-/var/cache/gpuckpt/runc-bats}
runc_plain=${RUNC_PLAIN:-$(command -v runc)}
runc_shim=${RUNC_SHIM:-$(command -v gpuckpt-runtime)}
# a test that never ends (a checkpoint waiting for a peer) is failed, not waited for: runc 1.1.5's own lazy-pages
# test hangs so for plain runc and the shim alike (results/runc-bats/), each passing test takes seconds; 30 s, not
# 120, saves the test command three minutes (CI's budget is 45 minutes)
export BATS_TEST_TIMEOUT=${BATS_TEST_TIMEOUT:-30}
[ "$(id -u)" = 0 ] || { echo "run.sh: runc's checkpoint tests need root" >&2; exit 2; }
case $bats_file in */*|'') echo "run.sh: $bats_file: give a file name of tests/integration/" >&2; exit 2 ;; esac

. "$here/../testbed/debian-mirror.sh"
mirror=${GPUCKPT_DEBIAN_MIRROR:-$(debian_mirror)}
mkdir -p "$out" "$cache"

# --- 1. bats (and gawk, which helpers.bash's cgroup checks call) from Debian --------------------
missing=()
command -v bats >/dev/null || missing+=(bats)
command -v gawk >/dev/null || missing+=(gawk)
[ ${#missing[@]} = 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null

# --- 2. runc's source, the installed version, from Debian ------------------------------------
version=$(dpkg-query -W -f='${Version}' runc)
src=$cache/runc-$version
if [ ! -f "$src/.complete" ]; then
    apt_dir=$cache/apt
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/parts" "$cache/dl"
    security=${mirror%/debian}/debian-security
    cat >"$apt_dir/parts/runc-src.sources" <<EOS
Types: deb-src
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOS
    apt=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$apt_dir/parts"
         -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o "APT::Sandbox::User=root")
    apt-get "${apt[@]}" update -q >/dev/null
    (cd "$cache/dl" && apt-get "${apt[@]}" source -q --download-only "runc=$version" >/dev/null &&
        apt-get download -q busybox-static >/dev/null)
    rm -rf "$src"
    dpkg-source -q -x "$cache/dl/runc_${version#*:}.dsc" "$src" >/dev/null  # Debian's patches applied
    touch "$src/.complete"
fi
tests=$src/tests/integration

# --- 3. what the tests would download or build ----------------------------------------------
busybox_tar=$cache/busybox-rootfs.tar.xz
if [ ! -f "$busybox_tar" ]; then
    root=$(mktemp -d)
    dpkg-deb -x "$cache"/dl/busybox-static_*.deb "$root/pkg"
    mkdir -p "$root/fs"/{bin,dev,etc,proc,sys,tmp,root,var,run}
    cp "$root/pkg/bin/busybox" "$root/fs/bin/busybox"
    for applet in $("$root/fs/bin/busybox" --list); do
        [ "$applet" = busybox ] || ln -s busybox "$root/fs/bin/$applet"
    done
    echo 'root:x:0:0:root:/root:/bin/sh' >"$root/fs/etc/passwd"
    echo 'root:x:0:' >"$root/fs/etc/group"
    chmod 1777 "$root/fs/tmp"
    tar -C "$root/fs" -cJf "$busybox_tar.new" .
    mv "$busybox_tar.new" "$busybox_tar"
    rm -rf "$root"
fi
# get-images.sh names the images instead of downloading them (checkpoint.bats uses busybox only)
cat >"$tests/get-images.sh" <<EOS
#!/bin/bash
echo BUSYBOX_IMAGE=$busybox_tar
EOS
mkdir -p "$src/contrib/cmd/recvtty"
install -m 0755 "$here/recvtty.py" "$src/contrib/cmd/recvtty/recvtty"

# the shim's operator config: the node's, with container CRIU configs allowed in /tmp
config=$cache/config.toml
node_config=${GPUCKPT_CONFIG:-/etc/gpuckpt/config.toml}
if [ -f "$node_config" ] && grep -qE '^\s*\[criu\]' "$node_config"; then
    echo "run.sh: $node_config already has a [criu] table: set allow_container_config there" >&2; exit 2
fi
# the delegate is the runc of the plain run, whatever the node's is: the two runs differ by the shim alone
{ printf 'delegate = "%s"\n' "$runc_plain"
  grep -vE '^\s*delegate\s*=' "$node_config" 2>/dev/null || true
  printf '\n[criu]\nallow_container_config = true\ncontainer_config_dirs = ["/etc/criu", "/tmp"]\n'; } >"$config"
chmod 0644 "$config"

# --- 4. the two runs ------------------------------------------------------------------------
# checkpoint.bats writes /etc/criu/default.conf (a log-file line every CRIU on the node would then
# follow) and leaves it: the node's own is put back after each run, or the file removed.
criu_default=/etc/criu/default.conf
saved_default=$cache/criu-default.conf.saved
had_dir=0; [ -d /etc/criu ] && had_dir=1
had_default=0
if [ -f "$criu_default" ]; then had_default=1; cp -p "$criu_default" "$saved_default"; fi
put_back_criu_default() {
    if [ "$had_default" = 1 ]; then cp -p "$saved_default" "$criu_default"; else rm -f "$criu_default"; fi
    [ "$had_dir" = 1 ] || rmdir /etc/criu 2>/dev/null || true
}
trap put_back_criu_default EXIT
# RUNC_BATS_SKIP: tests skipped in both runs, one a line, "NAME<tab>WHY" (another test proves the same
# thing): a copy of the file beside it (bats loads the helpers from there) with `skip WHY` first in each.
run_file=$bats_file
if [ -n "${RUNC_BATS_SKIP:-}" ]; then
    run_file=gpuckpt-$$-$bats_file
    cp "$tests/$bats_file" "$tests/$run_file"
    trap 'put_back_criu_default; rm -f "$tests/$run_file"' EXIT
    while IFS=$'\t' read -r name why; do
        [ -n "$name" ] || continue
        case $why in ''|*'"'*|*'\'*) echo "run.sh: RUNC_BATS_SKIP: $name: give why, without quotes" >&2; exit 2;; esac
        grep -qxF "@test \"$name\" {" "$tests/$run_file" || {
            echo "run.sh: RUNC_BATS_SKIP: $bats_file has no test \"$name\"" >&2; exit 2; }
        awk -v head="@test \"$name\" {" -v why="$why" '{ print } $0 == head { printf "\tskip \"%s\"\n", why }' \
            "$tests/$run_file" >"$tests/$run_file.new" && mv "$tests/$run_file.new" "$tests/$run_file"
    done <<<"$RUNC_BATS_SKIP"
fi
machine=${GPUCKPT_MACHINE:-$(hostname -s)}
run_bats() {  # name runtime
    local tap=$out/$machine-$1.tap
    echo "== $bats_file with RUNC=$2" >&2
    (cd "$tests" && RUNC=$2 GPUCKPT_CONFIG=$config bats --tap "$run_file") >"$tap" 2>&1 || true
    put_back_criu_default
    cat "$tap" >&2
}
run_bats runc "$runc_plain"
run_bats shim "$runc_shim"

# --- 5. side by side ------------------------------------------------------------------------
result_of() {  # tap-file test-number -> pass / FAIL / skip
    awk -v n="$2" '($1 == "ok" || $1 == "not") {
        num = ($1 == "ok") ? $2 : $3
        if (num == n) { if ($0 ~ /# skip/) print "skip"; else if ($1 == "ok") print "pass"; else print "FAIL" } }' "$1"
}
table=$out/$machine-$bats_file.md
{
    echo "# runc $version tests/integration/$bats_file, $(date -u +%Y-%m-%dT%H:%MZ), machine $machine, kernel $(uname -r)"
    echo
    echo "runc: $runc_plain ($("$runc_plain" --version | head -n1)); shim: $runc_shim; criu: $(criu --version | head -n1)"
    echo
    echo "| # | test | runc | gpuckpt-runtime |"
    echo "|---|------|------|-----------------|"
    total=$(awk 'NR == 1 && sub(/^1\.\./, "") { print }' "$out/$machine-runc.tap")
    for n in $(seq 1 "${total:-0}"); do
        name=$(awk -v n="$n" '($1 == "ok" && $2 == n) || ($1 == "not" && $3 == n) {
            sub(/^(not )?ok [0-9]+ /, ""); sub(/ # (skip|timeout).*/, ""); print; exit }' "$out/$machine-runc.tap")
        echo "| $n | $name | $(result_of "$out/$machine-runc.tap" "$n") | $(result_of "$out/$machine-shim.tap" "$n") |"
    done
} >"$table"
cat "$table"
