"""Byte and flop counts, record matching and target checks for the attention benchmark.

Standard library only: bench/bench_attention.py (on the GPU machine) and
scripts/perf_tables.py (anywhere) share these, and tests/python/test_perf_tables.py checks
them against hand-computed values. Definitions follow shared/design/PERFORMANCE.md:

* decode effective bytes = K and V bytes of the keys visible to at least one query of the
  request (each KV head read once, whatever the GQA group) + Q bytes + O bytes;
* prefill flops = 4 * Hq * D * visible (query, key) pairs, counted exactly.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

# Geometry of the standard shapes (PERFORMANCE.md "Standard shapes").
MODELS = {
    "llama3-8b": {"hq": 32, "hkv": 8, "d": 128},
    "llama3-70b": {"hq": 64, "hkv": 8, "d": 128},
    "gpt-oss": {"hq": 64, "hkv": 8, "d": 64},
    "gpt-oss-tp8": {"hq": 8, "hkv": 1, "d": 64},  # one tensor-parallel rank of 8
    "llama3-70b-tp8": {"hq": 8, "hkv": 1, "d": 128},  # one tensor-parallel rank of 8
    "qwen2.5-7b": {"hq": 28, "hkv": 4, "d": 128},
    "gemma": {"hq": 16, "hkv": 8, "d": 256},
}

# Decode (batch, ctx) of the standard shapes, for the plans (attention_cases.py) and targets.
DECODE_BXC = [(1, 32768), (16, 8192), (64, 4096), (256, 2048), (128, 32768)]
FP8_BXC = [(1, 32768), (64, 4096), (128, 32768)]  # fp8 KV against bf16 KV
WINDOW_BXC = [(64, 32768), (128, 32768)]  # window 127
TP8_BXC = [(1, 32768), (32, 2048), (256, 2048), (64, 8192)]  # llama3-70b-tp8 (issue 13)

IMPL_OURS = "pagedmha"
IMPL_CUDNN = "torch-cudnn"
IMPL_FLASH = "torch-flash"

_ELEM_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8_e4m3": 1, "fp8": 1}


def elem_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name used in records ("bf16", "fp8_e4m3", ...)."""
    try:
        return _ELEM_BYTES[dtype]
    except KeyError:
        raise ValueError(f"elem_bytes: dtype: expected one of {sorted(_ELEM_BYTES)}, got {dtype!r}")


def len_label(x) -> str:
    """A length as case names write it: 4096 -> "4k" (whole multiples of 1024), else as is."""
    return f"{x // 1024}k" if isinstance(x, int) and x >= 1024 and x % 1024 == 0 else str(x)


def _sum_range(lo: int, hi: int) -> int:
    """Sum of the integers in [lo, hi] (0 when empty)."""
    if hi < lo:
        return 0
    return (lo + hi) * (hi - lo + 1) // 2


def visible_pairs(q_len: int, kv_len: int, window_left: int = -1, causal: bool = True) -> int:
    """Visible (query, key) pairs of one request (docs/semantics.md section 1).

    Query i in [0, q_len) sits at position p = kv_len - q_len + i. Causal: key j is visible
    iff j <= p and (window_left < 0 or j >= p - window_left). Non-causal: every key
    j in [0, kv_len) with j >= p - window_left (window from the left only).
    """
    if q_len < 0 or kv_len < 0:
        raise ValueError(f"visible_pairs: expected q_len, kv_len >= 0, got {q_len}, {kv_len}")
    if q_len == 0 or kv_len == 0:
        return 0
    p_first, p_last = kv_len - q_len, kv_len - 1
    if not causal:
        if window_left < 0:
            return q_len * kv_len
        # Query p sees kv_len - max(0, p - W) keys.
        w = window_left
        split = min(p_last, w)  # p <= W: the window reaches key 0
        full = max(0, split - p_first + 1)
        lo = max(p_first, w + 1)
        tail = (p_last - lo + 1) * (kv_len + w) - _sum_range(lo, p_last) if lo <= p_last else 0
        return full * kv_len + tail
    p0 = max(0, p_first)  # queries before the first key see nothing
    if window_left < 0:
        return _sum_range(p0 + 1, p_last + 1)
    w = window_left
    # min(p, W) + 1 keys: p + 1 while p <= W, then W + 1.
    head = _sum_range(p0 + 1, min(p_last, w) + 1)
    lo = max(p0, w + 1)
    tail = (p_last - lo + 1) * (w + 1) if lo <= p_last else 0
    return head + tail


def visible_keys(q_len: int, kv_len: int, window_left: int = -1) -> int:
    """Distinct keys a causal request reads: those visible to at least one of its queries."""
    if q_len <= 0 or kv_len <= 0:
        return 0
    if window_left < 0:
        return kv_len
    first = max(0, kv_len - q_len - window_left)
    return kv_len - first


def decode_bytes(batch: int, ctx: int, q_len: int, hq: int, hkv: int, d: int, kv_dtype: str,
                 q_dtype: str = "bf16", o_dtype: str = "bf16", window_left: int = -1) -> int:
    """Effective bytes of a uniform decode step: K + V of the visible keys, Q and O."""
    kv = batch * visible_keys(q_len, ctx, window_left) * hkv * d * elem_bytes(kv_dtype) * 2
    q = batch * q_len * hq * d * elem_bytes(q_dtype)
    o = batch * q_len * hq * d * elem_bytes(o_dtype)
    return kv + q + o


def prefill_flops(q_lens: Iterable[int], kv_lens: Iterable[int], hq: int, d: int,
                  window_left: int = -1, causal: bool = True) -> int:
    """4 * Hq * D * visible pairs, summed over the requests (QK^T and PV, 2 flops per MAC)."""
    pairs = sum(visible_pairs(n, l, window_left, causal) for n, l in zip(q_lens, kv_lens))
    return 4 * hq * d * pairs


def tbps(nbytes: float, time_us: float) -> float:
    return nbytes / (time_us * 1e-6) / 1e12


def tflops(flops: float, time_us: float) -> float:
    return flops / (time_us * 1e-6) / 1e12


def gpu_slug(name: str) -> str:
    """File-name form of a device name: "NVIDIA H200" -> "h200"."""
    s = re.sub(r"^nvidia\s+", "", name.strip(), flags=re.IGNORECASE).lower()
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s or "unknown-gpu"


# --- Records -------------------------------------------------------------------------

# Fields that name a problem. Peers run on dense caches, so page_size (and sinks, which
# SDPA cannot do) are not part of the key that pairs ours with a peer.
SHAPE_FIELDS = ("op", "model", "batch", "ctx", "q_len", "kv_dtype", "window_left")


def shape_key(rec: dict) -> tuple:
    return tuple(rec.get(f, -1 if f == "window_left" else None) for f in SHAPE_FIELDS)


def metric_of(rec: dict) -> Optional[float]:
    """The figure of merit of a record: TB/s for decode, TFLOP/s for prefill."""
    return rec.get("tbps") if rec.get("op") == "decode" else rec.get("tflops")


def ok(rec: dict) -> bool:
    return not rec.get("error") and isinstance(rec.get("time_us"), (int, float)) \
        and rec["time_us"] > 0


def peer_index(records: Iterable[dict]) -> dict:
    """{(shape_key, impl): record} for the successful peer records."""
    idx = {}
    for r in records:
        if r.get("impl") != IMPL_OURS and ok(r):
            idx[(shape_key(r), r["impl"])] = r
    return idx


def ratio_to_peer(ours: dict, peers: dict, impl: str) -> Optional[float]:
    """Our figure of merit over the peer's on the same shape (None when either is missing)."""
    peer = peers.get((shape_key(ours), impl))
    if not ok(ours) or peer is None:
        return None
    a, b = metric_of(ours), metric_of(peer)
    if not a or not b:
        return None
    return a / b


def find(records: Iterable[dict], **fields) -> Optional[dict]:
    """The first successful record whose fields equal `fields`."""
    for r in records:
        if ok(r) and all(r.get(k, -1 if k == "window_left" else None) == v
                         for k, v in fields.items()):
            return r
    return None


BOUNDS = (">=", "<=")


def target(name: str, value: Optional[float], threshold: float, bound: str = ">=") -> dict:
    """One target row: met is value >= threshold (bound ">=") or value <= threshold
    (bound "<="); None when value is None (a record it needs is missing or failed)."""
    if bound not in BOUNDS:
        raise ValueError(f"target: bound: expected one of {BOUNDS}, got {bound!r}")
    met = None if value is None else (value >= threshold if bound == ">=" else value <= threshold)
    return {"name": name, "value": value, "threshold": threshold, "bound": bound, "met": met}


def evaluate_targets(records: list) -> list:
    """The issues' performance targets: [{"name", "value", "threshold", "bound", "met"}]
    (see target()). Values are ratios. Decode: issue 13 (>= 1.02x cuDNN's TB/s on every
    standard shape at page 16 and 64 and on one TP-8 rank of llama3-70b, verify <= 1.1x the
    q_len 1 time, fp8 KV tokens/s over bf16 KV, window 127 against cuDNN, page 1 against
    page 16), and the window's speed-up over the full 32k; then prefill against the peers.
    """
    peers = peer_index(records)
    out = []

    def add(name, value, threshold, bound=">="):
        out.append(target(name, value, threshold, bound))

    def ours(**kw):
        base = {"impl": IMPL_OURS, "op": "decode", "model": "llama3-8b", "q_len": 1,
                "page_size": 16, "kv_dtype": "bf16", "window_left": -1}
        base.update(kw)
        return find(records, **base)

    def vs(rec, impl=IMPL_CUDNN):
        return None if rec is None else ratio_to_peer(rec, peers, impl)

    def time_ratio(a, b):  # a's time over b's; on the same tokens, b's tokens/s over a's
        return None if a is None or b is None else a["time_us"] / b["time_us"]

    def bxc(b, c):
        return f"{b}x{len_label(c)}"

    for model in ("llama3-8b", "gpt-oss"):
        for b, c in DECODE_BXC:
            for p in (16, 64):  # the peers' record is page-independent (shape_key)
                add(f"decode {model} {bxc(b, c)} p{p} bf16: TB/s vs cuDNN",
                    vs(ours(model=model, batch=b, ctx=c, page_size=p)), 1.02)
        add(f"decode {model} 64x4k p16 bf16: q_len 4 time vs q_len 1",
            time_ratio(ours(model=model, batch=64, ctx=4096, q_len=4),
                       ours(model=model, batch=64, ctx=4096)), 1.1, "<=")
        for b, c in FP8_BXC:
            add(f"decode {model} {bxc(b, c)} p16: fp8-KV tokens/s vs bf16-KV",
                time_ratio(ours(model=model, batch=b, ctx=c),
                           ours(model=model, batch=b, ctx=c, kv_dtype="fp8_e4m3")),
                1.8 if (b, c) == (128, 32768) else 1.5)
        for b, c in WINDOW_BXC:
            add(f"decode {model} {bxc(b, c)} p16 bf16 w127: TB/s vs cuDNN",
                vs(ours(model=model, batch=b, ctx=c, window_left=127)), 1.0)
    add("decode llama3-8b 128x8k bf16: page 1 tokens/s vs page 16",
        time_ratio(ours(batch=128, ctx=8192), ours(batch=128, ctx=8192, page_size=1)), 0.8)
    for b, c in TP8_BXC:
        add(f"decode llama3-70b-tp8 {bxc(b, c)} p16 bf16: TB/s vs cuDNN",
            vs(ours(model="llama3-70b-tp8", batch=b, ctx=c)), 1.02)
    add("decode llama3-8b 64x32k p16 bf16: speed-up of window 127",
        time_ratio(ours(batch=64, ctx=32768), ours(batch=64, ctx=32768, window_left=127)), 20.0)

    pf = ours(op="prefill", batch=4, ctx=4096, q_len=4096)
    add("prefill llama3-8b causal 4x4k: TFLOP/s vs cuDNN", vs(pf, IMPL_CUDNN), 0.6)
    add("prefill llama3-8b causal 4x4k: TFLOP/s vs flash", vs(pf, IMPL_FLASH), 1.0)
    return out


def fmt_target(t: dict) -> str:
    v = "n/a" if t["value"] is None else f"{t['value']:.2f}x"
    mark = "no data" if t["met"] is None else ("met" if t["met"] else "NOT met")
    return f"{t['name']}: {v} (target {fmt_bound(t)}) {mark}"


def fmt_bound(t: dict) -> str:
    """">= 1.02x" or "<= 1.1x" (rows written before bounds existed are ">=")."""
    return f"{t.get('bound', '>=')} {t['threshold']:g}x"


# --- Paths in reports ---------------------------------------------------------------------

def repo_relative(path: str, repo) -> str:
    """``path`` as a report records it (the rule of tools/report_paths.h): relative to the
    repository root ``repo`` when inside it or in a folder beside it ("../shared/traces/x"),
    unless the repository sits at the top of the file system; anywhere else its last
    component. Relative paths are taken from the current folder; never an absolute path of
    the machine that ran."""
    import os

    if not path:
        return path
    full = os.path.realpath(os.path.abspath(path))
    root = os.path.realpath(str(repo))
    rel = os.path.relpath(full, root)
    parts = rel.split(os.sep)
    up = parts[0] == ".."
    beside = up and len(parts) > 1 and parts[1] != ".." and os.path.dirname(root) != os.sep
    if not up or beside:
        return rel
    return os.path.basename(full)


def repo_relative_command(words, repo) -> str:
    """A command line for a report: words holding '/' (and values of --flag=value) made
    repo_relative, joined with spaces."""
    out = []
    for w in words:
        w = str(w)
        if w.startswith("--") and "=" in w:
            flag, value = w.split("=", 1)
            out.append(flag + "=" + (repo_relative(value, repo) if "/" in value else value))
        else:
            out.append(repo_relative(w, repo) if "/" in w else w)
    return " ".join(out)
