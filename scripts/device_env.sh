#!/usr/bin/env bash
# Source THERE (the GPU machine), from the repo root: unpacks the carried .debs/ into /tmp/debroot
# and points cmake, pkg-config and the loader at it.   source scripts/device_env.sh
if [ ! -d /tmp/debroot/usr ]; then
  for f in .debs/*.deb; do dpkg -x "$f" /tmp/debroot; done
fi
export CMAKE_PREFIX_PATH=/tmp/debroot/usr
export PKG_CONFIG_LIBDIR=/tmp/debroot/usr/lib/x86_64-linux-gnu/pkgconfig:/tmp/debroot/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=/tmp/debroot
export LD_LIBRARY_PATH=/tmp/debroot/usr/lib/x86_64-linux-gnu:/tmp/debroot/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CPATH=/tmp/debroot/usr/include${CPATH:+:$CPATH}
export PATH=/tmp/debroot/usr/bin:$PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
