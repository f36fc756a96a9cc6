#!/usr/bin/env bash
# Installs the Debian (bookworm) packages ferry builds with. Idempotent; needs root (or sudo).
# Usage: scripts/setup.sh            # build + test dependencies
#        scripts/setup.sh --tools    # also what the one-off tools/ scripts need (python3-onnx)
# Only the OpenCV modules ferry uses are installed (core, imgproc, dnn): the libopencv-dev
# metapackage pulls every module with VTK and GDAL and dominated CI's install time.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git clang clang-format libclang-rt-14-dev libomp-14-dev
  libopenblas-dev nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev libpcre2-dev libicu-dev
  liburing-dev coinor-libcbc-dev libcpp-httplib-dev
  libopencv-core-dev libopencv-imgproc-dev libopencv-dnn-dev libxgboost-dev
  libgtest-dev libgmock-dev libbenchmark-dev iproute2 curl python3
)
if [ "${1:-}" = "--tools" ]; then PACKAGES+=(python3-onnx); fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
