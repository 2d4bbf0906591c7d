#!/usr/bin/env bash
# The main job: installs dependencies, builds, and runs `pagedmha replay` on its built-in
# workload (on the GPU when there is one, else on the CPU). Extra arguments go to replay,
# e.g. `bash scripts/replay.sh --trace ../shared/traces/AzureLLMInferenceTrace_conv.csv`.
# Relative paths in the arguments (--trace, --json) are taken from the caller's directory.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
(
  cd "$root"
  bash scripts/bootstrap.sh
  jobs=${JOBS:-$(nproc)}
  cmake --preset default >/dev/null
  cmake --build --preset default -j "$jobs" --target pagedmha_cli >&2  # stdout is the replay's
)
exec "$root/build/default/tools/pagedmha" replay "$@"
