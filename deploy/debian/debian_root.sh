#!/usr/bin/env bash
# Lays out a fresh Debian 12 (bookworm) root at DEST, made by debootstrap
# (minbase) from the Debian archive this machine's apt uses, with the
# packages of INCLUDE (comma-separated) installed, so that nothing needs apt
# inside it later.
#
#   debian_root.sh INCLUDE DEST
#
# debootstrap downloads and installs a few hundred MB once; the result is
# cached as a tarball under ~/.cache/zenflow/debian-root/, named after a hash
# of the sorted include list, and later calls unpack it (seconds). Needs
# root (debootstrap, and unpacking files owned by root).
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: debian_root.sh INCLUDE DEST" >&2
  exit 2
fi
include=$(printf '%s' "$1" | tr ',' '\n' | sed '/^$/d' | LC_ALL=C sort -u | paste -sd, -)
dest=$2
if [ "$(id -u)" -ne 0 ]; then
  echo "debian_root.sh: debootstrap and chroot need root" >&2
  exit 1
fi
cache="${ZF_CACHE_DIR:-$HOME/.cache/zenflow}/debian-root"
key=$(printf 'bookworm minbase %s' "$include" | sha256sum | cut -c1-16)
tarball="$cache/bookworm-minbase-$key.tar.gz"

# The archive apt uses here (deb822 or one-line sources), so that the root
# comes from the same mirror, and no host is written into this file.
mirror() {
  local m
  m=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' \
      | grep -v security | head -n 1 || true)
  [ -n "$m" ] || m=$(grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
      | awk '{print $2}' | grep -v security | head -n 1 || true)
  [ -n "$m" ] || { echo "debian_root.sh: no Debian archive in apt's sources" >&2; return 1; }
  printf '%s\n' "$m"
}

if [ ! -s "$tarball" ]; then
  mkdir -p "$cache"
  work=$(mktemp -d "$cache/.bootstrap.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  m=$(mirror)
  echo "debian_root.sh: debootstrap bookworm (minbase, +$include) from $m, once; cached as $tarball" >&2
  if ! debootstrap --variant=minbase --include="$include" bookworm "$work/root" "$m" \
      > "$work/debootstrap.log" 2>&1; then
    tail -n 30 "$work/debootstrap.log" >&2
    [ -f "$work/root/debootstrap/debootstrap.log" ] && tail -n 30 "$work/root/debootstrap/debootstrap.log" >&2
    echo "debian_root.sh: debootstrap failed (is the Debian archive reachable?)" >&2
    exit 1
  fi
  # The downloaded .debs are not part of the root.
  rm -rf "$work/root/var/cache/apt/archives/"*.deb
  tar -C "$work/root" --numeric-owner -czf "$work/root.tar.gz" .
  printf '%s\n' "$include" > "${tarball%.tar.gz}.include"
  mv "$work/root.tar.gz" "$tarball"
fi
mkdir -p "$dest"
tar -C "$dest" --numeric-owner -xzf "$tarball"
