#!/usr/bin/env bash
# Decode SASS counts of the hot path only, at a git revision: scripts/sass_count.py counts
# every instruction of the key-tile loop, both sides of each branch, so a kernel with
# more specialised paths reads as larger. This exports REV's sources to a temporary
# folder, pins the branches that are uniform and taken on interior tiles of a long
# request (the loader's run path where the revision has one, interior tiles, no logit
# clamp: the sed lines below; a pinned tree computes wrong results for other inputs
# and is never built into the library), compiles the decode instantiations for sm_90a and
# runs sass_count.py on them.
#
#   bash scripts/sass_hot_path.sh [REV=HEAD] [--json PATH]
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
shift || true
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive "$rev" src include | tar -x -C "$tmp"
sed -i 's/run_path = P % kRun == 0.*;/run_path = true;/; s/const bool interior = tile \* BN >= lo .*;/const bool interior = true;/' \
  "$tmp/src/cuda/common/paged_loader.cuh"
sed -i 's/const bool clamp = !kLean || __any_sync(.*);/const bool clamp = false;/' "$tmp/src/cuda/common/online_softmax.cuh"
objs=()
for d in 64 128 256; do
  nvcc -std=c++17 -O3 -DNDEBUG -DPAGEDMHA_WITH_CUDA=1 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
    -I"$tmp/src" -I"$tmp/include" -c "$tmp/src/cuda/decode/decode_hd$d.cu" -o "$tmp/decode_hd$d.o"
  objs+=("$tmp/decode_hd$d.o")
done
python3 scripts/sass_count.py "${objs[@]}" "$@"
