#!/bin/bash
# Prints the path of a minimal Debian root with systemd for the real-systemd tests, building it
# on first use. Usage: ensure-root.sh [bookworm|trixie] (default bookworm: Debian 12, systemd 252;
# trixie: Debian 13, systemd 257). Cached between runs on the same machine; built in a temp dir and renamed into
# place only when complete, so a crash never leaves a half cache. Concurrent callers serialize
# on a lock and reuse one build.
set -euo pipefail

suite=${1:-bookworm}
case $suite in
    bookworm|trixie) ;;
    *) echo "ensure-root: unknown suite '$suite' (bookworm or trixie)" >&2; exit 2 ;;
esac
cache=${NODEGRACE_TEST_CACHE:-/var/cache/nodegrace-tests}
# Bump the suffix whenever the package set below changes.
root=$cache/$suite-systemd-v1

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock -w 900 9 || { echo "ensure-root: timed out waiting for $cache/.lock" >&2; exit 1; }

if [[ -f $root/.nodegrace-root-complete ]]; then
    echo "$root"
    exit 0
fi
# Leftovers of a build that was killed; nobody else builds while we hold the lock.
rm -rf --one-file-system "$cache"/.build.*

debian_mirror() {
    local files=() f url
    [[ -f /etc/apt/sources.list ]] && files+=(/etc/apt/sources.list)
    for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -f $f ]] && files+=("$f")
    done
    # One-line format ("deb URL SUITE ...") and deb822 format ("URIs: URL").
    url=$( { grep -hE '^[[:space:]]*deb[[:space:]]' "${files[@]}" 2>/dev/null |
                 sed -E 's/\[[^]]*\]//' | awk '{print $2}'
             grep -hiE '^[[:space:]]*URIs:' "${files[@]}" 2>/dev/null |
                 sed -E 's/^[^:]*:[[:space:]]*//' | tr ' ' '\n'
           } | grep -E '^https?://' | grep -E '/debian/?$' | head -n1 || true)
    echo "${url:-http://deb.debian.org/debian}"
}

command -v debootstrap >/dev/null || { echo "ensure-root: debootstrap is not installed" >&2; exit 1; }
mirror=$(debian_mirror)
tmp=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf --one-file-system "$tmp"' EXIT
echo "ensure-root: debootstrap $suite from $mirror into $tmp (first run on this machine)" >&2
start=$(date +%s)
if ! debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus \
        "$suite" "$tmp/root" "$mirror" >"$tmp/debootstrap.log" 2>&1; then
    tail -n 30 "$tmp/debootstrap.log" >&2
    echo "ensure-root: debootstrap failed" >&2
    exit 1
fi
rm -f "$tmp"/root/var/cache/apt/archives/*.deb
# A fixed machine id keeps the persistent journal in one predictable directory.
echo 6e6f6465677261636574657374303031 >"$tmp/root/etc/machine-id"
echo nodegrace-test >"$tmp/root/etc/hostname"
touch "$tmp/root/.nodegrace-root-complete"
rm -rf --one-file-system "$root"
mv "$tmp/root" "$root"
echo "ensure-root: built in $(( $(date +%s) - start )) s" >&2
echo "$root"
