#!/usr/bin/env bash
# Source THERE (the GPU machine), from the repo root: unpacks the carried .debs/ (or
# build/debroot.tar.xz) into /tmp/debroot
# and points cmake, pkg-config and the loader at it.   source scripts/device_env.sh
# Or from build/debroot.tar.xz (scripts/device_debroot.sh: the same packages unpacked and
# xz-compressed, a few MiB smaller, for when the tree plus .debs passes the carry limit).
if [ ! -d /tmp/debroot/usr ]; then
  if [ -d .debs ]; then
    for f in .debs/*.deb; do dpkg -x "$f" /tmp/debroot; done
  elif [ -f build/debroot.tar.xz ]; then
    mkdir -p /tmp/debroot && tar xJf build/debroot.tar.xz -C /tmp/debroot
  fi
fi
# CBC's pkg-config asks for -lbz2; Ubuntu has the runtime but not the dev symlink.
if [ ! -e /tmp/debroot/usr/lib/x86_64-linux-gnu/libbz2.so ] && [ -e /usr/lib/x86_64-linux-gnu/libbz2.so.1.0 ]; then
  ln -s /usr/lib/x86_64-linux-gnu/libbz2.so.1.0 /tmp/debroot/usr/lib/x86_64-linux-gnu/libbz2.so
fi
# cpp-httplib's pkg-config requires openssl, zlib and brotli .pc files; the GPU machine has their
# headers and runtimes (brotli headers come from the carried libbrotli-dev) but not all .pc files.
for n in openssl zlib libbrotlicommon libbrotlidec libbrotlienc; do
  pc=/tmp/debroot/usr/lib/x86_64-linux-gnu/pkgconfig/$n.pc
  # A high version: httplib.pc asks for e.g. openssl >= 1.1.1.
  [ -f "$pc" ] && grep -q "^Description: stub" "$pc" && rm "$pc"
  [ -f "$pc" ] || printf "Name: %s\nDescription: stub, system runtime\nVersion: 99.0\nLibs:\nCflags:\n" "$n" >"$pc"
done
export LIBRARY_PATH=/tmp/debroot/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
export CMAKE_PREFIX_PATH=/tmp/debroot/usr
export PKG_CONFIG_LIBDIR=/tmp/debroot/usr/lib/x86_64-linux-gnu/pkgconfig:/tmp/debroot/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=/tmp/debroot
export LD_LIBRARY_PATH=/tmp/debroot/usr/lib/x86_64-linux-gnu:/tmp/debroot/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CPATH=/tmp/debroot/usr/include${CPATH:+:$CPATH}
export PATH=/tmp/debroot/usr/bin:$PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
