#!/usr/bin/env bash
# Installs what the build, the tests and the tools need: Debian packages through
# apt-get and Python packages through pip. Idempotent: re-running installs nothing new.
set -euo pipefail

debs=(cmake ninja-build g++ libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev python3-pip python3-venv clang libclang-rt-14-dev)
missing=()
for p in "${debs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "bootstrap: installing ${missing[*]}" >&2
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}"
fi

# A distribution's own Python (Debian 12, Ubuntu 23.04+) refuses pip installs into it
# (PEP 668, "externally-managed-environment"); this machine-level set-up installs there
# anyway, as its apt-get step does. A pyenv / venv / conda Python needs no flag.
pip_flags=()
if "${PYTHON:-python3}" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["stdlib"], "EXTERNALLY-MANAGED")))' 2>/dev/null; then
  pip_flags+=(--break-system-packages)
fi

# CUTLASS/CuTe headers for the Hopper kernels (PyPI's nvidia-cutlass ships them under
# cutlass_library/source/include; its Python dependencies are not needed).
if ! "${PYTHON:-python3}" -c "import cutlass_library" >/dev/null 2>&1; then
  echo "bootstrap: pip installing nvidia-cutlass==4.2.0.0 (headers)" >&2
  "${PYTHON:-python3}" -m pip install -q "${pip_flags[@]}" --no-deps nvidia-cutlass==4.2.0.0
fi

# Python side (binding, tests, plots).
py=${PYTHON:-python3}
pips=(nanobind==3.1.0 scikit-build-core numpy pytest matplotlib)
if ! "$py" -c "import nanobind, scikit_build_core, numpy, pytest, matplotlib" >/dev/null 2>&1; then
  echo "bootstrap: pip installing ${pips[*]}" >&2
  "$py" -m pip install -q "${pip_flags[@]}" "${pips[@]}"
fi
