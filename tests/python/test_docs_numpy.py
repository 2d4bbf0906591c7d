"""Every ```python block of README.md and docs/integration.md runs as written, each in a
fresh interpreter. A block whose first line is "# requires: torch" (or "# requires: torch,
cuda") runs only where torch (and a CUDA device with a CUDA build of pagedmha) is there; the
others, NumPy only, run everywhere, CI included."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/integration.md")
KNOWN = {"torch", "cuda"}


def python_blocks(document):
    text = (ROOT / document).read_text(encoding="utf-8")
    return [m.group(1) for m in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M)]


def requirements(code):
    first = code.splitlines()[0] if code.strip() else ""
    m = re.match(r"#\s*requires:\s*(.*)$", first)
    return {r.strip() for r in m.group(1).split(",")} if m else set()


BLOCKS = [(document, i, code) for document in DOCUMENTS for i, code in enumerate(python_blocks(document))]


def test_documents_have_numpy_blocks():
    """The extractor finds the blocks of each document, and at least one of each runs
    without torch (here, in CI)."""
    counts = {document: [code for d, _, code in BLOCKS if d == document] for document in DOCUMENTS}
    assert len(counts["README.md"]) >= 2
    assert len(counts["docs/integration.md"]) >= 1
    for document, blocks in counts.items():
        assert any(not requirements(code) for code in blocks), document
    for document, _, code in BLOCKS:
        assert requirements(code) <= KNOWN, f"unknown requirement in a {document} block:\n{code}"


@pytest.mark.parametrize("document,index,code", BLOCKS, ids=[f"{d}:{i}" for d, i, _ in BLOCKS])
def test_document_python_block(document, index, code, tmp_path):
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
    assert result.returncode == 0, f"{document} block {index} failed:\n{code}\n{result.stderr[-3000:]}"
