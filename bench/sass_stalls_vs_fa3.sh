#!/usr/bin/env bash
# The KV-step loop of the Hopper prefill kernels against FlashAttention-3's, by ptxas's
# stall counts (scripts/sass_stalls.py; docs/perf-notes/prefill-sm90-schedule.md section
# 15). No GPU needed: nvcc (sm_90a), cuobjdump, CUTLASS headers and a flash-attention
# checkout (FA3_DIR; its instantiations are the ones bench/fa3_peer.cu times).
#
#   FA3_DIR=<flash-attention checkout> [OURS_FLAGS="-DPAGEDMHA_SM90_SPEC_SOFTMAX=1"] \
#     bash bench/sass_stalls_vs_fa3.sh [head dims, default "64 128 256"]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "${FA3_DIR:-}/hopper/flash_fwd_launch_template.h" ] ||
  { echo "sass_stalls_vs_fa3: FA3_DIR: expected a flash-attention checkout with hopper/, got '${FA3_DIR:-}'" >&2; exit 2; }
inc=${CUTLASS_INCLUDE:-.deps/cutlass/include}
[ -d "$inc/cute" ] || { echo "sass_stalls_vs_fa3: CUTLASS headers not found (CUTLASS_INCLUDE)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(-std=c++17 -O3 -DNDEBUG -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -isystem "$inc")
# FA3 with its own flags (its setup.py), ours as the library builds them.
nvcc "${common[@]}" --use_fast_math -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED -DCUTLASS_ENABLE_GDC_FOR_SM90 \
  -DCUTLASS_DEBUG_TRACE_LEVEL=0 --expt-extended-lambda -Isrc -Iinclude -Ibench -I"$FA3_DIR/hopper" \
  -c bench/fa3_peer.cu -o "$tmp/fa3.o" &
for d in ${1:-64 128 256}; do
  # shellcheck disable=SC2086
  nvcc "${common[@]}" -DPAGEDMHA_WITH_SM90=1 -DPAGEDMHA_WITH_CUDA=1 '-DPAGEDMHA_CUDA_ARCHS="90a"' -Isrc -Iinclude \
    ${OURS_FLAGS:-} -c "src/cuda/prefill_sm90/prefill_sm90_hd$d.cu" -o "$tmp/ours_hd$d.o" &
done
wait
# Ours: the bf16 kernels with TMA loads and no soft-cap code (PrefillPolicy<D, false, true>,
# DeviceVariant<false>); FA3: every instantiation of the peer.
python3 scripts/sass_stalls.py "$tmp"/ours_hd*.o --kernels 'PrefillPolicyILi[0-9]+ELb0ELb1EEE13__nv_bfloat16S5_NS1_13DeviceVariantILb0E'
python3 scripts/sass_stalls.py "$tmp/fa3.o" --kernels FlashAttnFwdSm90
