#!/usr/bin/env bash
# Builds gpucompute and runs every test: installs the build dependencies if needed,
# then the CMake workflow preset (configure, build, ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
cmake --workflow --preset default
