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
mkdir -p build
tar cJf build/debroot.tar.xz -C "$tmp" .
ls -la build/debroot.tar.xz
