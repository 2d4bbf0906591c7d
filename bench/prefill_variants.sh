#!/usr/bin/env bash
# Builds bench/prefill_sm90_variants.cu once per variant of the Hopper prefill kernel's
# compile-time knobs (src/cuda/prefill_sm90/policy.h) and runs each on the GPU: a quick,
# same-run comparison of kernel structures. KERNEL=decode does the same with
# bench/decode_sm90_variants.cu for the decode kernels (decode/policy.h,
# decode_sm90/policy.h; e.g. "sm90:-DPAGEDMHA_DECODE_SM90=1" against "portable:").
# Needs nvcc (sm_90a), CUTLASS headers (found like CMake does: $CUTLASS_INCLUDE,
# .deps/cutlass/include, or pip's nvidia-cutlass) and an H100 / H200. Writes
# bench/results/<gpu>-<prefill|decode>-variants-<date>.json.
#
#   [KERNEL=decode] [SHAPES=0,3] [BASE=<commit or dir>] [ROUNDS=2] bash bench/prefill_variants.sh ["name:-DFLAG=1 -DOTHER=2" ...]
#   (default variants: the set below; SHAPES: indices into the binary's shape list, default
#   all; RUN_TIMEOUT: seconds per variant and round, default 120; BASE: also build the same benchmark source against another tree's src/ and include/,
#   variant "base" (a commit is exported with git archive; where .git does not travel, export
#   it beforehand: git archive <commit> src include | tar x -C <dir>; BASE_FLAGS: its
#   compile flags, default none); ROUNDS: run the whole
#   variant list that many times, interleaved, default 1; FA3_DIR: a checkout of
#   Dao-AILab/flash-attention, whose dense causal forward (bench/fa3_peer.cu, its own shape
#   list: FA3_SHAPES, default all) then runs as variant "fa3-dense" in every round;
#   COMPARE=1 (prefill): after the rounds each variant runs its shapes once more, untimed,
#   dumping every 61st output value and every lse (PREFILL_VARIANTS_DUMP), and the script
#   prints, and adds to the JSON, each variant's largest difference from the first variant
#   named (by convention the default build): a knob that breaks the results shows at
#   once, before any GPU test runs with it. Summation orders differ between tile shapes,
#   so expect bf16 rounding (~1e-2 relative) there, not 0; BUILD_ONLY=1: build the variants,
#   run nothing, exit 1 if one fails to compile: scripts/test.sh keeps the experiment knobs
#   compiling this way where nvcc is present)
set -uo pipefail
cd "$(dirname "$0")/.."
inc=${CUTLASS_INCLUDE:-}
[ -z "$inc" ] && [ -d .deps/cutlass/include/cute ] && inc=.deps/cutlass/include
[ -z "$inc" ] && inc=$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))" 2>/dev/null)
[ -d "$inc/cute" ] || { echo "prefill_variants: CUTLASS headers not found" >&2; exit 2; }
inc=$(cd "$inc" && pwd)  # absolute: BASE builds run from another tree
kernel=${KERNEL:-prefill}
case $kernel in
  # The launchers throw through error.cpp; the decode's also read the device's kernel
  # path (arch.cu) and dtype sizes (tensor.cpp).
  prefill) extra=(src/core/error.cpp) ;;
  decode) extra=(src/core/error.cpp src/cuda/common/arch.cu src/core/tensor.cpp "-DPAGEDMHA_CUDA_ARCHS=\"90a\"") ;;
  *) echo "prefill_variants: KERNEL: expected prefill or decode, got $kernel" >&2; exit 2 ;;
esac
variants=("$@")
if [ ${#variants[@]} -eq 0 ] && [ "$kernel" = decode ]; then
  variants=("portable:" "sm90:-DPAGEDMHA_DECODE_SM90=1")
elif [ ${#variants[@]} -eq 0 ]; then
  variants=("default:" "stages2:-DPAGEDMHA_SM90_STAGES=2" "stages3:-DPAGEDMHA_SM90_STAGES=3" "cluster1:-DPAGEDMHA_SM90_CLUSTER=1"
            "pingpong:-DPAGEDMHA_SM90_PINGPONG=1" "no-softmax:-DPAGEDMHA_SM90_DIAG=1" "no-gemm:-DPAGEDMHA_SM90_DIAG=2" "loads-only:-DPAGEDMHA_SM90_DIAG=3")
fi
dir=build/variants-$kernel
mkdir -p "$dir"
jsonl=$dir/records.jsonl
: >"$jsonl"
here=$PWD
# build NAME FLAGS [SOURCE TREE]: the benchmark source of this tree, against the kernels of
# SOURCE TREE (default this one).
build() {
  rm -f "$here/$dir/$1"  # a failed build must not leave an earlier run's binary to run
  # shellcheck disable=SC2086
  # -DNDEBUG as in the library's Release build: CUTLASS's device asserts are calls, and a
  # call inside the wgmma pipeline makes ptxas serialize every wgmma (warning C7510).
  (cd "${3:-$here}" && nvcc -std=c++17 -O3 -DNDEBUG -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
    -DPAGEDMHA_WITH_SM90=1 -Isrc -Iinclude -isystem "$inc" $2 "$here/bench/${kernel}_sm90_variants.cu" \
    src/cuda/common/attention_args.cu src/cuda/hopper/tensor_map.cu "${extra[@]}" -o "$here/$dir/$1") >"$dir/$1.build.log" 2>&1
}
names=()
if [ -n "${BASE:-}" ]; then
  base_src=$BASE
  if [ ! -d "$base_src" ]; then
    base_src=$dir/base-src
    rm -rf "$base_src" && mkdir -p "$base_src"
    git archive "$BASE" src include | tar x -C "$base_src" || { echo "prefill_variants: cannot export $BASE" >&2; exit 2; }
  fi
  base_src=$(cd "$base_src" && pwd)
  build base "${BASE_FLAGS:-}" "$base_src" &
  names+=(base)
fi
for v in "${variants[@]}"; do
  build "${v%%:*}" "${v#*:}" &
  names+=("${v%%:*}")
done
if [ -n "${FA3_DIR:-}" ] && [ "$kernel" = prefill ]; then
  [ -f "$FA3_DIR/hopper/flash_fwd_launch_template.h" ] ||
    { echo "prefill_variants: FA3_DIR: expected a flash-attention checkout with hopper/, got $FA3_DIR" >&2; exit 2; }
  fa3=$(cd "$FA3_DIR/hopper" && pwd)
  # FA3's own flags (its setup.py): fast math, the extended wgmma shapes, PDL.
  nvcc -std=c++17 -O3 -DNDEBUG --use_fast_math -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED -DCUTLASS_ENABLE_GDC_FOR_SM90 \
    -DCUTLASS_DEBUG_TRACE_LEVEL=0 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr --expt-extended-lambda \
    -Isrc -Iinclude -Ibench -I"$fa3" -isystem "$inc" bench/fa3_peer.cu -o "$dir/fa3-dense" -lcuda \
    >"$dir/fa3-dense.build.log" 2>&1 &
  names+=(fa3-dense)
fi
wait
if [ -n "${BUILD_ONLY:-}" ]; then  # no GPU: only that every variant compiles
  bad=0
  for name in "${names[@]}"; do
    [ -x "$dir/$name" ] && continue
    echo "prefill_variants: $name: build failed ($dir/$name.build.log):" >&2
    grep -m5 "error" "$dir/$name.build.log" >&2
    bad=1
  done
  exit $bad
fi
for _ in $(seq "${ROUNDS:-1}"); do
  for name in "${names[@]}"; do
    if [ -x "$dir/$name" ]; then
      # A variant that hangs (a barrier never completing) loses its rows, not the run.
      shapes=${SHAPES:-}
      [ "$name" = fa3-dense ] && shapes=${FA3_SHAPES:-}
      # shellcheck disable=SC2086
      timeout "${RUN_TIMEOUT:-120}" "$dir/$name" "$name" "$jsonl" $shapes || echo "$name: run failed or timed out"
    else
      echo "$name: build failed: $(grep -m1 error "$dir/$name.build.log")"
    fi
  done
done
compare=$dir/compare.json
rm -f "$compare"
if [ -n "${COMPARE:-}" ] && [ "$kernel" = prefill ] && [ ${#names[@]} -gt 0 ]; then
  rm -rf "$dir/dump" && mkdir -p "$dir/dump"
  for name in "${names[@]}"; do
    [ "$name" = fa3-dense ] || [ ! -x "$dir/$name" ] && continue
    # shellcheck disable=SC2086
    PREFILL_VARIANTS_DUMP=$dir/dump timeout "${RUN_TIMEOUT:-120}" "$dir/$name" "$name" "$dir/dump/records.jsonl" ${SHAPES:-} \
      >/dev/null || echo "$name: dump run failed or timed out"
  done
  ref=${variants[0]:-default:}
  python3 - "$dir/dump" "${ref%%:*}" "$compare" "${names[@]}" <<'PY'
import glob, json, os, sys
import numpy as np
d, ref, out = sys.argv[1:4]
others = [n for n in sys.argv[4:] if n not in (ref, "fa3-dense")]
rows = []
refs = sorted(glob.glob(os.path.join(d, ref + "-*.bin")))
if not refs:
    print(f"compare: no dumps of {ref} (its build or run failed): nothing compared")
for f in refs:
    shape = os.path.basename(f)[len(ref) + 1:]
    a = np.fromfile(f, np.float32)
    for name in others:
        g = os.path.join(d, name + "-" + shape)
        if not os.path.exists(g):  # its build or run failed: said, not skipped
            rows.append({"variant": name, "reference": ref, "file": shape, "values": 0, "max_abs_diff": None,
                         "max_abs_ref": float(np.abs(a).max()) if a.size else 0.0, "nonfinite": None,
                         "missing": True})
            print(f"compare {name:>12} vs {ref}: {shape:<36} missing (no dump)")
            continue
        b = np.fromfile(g, np.float32)
        ok = a.size == b.size
        diff = float(np.abs(a - b).max()) if ok and a.size else float("nan")
        scale = float(np.abs(a).max()) if a.size else 0.0
        rows.append({"variant": name, "reference": ref, "file": shape, "values": int(a.size),
                     "max_abs_diff": diff if diff == diff else None, "max_abs_ref": scale,
                     "nonfinite": int((~np.isfinite(b)).sum())})
        print(f"compare {name:>12} vs {ref}: {shape:<36} max|diff| {diff:.3g} (max|{ref}| {scale:.3g}), "
              f"non-finite {rows[-1]['nonfinite']}")
json.dump(rows, open(out, "w"), indent=1)
PY
fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 | tr 'A-Z ' 'a-z-' | sed 's/nvidia-//')
out=bench/results/${gpu:-gpu}-$kernel-variants-$(date +%Y%m%d).json
python3 - "$jsonl" "$out" "${KERNEL:+KERNEL=$KERNEL }${BASE:+BASE=$BASE }${ROUNDS:+ROUNDS=$ROUNDS }${SHAPES:+SHAPES=$SHAPES }${COMPARE:+COMPARE=$COMPARE }bash bench/prefill_variants.sh $*" "$compare" <<'PY'
import json, os, subprocess, sys, datetime
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
commit = os.environ.get("PAGEDMHA_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
doc = {"gpu": gpu, "commit": commit, "command": sys.argv[3], "date": datetime.date.today().isoformat(), "records": recs}
if os.path.exists(sys.argv[4]):
    doc["compare"] = json.load(open(sys.argv[4]))
json.dump(doc, open(sys.argv[2], "w"), indent=1)
print("wrote", sys.argv[2])
PY
[ -n "${OUT:-}" ] && cp "$out" "$OUT/" 2>/dev/null
exit 0
