#!/usr/bin/env bash
# Builds the Python module once per variant of the decode kernel's compile-time knobs
# (src/cuda/decode/policy.h), each in its own build folder, and runs
# `bench_attention.py --decode` with each: a same-session comparison of decode policies
# on the GPU (each variant's figures are against cuDNN timed in its own run). Writes
# <out>/<variant>/<gpu>-attention-decode-<date>.json and prints the TB/s and
# ratio-to-cuDNN columns of the variants side by side.
#
#   [OUT_DIR=bench/results/decode-variants] [FILTER=regex] bash bench/decode_variants.sh ["name:-DFLAG=1 ..." ...]
#   FILTER: bench_attention.py --filter (a regex on case names, e.g. '^decode gpt-oss').
#   default variants: smem110 (the default policy) and smem72 (3 CTAs per SM).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT_DIR:-bench/results/decode-variants}
variants=("$@")
[ ${#variants[@]} -eq 0 ] && variants=("smem110:-DPAGEDMHA_DECODE_SMEM_KB=110" "smem72:-DPAGEDMHA_DECODE_SMEM_KB=72")
filter=()
[ -n "${FILTER:-}" ] && filter=(--filter "$FILTER")
deps=()
[ -d .deps ] && deps=(-DPAGEDMHA_DEPS_DIR="$PWD/.deps")
logs=()
mkdir -p build
for v in "${variants[@]}"; do
  name=${v%%:*} flags=${v#*:}
  build=build/decode-variant-$name
  cmake --preset cuda -B "$build" "${deps[@]}" -DCMAKE_CUDA_FLAGS="$flags" >"$build.configure.log" 2>&1 ||
    { echo "decode_variants: $name: configure failed, see $build.configure.log" >&2; continue; }
  t=$(date +%s)
  cmake --build "$build" -j "$(nproc)" --target _pagedmha >"$build.build.log" 2>&1 ||
    { echo "decode_variants: $name: build failed: $(grep -m1 error "$build.build.log")" >&2; continue; }
  echo "decode_variants: $name built in $(( $(date +%s) - t )) s" >&2
  # OUT (the GPU machine's result folder) would receive a copy under the same name.
  env -u OUT PYTHONPATH="$PWD/python" PAGEDMHA_BUILD_DIR="$PWD/$build" \
    python3 bench/bench_attention.py --decode "${filter[@]}" --out-dir "$out/$name" >"$build.bench.log" 2>&1 ||
    echo "decode_variants: $name: bench failed: $(tail -n1 "$build.bench.log")" >&2
  logs+=("$name:$build.bench.log")
done
# Side by side: case, then per variant "ours TB/s, vs cuDNN".
python3 - "${logs[@]}" <<'PY'
import re, sys
cols, rows = [], {}
for arg in sys.argv[1:]:
    name, path = arg.split(":", 1)
    cols.append(name)
    for line in open(path):
        m = re.match(r"^(decode .*?) TB/s\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", line)
        if m:
            rows.setdefault(m.group(1), {})[name] = (m.group(3), m.group(6))
print(f"{'case':48s}" + "".join(f" {c + ' TB/s':>14s} {'xcuDNN':>7s}" for c in cols))
for case, v in rows.items():
    print(f"{case:48s}" + "".join(f" {v.get(c, ('-', '-'))[0]:>14s} {v.get(c, ('-', '-'))[1]:>7s}" for c in cols))
PY
