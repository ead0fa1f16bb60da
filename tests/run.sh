#!/usr/bin/env bash
# Builds gpucompute and runs every test: installs the build dependencies if needed,
# then the CMake workflow presets: default (configure, build, ctest) and sanitize (one
# clang build: every unit and integration test under AddressSanitizer and
# UndefinedBehaviorSanitizer, the build failing on any lock-annotation warning, and the
# fuzz targets, each fuzzed for a bounded time).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
cmake --workflow --preset default
# clang, ASan+UBSan: the tests (less the `image` label) and the fuzz targets, each fuzzed
# for GPUCOMPUTE_FUZZ_SECONDS (30 s); -Werror=thread-safety checks the lock annotations.
cmake --workflow --preset sanitize
