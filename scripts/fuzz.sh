#!/usr/bin/env bash
# libFuzzer on the replay's trace readers and the scheduler behind them
# (tests/fuzz/trace_fuzz.cpp): three targets, each run for SECONDS (default 60) from the
# committed seed corpus (copied: new inputs stay out of the repository). Needs clang with
# libFuzzer (Debian: clang, libclang-rt-14-dev; scripts/bootstrap.sh installs them). A crash,
# a sanitizer report or a broken invariant fails the script and leaves the input in
# build/fuzz/crashes/.
#
#   bash scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
out=build/fuzz
mkdir -p "$out/crashes"
cxx=${FUZZ_CXX:-clang++}
# The library pieces the readers use, uninstrumented (g++: numeric.cpp relies on _Float16).
for f in src/core/error.cpp src/core/tensor.cpp src/core/numeric.cpp; do
  g++ -std=c++20 -O1 -g -Iinclude -Isrc -c "$f" -o "$out/$(basename "$f" .cpp).o"
done
sources=(tools/replay/trace.cpp tools/replay/scheduler.cpp tools/replay/kv_pool.cpp tools/replay/model.cpp tools/replay/ranks.cpp
         tools/replay/token_data.cpp)
names=(azure_reader mooncake_reader reader_scheduler)
for i in 1 2 3; do
  "$cxx" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -DPAGEDMHA_FUZZ_TARGET=$i -Iinclude -Isrc -Itools tests/fuzz/trace_fuzz.cpp "${sources[@]}" \
    "$out"/error.o "$out"/tensor.o "$out"/numeric.o -o "$out/${names[i - 1]}" &
done
wait
status=0
for i in 1 2 3; do
  name=${names[i - 1]}
  corpus=$out/corpus-$name
  rm -rf "$corpus" && mkdir -p "$corpus"
  case $i in
    1) cp tests/fuzz/corpus/azure/* "$corpus/" ;;
    2) cp tests/fuzz/corpus/mooncake/* "$corpus/" ;;
    3) cp tests/fuzz/corpus/azure/* tests/fuzz/corpus/mooncake/* "$corpus/" ;;
  esac
  echo "fuzz: $name for ${seconds} s" >&2
  if ! "$out/$name" -max_total_time="$seconds" -max_len=8192 -timeout=20 -rss_limit_mb=4096 \
      -artifact_prefix="$out/crashes/$name-" "$corpus" >"$out/$name.log" 2>&1; then
    echo "fuzz: $name FAILED, see $out/$name.log and $out/crashes/" >&2
    tail -n 30 "$out/$name.log" >&2
    status=1
  else
    echo "fuzz: $name ok: $(grep -E '^#[0-9]+.*(DONE|pulse)' "$out/$name.log" | tail -n1)" >&2
  fi
done
exit $status
