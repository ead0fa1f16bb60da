#!/usr/bin/env bash
# Installs the Debian packages gpucompute builds with (Debian 12 or later), unless they
# are already there.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config clang
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libabsl-dev
  libgtest-dev libgmock-dev
  python3-numpy python3-grpcio python3-protobuf python3-pytest
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "installing: ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
