#!/usr/bin/env bash
# Run HERE after scripts/device_debs.sh: unpacks .debs/*.deb without their docs into one
# xz-compressed tree, build/debroot.tar.xz, to carry to the GPU machine instead of .debs when the
# tracked tree plus .debs passes the 64 MiB carry limit (session 30: 24.7 + 40.2 MiB).
# scripts/device_env.sh unpacks it into /tmp/debroot when .debs is absent. Takes ~90 s (xz).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in .debs/*.deb; do dpkg -x "$f" "$tmp"; done
rm -rf "$tmp/usr/share/doc" "$tmp/usr/share/man" "$tmp/usr/share/lintian"
# Static archives whose shared library sits beside them are never linked (the build links the .so),
# and they are half the size (OpenBLAS, ICU data): dropped so the carry stays under 64 MiB (session
# 34: tree 26.9 MB + the full root 39.3 MB passed it; without them 22.3 MB). Archives without a .so (gtest) stay.
find "$tmp" -name '*.a' | while read -r a; do
  [[ -e "${a%.a}.so" ]] && rm -f "$a"
done
mkdir -p build
tar cJf build/debroot.tar.xz -C "$tmp" .
ls -la build/debroot.tar.xz
