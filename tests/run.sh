#!/usr/bin/env bash
# Builds gpucompute and runs every test: installs the build dependencies if needed,
# then the CMake workflow presets: default (configure, build, ctest) and sanitize (one
# clang build: every unit and integration test under AddressSanitizer and
# UndefinedBehaviorSanitizer, the build failing on any lock-annotation warning, and the
# fuzz targets, each fuzzed for a bounded time); then, with a CUDA compiler, the CUDA
# backend under clang's -Werror=thread-safety.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
cmake --workflow --preset default
# clang, ASan+UBSan: the tests (less the `image` label) and the fuzz targets, each fuzzed
# for GPUCOMPUTE_FUZZ_SECONDS (30 s); -Werror=thread-safety checks the lock annotations.
cmake --workflow --preset sanitize
# The sanitize build has no CUDA: where a CUDA compiler is installed, the CUDA backend's
# host code (its module, with the CPU backend and the kernels it carries) is built once
# more with clang and -Werror=thread-safety, so that its lock annotations are checked too.
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  cmake --preset thread-safety
  cmake --build --preset thread-safety --target gpucompute_cuda_backend
fi
