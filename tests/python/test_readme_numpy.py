"""Every ```python block of README.md runs as written, each in a fresh interpreter. A block
whose first line is "# requires: torch" (or "# requires: torch, cuda") runs only where
torch (and a CUDA device with a CUDA build of pagedmha) is there; the others, NumPy only,
run everywhere, CI included."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
KNOWN = {"torch", "cuda"}


def python_blocks():
    text = README.read_text(encoding="utf-8")
    return [m.group(1) for m in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M)]


def requirements(code):
    first = code.splitlines()[0] if code.strip() else ""
    m = re.match(r"#\s*requires:\s*(.*)$", first)
    return {r.strip() for r in m.group(1).split(",")} if m else set()


BLOCKS = python_blocks()


def test_readme_has_numpy_blocks():
    """The extractor finds the blocks, and at least one runs without torch (here, in CI)."""
    assert len(BLOCKS) >= 2
    assert any(not requirements(code) for code in BLOCKS)
    for code in BLOCKS:
        assert requirements(code) <= KNOWN, f"unknown requirement in README block:\n{code}"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block(index, tmp_path):
    code = BLOCKS[index]
    needs = requirements(code)
    if "torch" in needs:
        pytest.importorskip("torch")
    if "cuda" in needs:
        import pagedmha
        import torch
        if not (torch.cuda.is_available() and pagedmha.cuda_available()):
            pytest.skip("needs a CUDA device and a CUDA build")
    # A fresh interpreter in an empty folder, importing the pagedmha this test imports.
    import pagedmha
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(pagedmha.__file__).resolve().parents[1]), env.get("PYTHONPATH")) if p)
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"README block {index} failed:\n{code}\n{result.stderr[-3000:]}"
