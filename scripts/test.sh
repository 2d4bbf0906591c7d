#!/usr/bin/env bash
# The test command: installs dependencies, builds (with the CUDA kernels when nvcc is
# present), and runs the CPU test suites (ctest label `cpu`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
jobs=${JOBS:-$(nproc)}
cmake --preset default >/dev/null
cmake --build --preset default -j "$jobs"
ctest --preset default -j "$jobs" --timeout 1200
