#!/usr/bin/env bash
# One command for the GPU machine (no internet, no package registry): configure the
# `cuda` preset with the carried dependencies (.deps/), build, run the GPU tests (ctest -L
# gpu: the C++ GPU suites, the Python/torch tests and examples/python/engine_step.py with
# its CUDA-graph step), the SASS check of the Hopper kernels and the SASS counts of the
# decode kernels (scripts/sass_count.py: sass_count.json), the compute-sanitizer subset
# and the attention benchmark; print a short summary last.
# Every stage runs even when an earlier one failed; the exit status is non-zero when
# any stage failed.
#
#   scripts/gpu.sh [--cpu] [--portable] [--sm89] [--no-tests] [--no-bench] [--no-sanitizer] [--reports]
#     --cpu           also run the CPU suites (ctest -L cpu)
#     --portable      also run the GPU suite on the portable (mma.sync) kernels, forced with
#                     PAGEDMHA_KERNELS=portable (the Hopper kernels run by default on sm_90)
#     --sm89          also run the GPU suite with PAGEDMHA_KERNELS=sm89: the portable kernels
#                     in the configurations a GPU with 99 KB of shared memory per CTA gets
#     --reports       also the backend host-overhead benchmark and the trace replays: the two
#                     committed reports' runs, and a fixed number of Azure steps on one device
#                     and again through the multi-rank NCCL path with one rank (--gpus 1 with
#                     --tp 1, then --dcp 1) against it (traces read from $TRACES, default
#                     ../shared/traces)
#   Environment: OUT (log folder; default build/gpu-out), JOBS (build jobs; default
#   nproc), CTEST_JOBS (parallel test programs; default 4), CTEST_REGEX (ctest -R), BENCH_ARGS, TRACES,
#   REPLAY_TIME_LIMIT (s, default 90), REPLAYS (e.g. "azure-conv-llama3-8b:400"), REPLAY_STEPS
#   (steps of the azure-llama3-8b-* runs, default 1000),
#   SANITIZER_TOOLS (default "memcheck racecheck synccheck").
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

run_cpu=0 run_portable=0 run_sm89=0 run_tests=1 run_bench=1 run_sanitizer=1 run_reports=0
for arg in "$@"; do
  case $arg in
    --cpu) run_cpu=1 ;;
    --portable) run_portable=1 ;;
    --sm89) run_sm89=1 ;;
    --no-bench) run_bench=0 ;;
    --no-tests) run_tests=0 ;;
    --no-sanitizer) run_sanitizer=0 ;;
    --reports) run_reports=1 ;;
    *) echo "gpu.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

out=${OUT:-$root/build/gpu-out}
mkdir -p "$out"
build=$root/build/cuda
jobs=${JOBS:-$(nproc)}
ctest_jobs=${CTEST_JOBS:-4}
# Each test program's CPU reference is OpenMP: share the cores among parallel programs.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / ctest_jobs > 0 ? $(nproc) / ctest_jobs : 1 ))}
export PATH=$PATH:/usr/local/cuda/bin
# Results files record the commit; .git may not travel to the GPU machine, so callers can set it.
export PAGEDMHA_COMMIT=${PAGEDMHA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
failed=0
summary=()  # "stage|result|detail"

log() { echo "== gpu.sh: $*" >&2; }
note() { summary+=("$1|$2|$3"); [ "$2" = ok ] || [ "$2" = skipped ] || failed=1; }
seconds_since() { echo $(( $(date +%s) - $1 )); }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1 || true
# The card's model for the reports' file names ("NVIDIA H100 80GB HBM3" -> h100), as
# bench/backend_overhead.cpp names its own.
gpu_tag=$(head -n1 "$out/gpu.txt" | cut -d, -f1 | sed -n 's/^NVIDIA //p' | awk '{print tolower($1)}')
gpu_tag=${gpu_tag:-gpu}

# --- configure + build ----------------------------------------------------------
deps=()
[ -d "$root/.deps" ] && deps=(-DPAGEDMHA_DEPS_DIR="$root/.deps")
# CUTLASS/CuTe headers travel as a tarball (scripts/make_deps.sh).
if [ -f "$root/.deps/cutlass-include.tar.gz" ] && [ ! -d "$root/.deps/cutlass/include/cute" ]; then
  mkdir -p "$root/.deps/cutlass/include" && tar xzf "$root/.deps/cutlass-include.tar.gz" -C "$root/.deps/cutlass/include"
fi
t0=$(date +%s)
# The Hopper objects are always recompiled, so that their ptxas messages (the SASS
# check's C7517 test, sass_check.py --build-log) are in this run's build log, also on an
# incremental build.
find "$build/src" -path '*prefill_sm90*' -name '*.o' -delete 2>/dev/null
log "configure ($build)"
if cmake --preset cuda "${deps[@]}" >"$out/configure.log" 2>&1; then
  log "build (-j$jobs)"
  if cmake --build "$build" -j "$jobs" -- -k 0 >"$out/build.log" 2>&1; then
    note build ok "$(seconds_since "$t0") s"
  else
    note build FAILED "$(seconds_since "$t0") s, see build.log: $(grep -m1 -E 'error' "$out/build.log" | cut -c1-100)"
  fi
else
  note configure FAILED "see configure.log"
fi

# --- ctest ------------------------------------------------------------------------
# Runs one label; records passed/failed per GoogleTest suite from the JUnit report.
# run_ctest LABEL [NAME]: NAME (default LABEL) names the logs and summary rows.
run_ctest() {
  local label=$1 name=${2:-$1} t
  t=$(date +%s)
  log "ctest -L $label ($name)"
  local regex=()
  [ -n "${CTEST_REGEX:-}" ] && regex=(-R "$CTEST_REGEX")
  ctest --test-dir "$build" -L "$label" "${regex[@]}" -j "$ctest_jobs" --timeout 900 --output-on-failure \
    --output-junit "$out/ctest-$name.xml" >"$out/ctest-$name.log" 2>&1
  local rc=$?
  local table
  table=$(python3 - "$out/ctest-$name.xml" <<'EOF'
import collections, sys, xml.etree.ElementTree as ET
try:
    cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
except Exception:
    sys.exit(0)
count = collections.OrderedDict()
for c in cases:
    suite = c.get("name", "?").split(".")[0]
    # GTEST_SKIP: ctest writes status "notrun" with a <skipped> element; not a failure.
    skipped = c.find("skipped") is not None or c.get("status") == "notrun"
    passed = c.get("status") == "run" and c.find("failure") is None
    p, f, s = count.get(suite, (0, 0, 0))
    count[suite] = (p + passed, f + (not passed and not skipped), s + (skipped and not passed))
for suite, (p, f, s) in count.items():
    print(f"{suite}|{p}|{f}|{s}")
EOF
)
  local total_p=0 total_f=0
  while IFS='|' read -r suite p f s; do
    [ -n "$suite" ] || continue
    total_p=$((total_p + p)); total_f=$((total_f + f))
    local skips=""
    [ "${s:-0}" -gt 0 ] && skips=", $s skipped"
    if [ "$f" -eq 0 ]; then note "  $name/$suite" ok "$p passed$skips"; else note "  $name/$suite" FAILED "$p passed, $f failed$skips"; fi
  done <<<"$table"
  if [ $rc -eq 0 ] && [ $((total_p + total_f)) -gt 0 ]; then
    note "ctest -L $label ($name)" ok "$total_p passed in $(seconds_since "$t") s"
  else
    note "ctest -L $label ($name)" FAILED "$total_p passed, $total_f failed (rc $rc) in $(seconds_since "$t") s, see ctest-$name.log"
  fi
}

# --- SASS of the Hopper kernels: HGMMA in every one, no local memory ---------------
if [ -d "$build" ]; then
  objs=$(find "$build/src" -path '*prefill_sm90*' -name '*.o' 2>/dev/null | sort)
  if [ -n "$objs" ]; then
    # shellcheck disable=SC2086
    if python3 scripts/sass_check.py --build-log "$out/build.log" $objs >"$out/sass_check.log" 2>&1; then
      note "sass check" ok "$(tail -n1 "$out/sass_check.log")"
    else
      note "sass check" FAILED "$(tail -n1 "$out/sass_check.log"), see sass_check.log"
    fi
  else
    note "sass check" skipped "no Hopper kernel objects (built without CUTLASS?)"
  fi
fi

# --- SASS counts of the decode kernels' key-tile loop per phase: a report, never a failure
if [ -d "$build" ]; then
  objs=$(find "$build/src" -path '*/cuda/decode*/*' -name '*.o' 2>/dev/null | sort)
  if [ -z "$objs" ]; then
    note "sass count" skipped "no decode objects"
  else
    # shellcheck disable=SC2086
    python3 scripts/sass_count.py $objs --json "$out/sass_count.json" >"$out/sass_count.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
      note "sass count" ok "decode loop counts in sass_count.log / sass_count.json"
    else
      note "sass count" skipped "not recorded (rc $rc), see sass_count.log"
    fi
  fi
fi

if [ -d "$build" ] && [ $run_tests -eq 1 ]; then
  run_ctest gpu
  if [ $run_portable -eq 1 ]; then
    export PAGEDMHA_KERNELS=portable
    run_ctest gpu gpu-portable
    unset PAGEDMHA_KERNELS
  fi
  if [ $run_sm89 -eq 1 ]; then
    export PAGEDMHA_KERNELS=sm89
    run_ctest gpu gpu-sm89
    unset PAGEDMHA_KERNELS
  fi
  [ $run_cpu -eq 1 ] && run_ctest cpu
fi

# --- compute-sanitizer ------------------------------------------------------------
# The tiny suite tests/gpu/sanitizer (small shapes of every kernel) under each tool.
if [ $run_sanitizer -eq 1 ]; then
  san_bin=$build/tests/test_gpu_sanitizer
  if ! command -v compute-sanitizer >/dev/null; then
    note sanitizer FAILED "compute-sanitizer not found"
  elif [ ! -x "$san_bin" ]; then
    note sanitizer FAILED "$san_bin not built"
  else
    for tool in ${SANITIZER_TOOLS:-memcheck racecheck synccheck}; do
      t=$(date +%s)
      log "compute-sanitizer --tool $tool"
      extra=()
      [ $tool = memcheck ] && extra=(--leak-check full)
      compute-sanitizer --tool $tool "${extra[@]}" --error-exitcode 99 "$san_bin" >"$out/sanitizer-$tool.log" 2>&1
      rc=$?
      errors=$(grep -oE '(ERROR|RACECHECK) SUMMARY: [0-9]+' "$out/sanitizer-$tool.log" | grep -oE '[0-9]+$' | tail -1)
      if [ $rc -eq 0 ]; then
        note "sanitizer $tool" ok "${errors:-0} errors, $(seconds_since "$t") s"
      else
        note "sanitizer $tool" FAILED "${errors:-?} errors (rc $rc), see sanitizer-$tool.log"
      fi
    done
  fi
fi

# --- benchmark --------------------------------------------------------------------
if [ $run_bench -eq 1 ]; then
  if [ -f bench/bench_attention.py ]; then
    t=$(date +%s)
    log "python3 bench/bench_attention.py ${BENCH_ARGS:-}"
    # shellcheck disable=SC2086
    if PYTHONPATH="$root/python:${PYTHONPATH:-}" PAGEDMHA_BUILD_DIR="$build" \
        python3 bench/bench_attention.py ${BENCH_ARGS:-} >"$out/bench.log" 2>&1; then
      note bench ok "$(seconds_since "$t") s, see bench.log"
    else
      note bench FAILED "see bench.log: $(tail -n1 "$out/bench.log" | cut -c1-100)"
    fi
  else
    note bench skipped "bench/bench_attention.py absent"
  fi
fi

# --- reports: backend host overhead, trace replays ----------------------------------
if [ $run_reports -eq 1 ]; then
  day=$(date +%Y%m%d)
  t=$(date +%s)
  if "$build/bench/backend_overhead" --device cuda --out "$out" >"$out/backend_overhead.log" 2>&1; then
    note "backend overhead" ok "$(seconds_since "$t") s"
  else
    note "backend overhead" FAILED "see backend_overhead.log"
  fi
  traces=${TRACES:-$root/../shared/traces}
  limit=${REPLAY_TIME_LIMIT:-90}
  cli=$build/tools/pagedmha
  # REPLAYS: space-separated name[:time limit in s]; default the two committed reports'
  # runs at REPLAY_TIME_LIMIT (the full-head mooncake-gpt-oss-20b needs > 678 s: see perf-notes),
  # then the one-rank NCCL runs after their one-device baseline.
  steps=${REPLAY_STEPS:-1000}
  base_json=$out/$gpu_tag-replay-azure-llama3-8b-1gpu-$day.json
  for entry in ${REPLAYS:-azure-conv-llama3-8b mooncake-gpt-oss-20b-tp8 azure-llama3-8b-1gpu:300 \
                 azure-llama3-8b-gpus1-tp1:300 azure-llama3-8b-gpus1-dcp1:300}; do
    name=${entry%%:*}
    run_limit=$limit
    [ "$entry" != "$name" ] && run_limit=${entry#*:}
    case $name in
      azure-conv-llama3-8b) trace=AzureLLMInferenceTrace_conv.csv args="--model llama3-8b --kv-dtype bf16 --check-every 500" ;;
      mooncake-gpt-oss-20b) trace=conversation_trace.jsonl args="--model gpt-oss-20b --kv-dtype fp8 --check-every 200" ;;
      # One rank of a TP-8 deployment: Hq 8, Hkv 1 per GPU (the single-GPU full-head run's
      # floor alone, 678 s, is longer than a device call).
      mooncake-gpt-oss-20b-tp8) trace=conversation_trace.jsonl args="--model gpt-oss-20b --tp 8 --kv-dtype fp8 --check-every 200" ;;
      # The same first $steps steps on one device, then through replay --gpus 1 (one rank,
      # NCCL all the same) with its scaling against that report (efficiency ~1 expected).
      azure-llama3-8b-1gpu) trace=AzureLLMInferenceTrace_conv.csv args="--model llama3-8b --kv-dtype bf16 --check-every 100 --max-steps $steps" ;;
      azure-llama3-8b-gpus1-tp1) trace=AzureLLMInferenceTrace_conv.csv args="--model llama3-8b --kv-dtype bf16 --check-every 100 --max-steps $steps --gpus 1 --tp 1 --baseline-json $base_json" ;;
      azure-llama3-8b-gpus1-dcp1) trace=AzureLLMInferenceTrace_conv.csv args="--model llama3-8b --kv-dtype bf16 --check-every 100 --max-steps $steps --gpus 1 --dcp 1 --baseline-json $base_json" ;;
      *) note "replay $name" FAILED "unknown replay (azure-conv-llama3-8b, mooncake-gpt-oss-20b[-tp8], azure-llama3-8b-{1gpu,gpus1-tp1,gpus1-dcp1})"; continue ;;
    esac
    json=$out/$gpu_tag-replay-$name-$day.json
    t=$(date +%s)
    log "replay $name (time limit $run_limit s)"
    # shellcheck disable=SC2086
    if timeout $((run_limit + 60)) "$cli" replay --device cuda --trace "$traces/$trace" $args \
        --time-limit "$run_limit" --json "$json" >"$out/replay-$name.log" 2>&1; then
      "$cli" plot "$json" -o "$out/replay-$name.png" >>"$out/replay-$name.log" 2>&1
      note "replay $name" ok "$(seconds_since "$t") s, $(grep -m1 -E 'requests \(finished' "$out/replay-$name.log" | tr -s ' ')$(grep -m1 -E 'scaling efficiency' "$out/replay-$name.log" | tr -s ' ')"
    else
      note "replay $name" FAILED "see replay-$name.log: $(tail -n1 "$out/replay-$name.log" | cut -c1-90)"
    fi
  done
fi

# --- summary ----------------------------------------------------------------------
{
  echo
  echo "pagedmha GPU run: $(cat "$out/gpu.txt" 2>/dev/null | head -n1), logs in $out"
  printf '%-34s %-8s %s\n' STAGE RESULT DETAIL
  for row in "${summary[@]}"; do
    IFS='|' read -r stage result detail <<<"$row"
    printf '%-34s %-8s %s\n' "$stage" "$result" "$detail"
  done
  [ $failed -eq 0 ] && echo "ALL OK" || echo "SOME STAGES FAILED"
} | tee "$out/summary.txt"
exit $failed
