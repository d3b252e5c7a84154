# Sourced by the test bed's scripts: `debian_mirror` prints the Debian mirror this machine's apt
# already uses (sources.list lines, then deb822 .sources files), deb.debian.org if none.
# shellcheck shell=bash
debian_mirror() {
    local m
    m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
        | awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i ~ /^https?:/) { print $i; break } }' \
        | grep -E '/debian/?$' | head -n1 || true)
    if [ -z "$m" ]; then
        m=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
            | awk 'tolower($1) == "uris:" { for (i = 2; i <= NF; i++) print $i }' \
            | grep -E '/debian/?$' | head -n1 || true)
    fi
    echo "${m:-http://deb.debian.org/debian}" | sed 's:/*$::'
}
