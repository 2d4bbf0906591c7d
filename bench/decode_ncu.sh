#!/usr/bin/env bash
# DRAM throughput of the decode kernel on chosen shapes of `bench_attention.py --decode`,
# measured by Nsight Compute (one decode_kernel or decode_sm90_kernel launch per shape, after 3 warm-up
# launches). Needs a CUDA build (default build/cuda) and ncu; prints the metrics.
#
#   bash bench/decode_ncu.sh ['^decode llama3-70b-tp8 256x2k q1 p16' ...]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${PAGEDMHA_BUILD_DIR:-$PWD/build/cuda}
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
filters=("$@")
[ ${#filters[@]} -eq 0 ] && filters=('^decode llama3-70b-tp8 256x2k q1 p16' '^decode gpt-oss 128x32k q1 p16 bf16 w127')
metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum
metrics=$metrics,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active
for f in "${filters[@]}"; do
  echo "== $f"
  # OUT (the GPU machine's result folder) would receive the bench's JSON: not wanted here.
  env -u OUT PYTHONPATH="$PWD/python" PAGEDMHA_BUILD_DIR="$build" "$ncu" -k "regex:decode(_sm90)?_kernel" --launch-skip 3 \
    --launch-count 1 --metrics "$metrics" python3 bench/bench_attention.py --decode --filter "$f" \
    --out-dir "${TMPDIR:-/tmp}/decode-ncu" 2>&1 | grep -E "decode(_sm90)?_kernel|gpu__|dram__|sm__|launch__"
done
