#!/usr/bin/env bash
# The test command: installs dependencies, builds (with the CUDA kernels when nvcc is
# present), runs the CPU test suites (ctest label `cpu`), builds the Python wheel (CPU-only,
# scripts/wheel.sh) and runs the Python tests against it in a fresh venv, then the fast CPU
# suites again under AddressSanitizer + UBSan (non-recoverable: the `asan` preset) and the
# libFuzzer targets of the trace readers and the scheduler (scripts/fuzz.sh, FUZZ_SECONDS
# each, default 60). Where nvcc is present it also compiles the Hopper prefill's variants
# benchmark (bench/prefill_variants.sh BUILD_ONLY=1; PAGEDMHA_KNOB_BUILD=0 skips it). PAGEDMHA_WHEEL=0 skips the wheel stage, PAGEDMHA_SANITIZERS=0 the last two.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
jobs=${JOBS:-$(nproc)}
t0=$(date +%s)
cmake --preset default >/dev/null
cmake --build --preset default -j "$jobs"
ctest --preset default -j "$jobs" --timeout 1200
echo "test.sh: build + CPU suites $(( $(date +%s) - t0 )) s" >&2
nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ -x "$nvcc_bin" ] && [ "${PAGEDMHA_KNOB_BUILD:-1}" != 0 ]; then
  # The variants benchmark (no other build compiles it) and any experiment knob of
  # policy.h that waits for a GPU run (off in the library) still compile: list such a
  # knob here as "knobs:-D...=1" beside the default.
  tk=$(date +%s)
  PATH=$PATH:$(dirname "$nvcc_bin") BUILD_ONLY=1 bash bench/prefill_variants.sh "default:" \
    "knobs:-DPAGEDMHA_SM90_PLAN_PAIR_ROUNDS=0 -DPAGEDMHA_SM90_FP8_WG3=0 -DPAGEDMHA_SM90_PRED_RELEASE=0 -DPAGEDMHA_SM90_FP8_D256_TEAMS=0"
  echo "test.sh: Hopper prefill knob build $(( $(date +%s) - tk )) s" >&2
  tk=$(date +%s)
  PATH=$PATH:$(dirname "$nvcc_bin") KERNEL=decode BUILD_ONLY=1 bash bench/prefill_variants.sh \
    "knobs:-DPAGEDMHA_DECODE_SM90_PAIRS16=1"
  echo "test.sh: Hopper decode knob build $(( $(date +%s) - tk )) s" >&2
fi
if [ "${PAGEDMHA_WHEEL:-1}" != 0 ]; then
  tw=$(date +%s)
  bash scripts/wheel.sh
  echo "test.sh: wheel (CPU-only) + Python tests against it in a venv $(( $(date +%s) - tw )) s" >&2
fi
if [ "${PAGEDMHA_SANITIZERS:-1}" != 0 ]; then
  t1=$(date +%s)
  cmake --preset asan >/dev/null
  cmake --build --preset asan -j "$jobs"
  # The long replay runs stay in the plain suite (under ASan they take ~15 min); the
  # fuzzers cover the readers and the scheduler under the sanitizers. The consumer
  # projects build with their own flags: once is enough.
  slow='^(consumer_|tools_replay_default|Replay\.(LlamaLike|HybridWindow|HugeWindowMatchesFullAttention|DryRunPlans|ReportStrides)|ReplayProgress\.Complete|ReplayTimeLimit\.Generous|Check\.EveryOp|MultiRank\.(TensorParallelReplicated|DecodeContextParallelRanks|ScalingAgainst))'
  # allocator_may_return_null: oversized requests must reach our own error path, as
  # they do without ASan, instead of aborting in the interceptor.
  ASAN_OPTIONS=${ASAN_OPTIONS:-allocator_may_return_null=1} \
  ctest --test-dir build/asan -L cpu -E "$slow" -j "$jobs" --timeout 1200 --output-on-failure
  echo "test.sh: ASan + UBSan suites $(( $(date +%s) - t1 )) s" >&2
  t2=$(date +%s)
  bash scripts/fuzz.sh "${FUZZ_SECONDS:-60}"
  echo "test.sh: fuzzers $(( $(date +%s) - t2 )) s" >&2
fi
echo "test.sh: all stages $(( $(date +%s) - t0 )) s" >&2
