#!/usr/bin/env bash
# Run HERE (the Debian machine): downloads the .deb files a build on the GPU machine needs into the
# git-ignored .debs/ folder, which device calls carry. The GPU machine (Ubuntu 24.04) has CUDA,
# cmake, ninja, OpenBLAS and python, but none of these libraries.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .debs
cd .debs
PKGS=(libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 nlohmann-json3-dev libcli11-dev libgtest-dev
      libgmock-dev libbenchmark-dev libbenchmark1debian libpcre2-dev libpcre2-8-0 libpcre2-16-0
      libpcre2-32-0 libpcre2-posix3 liburing-dev liburing2 libopenblas-dev libopenblas0
      libopenblas0-pthread libopenblas-pthread-dev libgfortran5 coinor-libcbc-dev coinor-libcbc3
      coinor-libcgl1 coinor-libclp1 coinor-libcoinutils3v5 coinor-libosi1v5 coinor-libcgl-dev
      coinor-libclp-dev coinor-libcoinutils-dev coinor-libosi-dev libcpp-httplib-dev
      libcpp-httplib0.11 ccache libicu-dev libicu72 libbrotli-dev)
apt-get download "${PKGS[@]}" >/dev/null
ls -1 | wc -l
