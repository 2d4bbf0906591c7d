#!/usr/bin/env bash
# The main job: installs dependencies, builds, and runs `pagedmha replay` on its built-in
# workload (on the GPU when there is one, else on the CPU). Extra arguments go to replay,
# e.g. `bash scripts/replay.sh --trace ../shared/traces/AzureLLMInferenceTrace_conv.csv`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
jobs=${JOBS:-$(nproc)}
cmake --preset default >/dev/null
cmake --build --preset default -j "$jobs" --target pagedmha_cli
exec build/default/tools/pagedmha replay "$@"
