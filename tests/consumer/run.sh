#!/usr/bin/env bash
# Builds and runs the consumer project of this folder against pagedmha (the ctest tests
# consumer_find_package and consumer_add_subdirectory):
#   run.sh find_package <pagedmha build dir> <work dir>
#       installs that already built tree (component pagedmha) into <work>/prefix, then
#       builds the consumer with find_package(pagedmha CONFIG) against it. Nothing of the
#       library is recompiled; in a CUDA build this covers find_dependency(CUDAToolkit).
#   run.sh add_subdirectory <work dir>
#       builds the consumer with add_subdirectory(<this checkout>), CPU only, as a shared
#       library (BUILD_SHARED_LIBS), checking that nothing beyond the library is added;
#       then installs that build and builds the consumer with find_package against it.
# Each consumer build runs its program (exit 0: batch_decode matched the hand-computed
# values). CMAKE, CMAKE_MAKE_PROGRAM and CXX choose the tools (ctest passes its own).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
cmake=${CMAKE:-cmake}
common=(-G Ninja -Wno-dev)
[ -n "${CMAKE_MAKE_PROGRAM:-}" ] && common+=("-DCMAKE_MAKE_PROGRAM=$CMAKE_MAKE_PROGRAM")
[ -n "${CXX:-}" ] && common+=("-DCMAKE_CXX_COMPILER=$CXX")

# consumer <build dir> <cmake args...>: configure, build and run the consumer.
consumer() {
  local dir=$1
  shift
  rm -rf "$dir"
  "$cmake" -S "$here" -B "$dir" "${common[@]}" "$@" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log" >&2; return 1; }
  "$cmake" --build "$dir" -j2 >"$dir.build.log" 2>&1 || { cat "$dir.build.log" >&2; return 1; }
  "$dir/consumer"
}

case "${1:-}" in
  find_package)
    build=$2 work=$3
    mkdir -p "$work"
    rm -rf "$work/prefix"
    "$cmake" --install "$build" --prefix "$work/prefix" --component pagedmha >"$work/install.log"
    test -f "$work/prefix/include/pagedmha/pagedmha.h"
    consumer "$work/app" -DPAGEDMHA_CONSUMER_MODE=find_package "-DCMAKE_PREFIX_PATH=$work/prefix"
    ;;
  add_subdirectory)
    work=$2
    mkdir -p "$work"
    consumer "$work/app" -DPAGEDMHA_CONSUMER_MODE=add_subdirectory "-DPAGEDMHA_SOURCE_DIR=$src" \
      -DPAGEDMHA_CUDA=OFF -DBUILD_SHARED_LIBS=ON -DPAGEDMHA_INSTALL=ON
    test -f "$work/app/pagedmha/src/libpagedmha.so"
    rm -rf "$work/prefix"
    "$cmake" --install "$work/app" --prefix "$work/prefix" --component pagedmha >"$work/install.log"
    consumer "$work/app-installed" -DPAGEDMHA_CONSUMER_MODE=find_package "-DCMAKE_PREFIX_PATH=$work/prefix"
    ;;
  *)
    echo "usage: run.sh find_package <pagedmha build dir> <work dir> | add_subdirectory <work dir>" >&2
    exit 2
    ;;
esac
