#!/usr/bin/env bash
# Fills the git-ignored .deps/ that scripts/gpu.sh builds with on a machine without package
# registries (the lent GPU machine): GoogleTest sources, CLI11 and nlohmann-json headers
# (from the Debian packages bootstrap.sh installs) and CUTLASS/CuTe headers (from PyPI's
# nvidia-cutlass), the last as a tarball that gpu.sh unpacks. Run here, then carry .deps.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
rm -rf .deps
mkdir -p .deps/include
cp -r /usr/src/googletest .deps/googletest
cp -r /usr/include/CLI /usr/include/nlohmann .deps/include/
inc=$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))")
tar czf .deps/cutlass-include.tar.gz -C "$inc" cute cutlass
du -sh .deps
