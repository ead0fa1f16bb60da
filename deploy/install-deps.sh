#!/usr/bin/env bash
# Installs the Debian packages gpucompute needs (Debian 12 or later; the CUDA image's
# Ubuntu 24.04 too), unless they are already there.
#
#   install-deps.sh               build and test: compilers, libraries, GoogleTest, clang,
#                                 and the tools the tests drive (prometheus, kubectl,
#                                 yamllint, python3-kubernetes, docker-compose, haproxy)
#   install-deps.sh --build-only  only what building needs (the container images)
#   install-deps.sh --image-tools also podman and buildah, for deploy/test-image.sh
set -euo pipefail

build=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libabsl-dev
  libcivetweb-dev
  # The CLI's and the benchmarks' flag parser, header-only.
  libcli11-dev
  # The serving programs' malloc, tcmalloc (GPUCOMPUTE_ALLOCATOR in CMakeLists.txt).
  libgoogle-perftools-dev
  # The CPU backend's matmul: the system's BLAS, OpenBLAS (server/cpu/matmul.cc).
  libopenblas-dev
)
test=(
  libgtest-dev libgmock-dev
  # The sanitize, tsan and thread-safety presets build with clang; sanitize links
  # libFuzzer and the sanitizers from compiler-rt.
  clang libclang-rt-dev
  # The Python client and its pytest suite; mypy checks a program against its annotations.
  python3-numpy python3-grpcio python3-protobuf python3-pytest python3-mypy
  # The metrics test scrapes the server with a real Prometheus; promtool lints the text.
  prometheus
  # The Kubernetes manifests are rendered with kubectl kustomize, checked against the
  # API's types and linted.
  python3-kubernetes python3-yaml yamllint
  # deploy/compose.yaml is checked against the Compose schema.
  docker-compose
  # The proxy in front of a sharded deployment (deploy/placement.py haproxy); its tests
  # run it on loopback.
  haproxy
)
image=(podman buildah runc)

packages=("${build[@]}")
case "${1:-}" in
  --build-only) ;;
  --image-tools) packages+=("${test[@]}" "${image[@]}") ;;
  "") packages+=("${test[@]}") ;;
  *) echo "usage: $0 [--build-only|--image-tools]" >&2; exit 2 ;;
esac
# Any kubectl will do; Debian's is kubernetes-client.
if [ "${1:-}" != --build-only ] && ! command -v kubectl >/dev/null; then
  packages+=(kubernetes-client)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "installing: ${missing[*]}" >&2
$sudo apt-get update -qq
# Packages that start a service (prometheus, haproxy) must not start it here: the tests run
# their own, on ports of their choosing.
policy=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  policy=/usr/sbin/policy-rc.d
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod +x "$policy"
fi
status=0
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" || status=$?
[ -n "$policy" ] && $sudo rm -f "$policy"
exit $status
