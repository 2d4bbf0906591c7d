#!/usr/bin/env bash
# Nsight Compute profile of one Hopper prefill variant on one shape of
# bench/prefill_sm90_variants.cu (build it first with bench/prefill_variants.sh, which
# leaves build/variants-prefill/<name>). Writes <out>/<name>-s<shape>.txt (every section of the
# `full` set) and <out>/<name>-s<shape>-sass.csv (per-instruction SASS with its stall
# samples; SASS=0 leaves it out), and prints the headline figures. Clocks are left as
# they are. The variant fa3-dense (FA3_DIR in prefill_variants.sh) is profiled the same
# way, on its own shape list (bench/fa3_peer.cu); its kernel is CUTLASS's device_kernel.
#
#   bash bench/prefill_profile.sh <variant name> <shape index> [out dir, default build/profile]
set -uo pipefail
cd "$(dirname "$0")/.."
name=$1 shape=$2 out=${3:-build/profile}
bin=build/variants-prefill/$name
[ -x "$bin" ] || { echo "prefill_profile: $bin not built (bash bench/prefill_variants.sh $name:...)" >&2; exit 2; }
mkdir -p "$out"
rep=$out/$name-s$shape
kernel=prefill_kernel
[ "$name" = fa3-dense ] && kernel=device_kernel
ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip 1 --launch-count 1 --set full \
  --import-source no -f -o "$rep" "$bin" "$name" /dev/null "$shape" >"$rep.log" 2>&1 || { tail -5 "$rep.log"; exit 1; }
ncu -i "$rep.ncu-rep" --page details >"$rep.txt" 2>&1
[ "${SASS:-1}" = 1 ] && { ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$rep-sass.csv" 2>&1 || true; }
rm -f "$rep.ncu-rep" "$rep.log"
echo "== $name shape $shape"
grep -E "^ +(Duration|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit Rate|L2 Hit Rate|DRAM Throughput|Registers Per Thread|Issue Slots Busy|No Eligible|Warp Cycles Per Issued Instruction|Executed Instructions  )" "$rep.txt" | head -20
