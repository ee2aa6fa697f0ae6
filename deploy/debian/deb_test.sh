#!/usr/bin/env bash
# The Debian package's test (./zf test runs it after `./zf deb`):
#
#   deb_test.sh DEB HEALTH_CHECK
#
# 1. lintian reports no error (its warnings are printed).
# 2. A fresh Debian 12 root, made by debootstrap (minbase) with the package's
#    Depends preinstalled (debian_root.sh; cached under ~/.cache/zenflow), gets
#    the package with `dpkg -i` in a chroot: no apt, so a Depends that names a
#    missing or wrong package fails here.
# 3. The files are where docs/operating.md says, the system user exists, and
#    zenflowd from the package, started in the chroot as that user on a free
#    127.0.0.1 port, answers the standard gRPC health check (HEALTH_CHECK,
#    from the host: the chroot shares its network) with SERVING.
# 4. dpkg --purge removes it again.
# The chroot's mounts live in a mount namespace of this test's own
# (unshare), so they go when it ends; zenflowd is stopped by its pid.
# Needs root. Prints the time each step took.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: deb_test.sh DEB HEALTH_CHECK" >&2
  exit 2
fi
deb=$(realpath "$1")
health_check=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" -ne 0 ]; then
  echo "deb_test: SKIPPED: debootstrap, chroot and dpkg -i need root" >&2
  exit 0
fi
tmp=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/zf-deb-test.XXXXXX")
# What pip and lintian write to TMPDIR goes with this directory.
export TMPDIR="$tmp"
cleanup() { rm -rf "$tmp"; }
trap cleanup EXIT
t0=$(date +%s)
step() { echo "deb_test: [$(( $(date +%s) - t0 ))s] $*"; }
fail() { echo "deb_test: FAIL: $*" >&2; exit 1; }

step "lintian $(basename "$deb")"
lintian --fail-on error "$deb" > "$tmp/lintian.txt" 2>"$tmp/lintian.err" \
  || { cat "$tmp/lintian.txt" "$tmp/lintian.err"; fail "lintian reports errors"; }
sed 's/^/deb_test:   lintian: /' "$tmp/lintian.txt"
grep -q '^E:' "$tmp/lintian.txt" && fail "lintian reports errors"

# The package's Depends, as names: what the root is made with.
depends=$(dpkg-deb -f "$deb" Depends)
include=$(printf '%s' "$depends" | tr ',' '\n' | sed -E 's/\(.*\)//; s/\|.*//; s/ //g' | sed '/^$/d' \
  | paste -sd, -)
step "Debian 12 root with: $include"
root="$tmp/root"
"$here/debian_root.sh" "$include" "$root"

cp "$deb" "$root/tmp/zenflowd.deb"
cat > "$root/tmp/inside.sh" <<'INSIDE'
#!/bin/sh
# Runs in the chroot as root.
set -e
dpkg -i /tmp/zenflowd.deb
INSIDE
chmod +x "$root/tmp/inside.sh"

# Everything with mounts runs in a mount namespace of its own.
cat > "$tmp/ns.sh" <<NS
#!/usr/bin/env bash
set -euo pipefail
root="$root"
mount -t proc proc "\$root/proc"
mount --rbind /dev "\$root/dev"
mount --rbind /sys "\$root/sys"
echo "deb_test: dpkg -i zenflowd.deb (chroot)"
chroot "\$root" /tmp/inside.sh
for f in /usr/bin/zenflowd /usr/bin/zfctl /lib/systemd/system/zenflowd.service \
    /etc/zenflowd/zenflowd.flags /usr/share/man/man8/zenflowd.8.gz /usr/share/man/man1/zfctl.1.gz \
    /usr/share/doc/zenflowd/copyright /usr/share/doc/zenflowd/changelog.gz; do
  [ -e "\$root\$f" ] || { echo "deb_test: FAIL: the package did not install \$f" >&2; exit 1; }
done
chroot "\$root" getent passwd zenflowd >/dev/null \
  || { echo "deb_test: FAIL: postinst made no zenflowd user" >&2; exit 1; }
[ "\$(chroot "\$root" stat -c %U /var/lib/zenflowd)" = zenflowd ] \
  || { echo "deb_test: FAIL: /var/lib/zenflowd is not the zenflowd user's" >&2; exit 1; }
grep -qx 'ExecStart=/usr/bin/zenflowd --flagfile=/etc/zenflowd/zenflowd.flags' \
    "\$root/lib/systemd/system/zenflowd.service" && grep -qx 'User=zenflowd' "\$root/lib/systemd/system/zenflowd.service" \
  || { echo "deb_test: FAIL: the unit does not run /usr/bin/zenflowd as zenflowd" >&2; exit 1; }
chroot "\$root" dpkg-query -W -f='\${Conffiles}\n' zenflowd | grep -q /etc/zenflowd/zenflowd.flags \
  || { echo "deb_test: FAIL: zenflowd.flags is not a conffile" >&2; exit 1; }
echo "deb_test: \$(chroot "\$root" /usr/bin/zenflowd --version)"
echo "deb_test: starting /usr/bin/zenflowd in the chroot as zenflowd on 127.0.0.1:0"
chroot --userspec=zenflowd:zenflowd "\$root" /usr/bin/zenflowd --listen=127.0.0.1:0 \
  --port_file=/var/lib/zenflowd/port --state_dir=/var/lib/zenflowd --ucx=false \
  > "$tmp/zenflowd.log" 2>&1 &
pid=\$!
stop() { kill -TERM "\$pid" 2>/dev/null && wait "\$pid" 2>/dev/null || true; }
trap stop EXIT
for _ in \$(seq 1 300); do
  [ -s "\$root/var/lib/zenflowd/port" ] && break
  kill -0 "\$pid" 2>/dev/null || { cat "$tmp/zenflowd.log" >&2; echo "deb_test: FAIL: zenflowd exited" >&2; exit 1; }
  sleep 0.1
done
[ -s "\$root/var/lib/zenflowd/port" ] || { cat "$tmp/zenflowd.log" >&2; echo "deb_test: FAIL: no port file" >&2; exit 1; }
port=\$(cat "\$root/var/lib/zenflowd/port")
answer=\$("$health_check" --target=127.0.0.1:\$port --timeout_s=20) \
  || { cat "$tmp/zenflowd.log" >&2; echo "deb_test: FAIL: health check: \$answer" >&2; exit 1; }
echo "deb_test: grpc.health.v1.Health/Check at 127.0.0.1:\$port (zenflowd from the package): \$answer"
[ "\$answer" = SERVING ] || exit 1
stop
trap - EXIT
chroot "\$root" dpkg --purge zenflowd >/dev/null
[ ! -e "\$root/usr/bin/zenflowd" ] || { echo "deb_test: FAIL: dpkg --purge left /usr/bin/zenflowd" >&2; exit 1; }
echo "deb_test: dpkg --purge zenflowd: removed"
NS
chmod +x "$tmp/ns.sh"
step "install and start (mount namespace)"
unshare --mount --propagation private "$tmp/ns.sh"
step "passed"
