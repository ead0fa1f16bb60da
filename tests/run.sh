#!/usr/bin/env bash
# Builds gpucompute and runs every test: installs the build dependencies if needed,
# then the CMake workflow presets: default (configure, build, ctest), thread-safety
# (a clang build that fails on any lock-annotation warning) and fuzz (the fuzz targets,
# fuzzed for a bounded time).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
cmake --workflow --preset default
# The lock annotations, checked by clang's -Wthread-safety (a build, no tests).
cmake --workflow --preset thread-safety
# libFuzzer with ASan and UBSan: each fuzz target for GPUCOMPUTE_FUZZ_SECONDS (30 s).
cmake --workflow --preset fuzz
