#!/usr/bin/env bash
# Builds the Debian package of the daemon: OUT/zenflowd_VERSION_amd64.deb.
#
#   build_deb.sh ZENFLOWD ZFCTL OUT
#
# ZENFLOWD and ZFCTL are the binaries (./zf deb passes Bazel's -c opt builds).
# The package holds:
#   /usr/bin/zenflowd, /usr/bin/zfctl          stripped
#   /lib/systemd/system/zenflowd.service       deploy/systemd's unit, run as the
#                                              zenflowd user (not enabled)
#   /etc/zenflowd/zenflowd.flags               deploy/systemd's flag file (a conffile)
#   /usr/share/man/man8/zenflowd.8.gz, man1/zfctl.1.gz   from each one's --help
#   /usr/share/doc/zenflowd/{copyright,changelog.gz}
# and postinst makes the system user zenflowd, /var/lib/zenflowd and
# /etc/zenflowd/tls. Depends comes from dpkg-shlibdeps (the Debian 12 library
# packages of what the binaries link) plus adduser (depends.sh). The version is
# server/version.h's (the daemon's), and deploy/debian/changelog's newest
# entry must name it.
set -euo pipefail

if [ $# -ne 3 ]; then
  echo "usage: build_deb.sh ZENFLOWD ZFCTL OUT" >&2
  exit 2
fi
zenflowd=$1 zfctl=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

version=$(sed -n 's/.*kZenflowVersion\[\] *= *"\([^"]*\)".*/\1/p' "$root/server/version.h")
[ -n "$version" ] || { echo "build_deb.sh: no kZenflowVersion in server/version.h" >&2; exit 1; }
changelog_version=$(sed -n '1s/^zenflowd (\([^)]*\)).*/\1/p' "$here/changelog")
if [ "$changelog_version" != "$version" ]; then
  echo "build_deb.sh: deploy/debian/changelog's newest entry is $changelog_version, the version" \
    "is $version (server/version.h): add an entry for $version" >&2
  exit 1
fi
# The changelog entry's date, for reproducible man pages.
stamp=$(sed -n 's/^ -- .*>  \(.*\)$/\1/p' "$here/changelog" | head -n 1)
export SOURCE_DATE_EPOCH
SOURCE_DATE_EPOCH=$(date -d "$stamp" +%s)
man_date=$(LC_ALL=C date -u -d "@$SOURCE_DATE_EPOCH" '+%B %Y')

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pkg="$work/zenflowd"
umask 022
install -d "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/lib/systemd/system" "$pkg/etc/zenflowd" \
  "$pkg/usr/share/doc/zenflowd" "$pkg/usr/share/man/man8" "$pkg/usr/share/man/man1" \
  "$pkg/usr/share/lintian/overrides"
install -m 0755 "$zenflowd" "$pkg/usr/bin/zenflowd"
install -m 0755 "$zfctl" "$pkg/usr/bin/zfctl"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$pkg/usr/bin/zenflowd" \
  "$pkg/usr/bin/zfctl"

# The unit of deploy/systemd with the package's paths, and the package's
# system user in place of a dynamic one (checkpoints keep one owner across
# restarts; every sandboxing line of the unit stays).
python3 "$here/package_unit.py" < "$root/deploy/systemd/zenflowd.service" \
  > "$pkg/lib/systemd/system/zenflowd.service"
chmod 0644 "$pkg/lib/systemd/system/zenflowd.service"
install -m 0644 "$root/deploy/systemd/zenflowd.flags" "$pkg/etc/zenflowd/zenflowd.flags"
install -m 0644 "$here/copyright" "$pkg/usr/share/doc/zenflowd/copyright"
gzip -9n < "$here/changelog" > "$pkg/usr/share/doc/zenflowd/changelog.gz"
install -m 0644 "$here/lintian-overrides" "$pkg/usr/share/lintian/overrides/zenflowd"

# Man pages from --help (whatever its exit status).
man_page() {  # BINARY NAME SECTION SUMMARY FILES SEE_ALSO
  { "$1" --help 2>&1 || true; } | python3 "$here/help2roff.py" --name="$2" --section="$3" \
    --version="$version" --date="$man_date" --summary="$4" --files="$5" --see_also="$6" \
    | gzip -9n > "$pkg/usr/share/man/man$3/$2.$3.gz"
}
man_page "$pkg/usr/bin/zenflowd" zenflowd 8 "the ZenFlow optimizer daemon" \
  "/etc/zenflowd/zenflowd.flags the flags the systemd unit starts zenflowd with (--flagfile); /etc/zenflowd/tls/ the TLS certificate, key and CA the unit hands to zenflowd; /var/lib/zenflowd/ checkpoints (--state_dir)" \
  "zfctl(1), systemctl(1); /usr/share/doc/zenflowd/"
man_page "$pkg/usr/bin/zfctl" zfctl 1 "inspect and manage the jobs of a running zenflowd" \
  "" "zenflowd(8)"

install -m 0644 "$here/conffiles" "$pkg/DEBIAN/conffiles"
install -m 0755 "$here/postinst" "$here/prerm" "$here/postrm" "$pkg/DEBIAN/"

# Depends: adduser and the library packages of what the binaries link.
depends=$("$here/depends.sh" "$pkg/usr/bin/zenflowd" "$pkg/usr/bin/zfctl")
size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@INSTALLED_SIZE@/$size/" -e "s/@DEPENDS@/$depends/" \
  "$here/control.in" > "$pkg/DEBIAN/control"
(cd "$pkg" && find usr lib etc -type f ! -path 'etc/*' -print0 | sort -z | xargs -0 md5sum) \
  > "$pkg/DEBIAN/md5sums"
chmod 0644 "$pkg/DEBIAN/control" "$pkg/DEBIAN/md5sums" "$pkg/DEBIAN/conffiles"
find "$pkg" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

mkdir -p "$out"
deb="$out/zenflowd_${version}_amd64.deb"
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" >/dev/null
echo "$deb"
