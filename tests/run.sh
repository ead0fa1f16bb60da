#!/usr/bin/env bash
# Builds gpucompute and runs every test: installs the build dependencies if needed,
# then the CMake workflow presets: default (configure, build, ctest) and thread-safety
# (a clang build that fails on any lock-annotation warning).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
cmake --workflow --preset default
# The lock annotations, checked by clang's -Wthread-safety (a build, no tests).
cmake --workflow --preset thread-safety
