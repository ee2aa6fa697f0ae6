#!/usr/bin/env bash
# Prints the Depends of the zenflowd package for BINARY...: the Debian
# library packages of what they link (dpkg-shlibdeps, from this machine's
# dpkg database and shlibs files: Debian 12's), after adduser (postinst
# makes the system user with it). build_deb.sh writes it into the package;
# //deploy/container:runtime_packages_test checks it against ldd.
#
#   depends.sh BINARY...
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: depends.sh BINARY..." >&2; exit 2; }
work=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/zf-depends.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debian"
printf 'Source: zenflowd\n\nPackage: zenflowd\nArchitecture: amd64\n' > "$work/debian/control"
args=()
for b in "$@"; do args+=("-e$(realpath "$b")"); done
shlibs=$(cd "$work" && dpkg-shlibdeps -O "${args[@]}" 2>"$work/err" | sed -n 's/^shlibs:Depends=//p') || true
if [ -z "$shlibs" ]; then
  cat "$work/err" >&2
  echo "depends.sh: dpkg-shlibdeps found no dependencies" >&2
  exit 1
fi
echo "adduser, $shlibs"
