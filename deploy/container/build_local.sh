#!/usr/bin/env bash
# Builds the zenflowd image with buildah on a Debian 12 base made here,
# without pulling from a registry:
#
#   deploy/container/build_local.sh [TAG]     (default localhost/zenflow/zenflowd:dev)
#
# The base is the debootstrap root of deploy/debian/debian_root.sh (minbase
# with the package's Depends, cached under ~/.cache/zenflow), committed as
# localhost/zenflow/debian:12-local; the image is the Containerfile over it
# (--build-arg BASE), with dist/zenflowd_*_amd64.deb (./zf deb) as the
# context. apt-get inside the build reaches the Debian archive the root's
# sources name. Then zenflowd --version runs in the image. Needs root; uses
# the vfs storage driver and chroot isolation, which work inside a container.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tag=${1:-localhost/zenflow/zenflowd:dev}
deb=$(ls "$root"/dist/zenflowd_*_amd64.deb 2>/dev/null | tail -n 1)
[ -n "$deb" ] || { echo "build_local.sh: no dist/zenflowd_*_amd64.deb: run ./zf deb first" >&2; exit 1; }
b=(buildah --storage-driver=vfs)
work=$(mktemp -d)
ctr=""
cleanup() {
  [ -n "$ctr" ] && "${b[@]}" rm "$ctr" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
include=$(dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed -E 's/\(.*\)//; s/\|.*//; s/ //g' \
  | sed '/^$/d' | paste -sd, -)
"$here/../debian/debian_root.sh" "$include" "$work/rootfs"
ctr=$("${b[@]}" from scratch)
mnt=$("${b[@]}" mount "$ctr")
cp -a "$work/rootfs/." "$mnt/"
"${b[@]}" umount "$ctr" >/dev/null
"${b[@]}" commit --quiet "$ctr" localhost/zenflow/debian:12-local >/dev/null
"${b[@]}" rm "$ctr" >/dev/null
ctr=""
mkdir -p "$work/context"
cp "$deb" "$work/context/"
"${b[@]}" bud --isolation=chroot --build-arg BASE=localhost/zenflow/debian:12-local \
  -t "$tag" -f "$here/Containerfile" "$work/context"
ctr=$("${b[@]}" from "$tag")
"${b[@]}" run --isolation=chroot "$ctr" -- /usr/bin/zenflowd --version
"${b[@]}" run --isolation=chroot "$ctr" -- id
echo "build_local.sh: built $tag"
