#!/usr/bin/env bash
# DRAM throughput of the decode kernel on chosen shapes of `bench_attention.py --decode`,
# measured by Nsight Compute (one decode_kernel or decode_sm90_kernel launch per shape, after 3 warm-up
# launches). Needs a CUDA build (default build/cuda) and ncu; prints the metrics.
#
#   bash bench/decode_ncu.sh ['^decode llama3-70b-tp8 256x2k q1 p16' ...]
#
# VARIANT=<name> profiles instead a binary that `KERNEL=decode bash bench/prefill_variants.sh
# <name>:<flags>` built (build/variants-decode/<name>), on shape indices of its list
# (default 4 10 12 8 6), with ncu's SpeedOfLight, MemoryWorkloadAnalysis, WarpStateStats,
# SchedulerStats, Occupancy and LaunchStats sections, of NCU_KERNEL (default
# decode_sm90_kernel; decode_kernel for a build with -DPAGEDMHA_DECODE_SM90=0):
#
#   VARIANT=default bash bench/decode_ncu.sh [4 10 ...]
#   VARIANT=portable NCU_KERNEL=decode_kernel bash bench/decode_ncu.sh 4 12
#
# NCU_SKIP / NCU_LAUNCHES (default 3 / 1): matching launches skipped, then profiled; the
# decode kernel and its split merge of one call:
#   VARIANT=default NCU_KERNEL='decode_sm90_kernel|decode_merge' NCU_SKIP=6 NCU_LAUNCHES=2 bash bench/decode_ncu.sh 6
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${VARIANT:-}" ]; then
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  bin=build/variants-decode/$VARIANT
  [ -x "$bin" ] || { echo "decode_ncu: $bin not built (bench/prefill_variants.sh)" >&2; exit 2; }
  shapes=("$@")
  [ ${#shapes[@]} -eq 0 ] && shapes=(4 10 12 8 6)
  for sh in "${shapes[@]}"; do
    echo "=== $VARIANT shape $sh"
    timeout 120 "$ncu" --clock-control none -k "regex:${NCU_KERNEL:-decode_sm90_kernel}" --launch-skip "${NCU_SKIP:-3}" \
      --launch-count "${NCU_LAUNCHES:-1}" \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section SchedulerStats --section Occupancy --section LaunchStats \
      "$bin" "$VARIANT" "${TMPDIR:-/tmp}/decode-ncu.jsonl" "$sh" 2>&1 | grep -v -E '^==PROF==|^\s*$|----'
  done
  exit 0
fi
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
