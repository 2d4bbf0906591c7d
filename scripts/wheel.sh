#!/usr/bin/env bash
# The wheel as a user gets it: `pip wheel .` (scikit-build-core), checked to leave nothing
# in the checkout, installed into a fresh venv, and the Python tests (tests/python) run
# against the installed package from outside the checkout.
#
#   scripts/wheel.sh            CPU-only wheel (-DPAGEDMHA_CUDA=OFF: what CI builds, for time)
#   WHEEL_CUDA=1 scripts/wheel.sh   CUDA kernels when nvcc is found (the pip default)
# Environment: PYTHON (default python3; needs scikit-build-core, nanobind, numpy, pytest:
# scripts/bootstrap.sh), WHEEL_OUT (keep the wheel in this folder).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# What the checkout holds (the build tree's top level included), to compare afterwards.
listing() {
  find . -maxdepth 3 \( -path ./.git -o -path './build/*/*' -o -name __pycache__ \) -prune -o -print | sort
}
before=$(listing)
cuda=OFF
[ "${WHEEL_CUDA:-0}" = 1 ] && cuda=AUTO
t0=$(date +%s)
# No build isolation: the build requirements come from bootstrap.sh (nanobind pinned).
"$py" -m pip wheel . --no-deps --no-build-isolation -q -w "$work/dist" \
  -C cmake.define.PAGEDMHA_CUDA=$cuda
wheel=$(ls "$work"/dist/pagedmha-*.whl)
echo "wheel.sh: built $(basename "$wheel") (PAGEDMHA_CUDA=$cuda) in $(( $(date +%s) - t0 )) s" >&2
if [ "$(listing)" != "$before" ]; then
  echo "wheel.sh: pip wheel left files in the checkout:" >&2
  diff <(echo "$before") <(listing) >&2 || true
  exit 1
fi
[ -n "${WHEEL_OUT:-}" ] && mkdir -p "$WHEEL_OUT" && cp "$wheel" "$WHEEL_OUT/"

# A fresh venv; numpy and pytest come from the interpreter's own site packages.
"$py" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/python" -m pip install -q --no-deps --no-index "$wheel"
cd "$work"
# conftest.py checks that every test imports pagedmha from the venv, not from a build tree.
env -u PYTHONPATH PAGEDMHA_EXPECT_PREFIX="$work/venv" \
  "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python"
