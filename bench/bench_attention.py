#!/usr/bin/env python3
"""Attention benchmark: pagedmha against PyTorch SDPA (cuDNN and flash backends).

Same process, same run, same content: our kernels read a paged cache whose pages are a
random permutation of the pool; the peers read dense [B, L, Hkv, D] tensors holding the
same keys and values. Every implementation is timed by CUDA-graph replay (K launches per
graph, inputs rotated among copies so L2 does not hold them), median of replays. Each case
is first checked against an fp32 reference (relative L2 < 2e-2, recorded). The device
ceilings (copy, read stream, bf16 GEMM) are measured in the same run.

Writes bench/results/<gpu>-attention-<yyyymmdd>.json (PERFORMANCE.md schema) and a copy
under $OUT when set; prints a table with the ratios to torch-cudnn and the targets last.

  python3 bench/bench_attention.py --module-path build/cuda/python [--quick]
  PAGEDMHA_BUILD_DIR=build/cuda python3 bench/bench_attention.py --filter 'decode llama'
  PYTHONPATH=build/cuda/python python3 bench/bench_attention.py --skip-ours   # peers only
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import metrics as M  # noqa: E402  (stdlib only)

torch = None  # imported in main() so --help and the helpers work without it
F = None

CHECK_TOL = 2e-2
FP8_K_SCALE = 0.04  # randn / 0.04 stays well inside e4m3's +-448
FP8_V_SCALE = 0.03
GRAPH_TARGET_US = 4000.0  # device time per graph replay
REPLAYS = 15


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


_tracebacks_left = [3]


def log_traceback() -> None:
    """The first few tracebacks only: one broken op would otherwise flood the output."""
    if _tracebacks_left[0] > 0:
        _tracebacks_left[0] -= 1
        log(traceback.format_exc())


# --- Cases -----------------------------------------------------------------------------

@dataclass
class Case:
    op: str  # "decode" | "prefill"
    model: str
    batch: int
    ctx: int  # KV length per request after the step
    q_len: int  # queries per request
    page_size: int = 16
    kv_dtype: str = "bf16"  # "bf16" | "fp8_e4m3"
    window_left: int = -1
    peers: bool = True  # time the peers too (once per shape: they ignore page_size)

    @property
    def sinks(self) -> bool:
        return self.model.startswith("gpt-oss")

    @property
    def geom(self) -> dict:
        return M.MODELS[self.model]

    @property
    def name(self) -> str:
        def k(x):
            return f"{x // 1024}k" if x >= 1024 and x % 1024 == 0 else str(x)
        s = f"{self.op} {self.model} {self.batch}x{k(self.ctx)} q{k(self.q_len)} p{self.page_size} {self.kv_dtype}"
        return s + (f" w{self.window_left}" if self.window_left >= 0 else "")

    @property
    def first_key(self) -> int:
        """Smallest key position any query of a request can see."""
        if self.window_left < 0:
            return 0
        return max(0, self.ctx - self.q_len - self.window_left)

    def work(self) -> dict:
        g = self.geom
        if self.op == "decode":
            return {"bytes": M.decode_bytes(self.batch, self.ctx, self.q_len, g["hq"], g["hkv"],
                                            g["d"], self.kv_dtype, window_left=self.window_left)}
        return {"flops": M.prefill_flops([self.q_len] * self.batch, [self.ctx] * self.batch,
                                         g["hq"], g["d"], self.window_left)}

    def cache_bytes(self) -> int:
        """K + V bytes of the keys a request can see (the rotation working set)."""
        g = self.geom
        return (self.batch * (self.ctx - self.first_key) * g["hkv"] * g["d"] * 2
                * M.elem_bytes(self.kv_dtype))


K32, K16, K8, K4, K2 = 32768, 16384, 8192, 4096, 2048
DECODE_BXC = [(1, K32), (16, K8), (64, K4), (256, K2), (128, K32)]


def full_plan() -> List[Case]:
    cases: List[Case] = []
    for model in ("llama3-8b", "gpt-oss"):
        for b, c in DECODE_BXC:  # every batch x ctx: bf16, page 16 and 64, q_len 1
            cases.append(Case("decode", model, b, c, 1, 16))
            cases.append(Case("decode", model, b, c, 1, 64, peers=False))
        for b, c in [(1, K32), (64, K4), (128, K32)]:  # fp8 KV
            cases.append(Case("decode", model, b, c, 1, 16, "fp8_e4m3"))
        cases.append(Case("decode", model, 128, K32, 1, 64, "fp8_e4m3", peers=False))
        for b, c in [(16, K8), (64, K4), (128, K32)]:  # speculative verify
            cases.append(Case("decode", model, b, c, 4, 16))
        cases.append(Case("decode", model, 64, K4, 4, 64, peers=False))
        # Sliding window 127 at 32k, against the same shape without a window.
        cases.append(Case("decode", model, 64, K32, 1, 16))
        cases.append(Case("decode", model, 64, K32, 1, 16, window_left=127))
        cases.append(Case("decode", model, 128, K32, 1, 16, window_left=127))
        for s in (1024, K4, K16):  # prefill: B*S = 16k, causal
            cases.append(Case("prefill", model, K16 // s, s, s, 16))
        cases.append(Case("prefill", model, 4, K4, K4, 64, peers=False))
        cases.append(Case("prefill", model, 8, K8, K2, 16))  # chunked: 2k new over 6k cached
    return cases


def quick_plan() -> List[Case]:
    return [
        Case("decode", "llama3-8b", 64, K4, 1, 16),
        Case("decode", "llama3-8b", 1, K32, 1, 16),
        Case("decode", "gpt-oss", 16, K8, 1, 16),
        Case("decode", "llama3-8b", 64, K4, 4, 16),
        Case("decode", "llama3-8b", 64, K4, 1, 16, "fp8_e4m3"),
        Case("decode", "llama3-8b", 64, K32, 1, 16),
        Case("decode", "llama3-8b", 64, K32, 1, 16, window_left=127),
        Case("prefill", "llama3-8b", 4, K4, K4, 16),
        Case("prefill", "gpt-oss", 8, K8, K2, 16),
    ]


def prefill_plan() -> List[Case]:
    """Issue 10's prefill rows: B*S = 16k causal for llama3-8b, gpt-oss (sinks) and gemma
    (D = 256) at page 16 with the peers; page 1 and 64 against page 16; fp8 KV against
    bf16 KV; the chunked-prefill batch (2k new over 6k cached); the replays' extend shapes."""
    cases: List[Case] = []
    for model in ("llama3-8b", "gpt-oss", "gemma"):
        for s in (1024, K4, K16):
            cases.append(Case("prefill", model, K16 // s, s, s, 16))
        cases.append(Case("prefill", model, 8, K8, K2, 16))  # chunked
    for model in ("llama3-8b", "gpt-oss"):
        for p in (1, 64):
            cases.append(Case("prefill", model, 4, K4, K4, p, peers=False))
        cases.append(Case("prefill", model, 4, K4, K4, 16, "fp8_e4m3", peers=False))
        cases.append(Case("prefill", model, 1, K16, K16, 16, "fp8_e4m3", peers=False))
    cases.append(Case("prefill", "gemma", 4, K4, K4, 16, "fp8_e4m3", peers=False))
    return cases + [c for c in replay_plan() if c.op == "prefill"]


def replay_plan() -> List[Case]:
    """The shapes that dominate the trace replays (docs/perf-notes.md): Mooncake's 8k
    prefill chunks over a cached prefix, full-head and one TP-8 rank, bf16 against fp8 KV;
    Azure's mixed-step chunk and decode batch."""
    cases: List[Case] = []
    for model in ("gpt-oss", "gpt-oss-tp8"):
        for kv in ("bf16", "fp8_e4m3"):
            cases.append(Case("prefill", model, 1, K16, K8, 16, kv))
    cases.append(Case("prefill", "gpt-oss-tp8", 1, K16, K8, 16, "fp8_e4m3", window_left=127))
    cases.append(Case("prefill", "llama3-8b", 2, K4, K2, 16))
    cases.append(Case("decode", "llama3-8b", 256, 1024, 1, 16))
    for kv in ("bf16", "fp8_e4m3"):
        cases.append(Case("decode", "gpt-oss-tp8", 256, K16, 1, 16, kv))
    return cases


# --- Inputs ----------------------------------------------------------------------------

@dataclass
class InputSet:
    """One copy of a case's inputs. Dense tensors hold the keys [first_key, ctx)."""
    q: "torch.Tensor"  # [B * n, Hq, D] bf16, request-major rows
    k_pool: "torch.Tensor"  # [num_pages, P, Hkv, D] (bf16 or fp8); page 0 is the dummy
    v_pool: "torch.Tensor"
    page_table: "torch.Tensor"  # int32 [B, ceil(ctx / P)], 0 before the first used column
    seq_lens: "torch.Tensor"  # int32 [B]
    cu_seqlens_q: "torch.Tensor"  # int32 [B + 1]
    k_dense: Optional["torch.Tensor"] = None  # [B, Lk, Hkv, D] bf16 (peers), None for fp8
    v_dense: Optional["torch.Tensor"] = None
    out: Optional["torch.Tensor"] = None  # ours
    k_arg: object = None  # the pools as ours takes them (see Ours.cache_arg)
    v_arg: object = None


def _int_view(t):
    """Same bytes as an integer tensor: index_put on fp8 is not implemented everywhere."""
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)


def build_inputs(case: Case, dev, gen, want_dense: bool) -> InputSet:
    g = case.geom
    B, L, n, P = case.batch, case.ctx, case.q_len, case.page_size
    hq, hkv, d = g["hq"], g["hkv"], g["d"]
    first = case.first_key
    lk = L - first
    c0, c1 = first // P, -(-L // P)  # page columns holding visible keys
    used = c1 - c0
    bf16 = torch.bfloat16
    fp8 = case.kv_dtype == "fp8_e4m3"

    q = torch.randn(B * n, hq, d, device=dev, dtype=bf16, generator=gen)
    perm = torch.randperm(B * used, device=dev, generator=gen).to(torch.int32) + 1
    page_table = torch.zeros(B, c1, device=dev, dtype=torch.int32)
    page_table[:, c0:] = perm.view(B, used)
    ids = page_table[:, c0:].reshape(-1).long()
    cache_dtype = torch.float8_e4m3fn if fp8 else bf16

    def make(scale):
        dense = torch.randn(B, lk, hkv, d, device=dev, dtype=bf16, generator=gen)
        pool = torch.empty(B * used + 1, P, hkv, d, device=dev, dtype=cache_dtype)
        _int_view(pool[0]).zero_()
        # Token (b, c0 * P + t) of the paged view; positions outside [first, L) are garbage
        # a correct kernel never reads.
        off = first - c0 * P
        for b0 in range(0, B, 16):  # chunks bound the temporaries of the big shapes
            b1 = min(B, b0 + 16)
            chunk = dense[b0:b1]
            if fp8:
                chunk = (chunk.float() * (1.0 / scale)).to(torch.float8_e4m3fn)
            if off == 0 and lk == used * P:
                src = chunk
            else:
                src = torch.randn(b1 - b0, used * P, hkv, d, device=dev, dtype=bf16,
                                  generator=gen).to(cache_dtype)
                src[:, off:off + lk] = chunk
            _int_view(pool)[ids[b0 * used:b1 * used]] = _int_view(src).reshape(-1, P, hkv, d)
        if fp8 or not want_dense:
            del dense
            return pool, None
        return pool, dense

    k_pool, k_dense = make(FP8_K_SCALE)
    v_pool, v_dense = make(FP8_V_SCALE)
    seq_lens = torch.full((B,), L, device=dev, dtype=torch.int32)
    cu = (torch.arange(B + 1, device=dev, dtype=torch.int32) * n)
    return InputSet(q, k_pool, v_pool, page_table, seq_lens, cu, k_dense, v_dense)


def scales(case: Case):
    """(bmm1_scale, bmm2_scale) for ours; the peers take sm_scale on dequantised data."""
    sm = case.geom["d"] ** -0.5
    if case.kv_dtype == "fp8_e4m3":
        return sm * FP8_K_SCALE, FP8_V_SCALE
    return sm, 1.0


def make_sinks(case: Case, dev, gen):
    if not case.sinks:
        return None
    return torch.randn(case.geom["hq"], device=dev, dtype=torch.float32, generator=gen)


# --- Reference (fp32, from the paged pool, a few requests) -----------------------------

def reference(case: Case, s: InputSet, rows: List[int], sinks) -> "torch.Tensor":
    """fp32 attention of requests `rows` straight from the docs/semantics.md formula (section 1):
    [len(rows), n, Hq, D]. Reads the stored pool values through the page table; the fp8
    scales enter through bmm1_scale and bmm2_scale, as in the kernels."""
    g = case.geom
    L, n, P = case.ctx, case.q_len, case.page_size
    hq, hkv, d = g["hq"], g["hkv"], g["d"]
    grp = hq // hkv
    W = case.window_left
    first = case.first_key
    c0 = first // P
    bmm1, bmm2 = scales(case)
    dev = s.q.device
    lo, hi = first - c0 * P, L - c0 * P
    outs = []
    for b in rows:
        ids = s.page_table[b, c0:].long()

        def gather(pool):  # stored values (fp8 not dequantised: the scales are in bmm1/bmm2)
            raw = _int_view(pool)[ids].view(pool.dtype)
            return raw.float().reshape(-1, hkv, d)[lo:hi]  # [Lk, Hkv, D]
        k = gather(s.k_pool).repeat_interleave(grp, dim=1).permute(1, 2, 0)  # [Hq, D, Lk]
        v = gather(s.v_pool).repeat_interleave(grp, dim=1).permute(1, 0, 2)  # [Hq, Lk, D]
        pos_k = first + torch.arange(k.shape[-1], device=dev)
        q_all = s.q.view(case.batch, n, hq, d)[b].float()
        ob = []
        for i0 in range(0, n, 512):
            i1 = min(n, i0 + 512)
            qb = q_all[i0:i1].permute(1, 0, 2)  # [Hq, nb, D]
            sc = torch.matmul(qb, k) * bmm1
            pos_q = L - n + torch.arange(i0, i1, device=dev)
            vis = pos_k[None, :] <= pos_q[:, None]
            if W >= 0:
                vis &= pos_k[None, :] >= (pos_q[:, None] - W)
            sc = sc.masked_fill(~vis, float("-inf"))
            m = sc.amax(-1, keepdim=True)
            if sinks is not None:
                m = torch.maximum(m, sinks.view(hq, 1, 1))
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            p = torch.exp(sc - m)
            z = p.sum(-1, keepdim=True)
            if sinks is not None:
                z = z + torch.exp(sinks.view(hq, 1, 1) - m)
            o = torch.matmul(p, v) / torch.where(z > 0, z, torch.ones_like(z))
            ob.append((o * bmm2).permute(1, 0, 2))  # [nb, Hq, D]
        outs.append(torch.cat(ob, 0))
    return torch.stack(outs, 0)


def rel_l2(out, ref) -> Optional[float]:
    """||out - ref|| / ||ref||; None when out holds a NaN or Inf (never a pass)."""
    out = out.float()
    if not bool(torch.isfinite(out).all()):
        return None
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref))


def passes(err: Optional[float]) -> bool:
    return err is not None and err < CHECK_TOL


def check_rows(case: Case) -> List[int]:
    B = case.batch
    return sorted({0, B // 3, (2 * B) // 3, B - 1})


# --- Timing ----------------------------------------------------------------------------

def time_graph(fns: List[Callable[[], object]]) -> dict:
    """Kernel time per call by CUDA-graph replay: K calls per graph cycling through the
    input copies, median over REPLAYS replays. Falls back to event timing of an eager loop
    (recorded in "timing") when the calls cannot be captured."""
    side = torch.cuda.Stream()  # warm-up off the capture stream, as torch.cuda.graph advises
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns * 2:  # plans, handles, module load stay out of the numbers
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(2 * len(fns)):
        fns[i % len(fns)]()
    end.record()
    end.synchronize()
    est_us = max(1.0, start.elapsed_time(end) * 1e3 / (2 * len(fns)))
    iters = max(len(fns), min(1000, math.ceil(GRAPH_TARGET_US / est_us)))
    iters = -(-iters // len(fns)) * len(fns)
    method = "cuda-graph"
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(iters):
                fns[i % len(fns)]()
        run = graph.replay
        run()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - time eagerly instead, and say so
        torch.cuda.synchronize()
        method = f"events, eager loop (graph capture failed: {err_text(e)[:160]})"
        graph = None

        def run():
            for i in range(iters):
                fns[i % len(fns)]()
        run()
    times = []
    for _ in range(REPLAYS):
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / iters)
    del graph
    return {"time_us": statistics.median(times), "time_us_min": min(times),
            "time_us_max": max(times), "iters_per_graph": iters, "copies": len(fns),
            "timing": method}


def time_events(fn, reps: int = 20) -> float:
    """Median seconds of one call of a large op (launch cost negligible)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        ts.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(ts)


def measure_ceilings(dev) -> dict:
    out = {}
    n = 1 << 30  # 2 GiB of bf16
    try:
        src = torch.randn(n, device=dev, dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        t = time_events(lambda: dst.copy_(src))
        out["copy_tbps"] = 2 * src.numel() * 2 / t / 1e12
        t = time_events(lambda: torch.sum(src, dtype=torch.float32))
        out["read_tbps_torch_sum"] = src.numel() * 2 / t / 1e12
        del dst
        try:
            out["read_tbps_triton"] = _triton_read_tbps(src)
        except Exception as e:  # noqa: BLE001 - optional
            out["read_tbps_triton_error"] = f"{type(e).__name__}: {e}"[:300]
        out["read_tbps"] = max(v for k, v in out.items()
                               if k.startswith("read_tbps_") and isinstance(v, float))
        del src
    except Exception as e:  # noqa: BLE001
        out["bandwidth_error"] = f"{type(e).__name__}: {e}"[:300]
    try:
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        t = time_events(lambda: torch.matmul(a, b))
        out["gemm_bf16_tflops"] = 2 * 8192 ** 3 / t / 1e12
        del a, b
    except Exception as e:  # noqa: BLE001
        out["gemm_error"] = f"{type(e).__name__}: {e}"[:300]
    torch.cuda.empty_cache()
    return out


def _triton_read_tbps(x) -> float:
    import triton
    import triton.language as tl
    globals()["tl"] = tl  # the JIT resolves names in the module's globals, not closures

    @triton.jit
    def read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))

    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    grid = (sms * 8,)
    partial = torch.empty(grid[0], device=x.device, dtype=torch.float32)
    t = time_events(lambda: read_kernel[grid](x, partial, x.numel(), BLOCK=4096))
    ref = torch.sum(x, dtype=torch.float32)
    if not torch.allclose(partial.sum(), ref, rtol=1e-3, atol=1.0):  # really read it all
        raise RuntimeError("triton read kernel sum mismatch")
    return x.numel() * x.element_size() / t / 1e12


# --- Implementations -------------------------------------------------------------------

class Ours:
    """Calls into the pagedmha binding (python/, nanobind; tensors cross zero-copy)."""

    def __init__(self, mod):
        self.m = mod

    def cache_arg(self, pool):
        """fp8 pools cross as uint8 bits read as fp8_e4m3 (DLPack fp8 is not universal)."""
        if pool.dtype == torch.float8_e4m3fn:
            return self.m.view_as(pool.view(torch.uint8), "fp8_e4m3")
        return pool

    @staticmethod
    def stream():
        return torch.cuda.current_stream().cuda_stream

    def workspace(self, case: Case, dev):
        g = case.geom
        if case.op == "decode":
            size = int(self.m.decode_workspace_size(dev, case.batch, case.q_len, g["hq"], g["hkv"], g["d"]))
        else:
            size = int(self.m.prefill_workspace_size(dev, case.batch, case.batch * case.q_len))
        return torch.empty(max(size, 1), device=dev, dtype=torch.uint8) if size else None

    def call(self, case: Case, s: InputSet, sinks, ws):
        bmm1, bmm2 = scales(case)
        kw = dict(bmm1_scale=bmm1, bmm2_scale=bmm2, window_left=case.window_left, sinks=sinks,
                  stream=self.stream())
        if case.op == "decode":
            self.m.batch_decode(s.q, s.k_arg, s.v_arg, s.page_table, s.seq_lens,
                                case.page_size, case.q_len, s.out, workspace=ws, **kw)
        else:
            self.m.batch_prefill(s.q, s.k_arg, s.v_arg, s.page_table, s.seq_lens,
                                 s.cu_seqlens_q, case.page_size, case.q_len, s.out, workspace=ws, **kw)


def peer_mask_mode(case: Case) -> str:
    """How SDPA expresses this case's visibility on the dense keys [first_key, ctx):
    "none" (every dense key visible), "causal" (square, top-left == bottom-right),
    "lower_right" (bottom-right causal, no window), "explicit" (a boolean mask)."""
    n, lk = case.q_len, case.ctx - case.first_key
    if n == 1:
        return "none"  # first_key already applies the window
    if case.window_left < 0 and n == lk:
        return "causal"
    if case.window_left < 0:
        return "lower_right"
    return "explicit"


def explicit_mask(case: Case, dev):
    n, L, first, W = case.q_len, case.ctx, case.first_key, case.window_left
    pos_q = L - n + torch.arange(n, device=dev)
    pos_k = first + torch.arange(L - first, device=dev)
    vis = pos_k[None, :] <= pos_q[:, None]
    if W >= 0:
        vis &= pos_k[None, :] >= pos_q[:, None] - W
    return vis[None, None]  # [1, 1, n, Lk], True = attend


class Peer:
    """torch SDPA pinned to one backend on the dense cache."""

    def __init__(self, impl: str):
        from torch.nn.attention import SDPBackend
        self.impl = impl
        self.backend = (SDPBackend.CUDNN_ATTENTION if impl == M.IMPL_CUDNN
                        else SDPBackend.FLASH_ATTENTION)

    def prepare(self, case: Case, dev):
        """(attn_mask, is_causal, note) for this backend, or raise NotImplementedError."""
        mode = peer_mask_mode(case)
        if mode == "none":
            return None, False, "no mask (q_len 1)"
        if mode == "causal":
            return None, True, "is_causal"
        if self.impl == M.IMPL_FLASH:
            if mode == "lower_right":
                from torch.nn.attention.bias import causal_lower_right
                n, lk = case.q_len, case.ctx - case.first_key
                return causal_lower_right(n, lk), False, "attn_mask=causal_lower_right"
            raise NotImplementedError("flash backend takes no explicit mask")
        return explicit_mask(case, dev), False, "explicit bool attn_mask [q_len, ctx]"

    def make_fn(self, case: Case, s: InputSet, mask, is_causal: bool, gqa: str):
        from torch.nn.attention import sdpa_kernel
        g = case.geom
        B, n = case.batch, case.q_len
        q = s.q.view(B, n, g["hq"], g["d"]).transpose(1, 2)  # [B, Hq, n, D] view
        k, v = s.k_dense, s.v_dense
        if gqa == "expanded":
            grp = g["hq"] // g["hkv"]
            k = k.repeat_interleave(grp, dim=2)
            v = v.repeat_interleave(grp, dim=2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, H, Lk, D] views of BLHD storage
        scale = g["d"] ** -0.5
        backend = self.backend

        def fn():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                    enable_gqa=(gqa == "enable_gqa"))
        return fn


# --- Running a case --------------------------------------------------------------------

def base_record(case: Case, impl: str) -> dict:
    ours = impl == M.IMPL_OURS
    return {"op": case.op, "impl": impl, "model": case.model, "batch": case.batch,
            "ctx": case.ctx, "q_len": case.q_len,
            "page_size": case.page_size if ours else None,  # peers read a dense cache
            "kv_dtype": case.kv_dtype, "window_left": case.window_left,
            "sinks": case.sinks and ours}


def finish_record(rec: dict, case: Case, timing: dict, ceilings: dict) -> dict:
    rec.update(timing)
    work = case.work()
    rec.update(work)
    if case.op == "decode":
        rec["tbps"] = M.tbps(work["bytes"], rec["time_us"])
        rec["tokens_per_s"] = case.batch * case.q_len / (rec["time_us"] * 1e-6)
        if ceilings.get("read_tbps"):
            rec["pct_read_ceiling"] = 100.0 * rec["tbps"] / ceilings["read_tbps"]
    else:
        rec["tflops"] = M.tflops(work["flops"], rec["time_us"])
        if ceilings.get("gemm_bf16_tflops"):
            rec["pct_gemm_ceiling"] = 100.0 * rec["tflops"] / ceilings["gemm_bf16_tflops"]
    return rec


def err_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".strip()[:400]


def run_case(case: Case, dev, ours: Optional[Ours], ours_error: Optional[str], ceilings: dict,
             l2_bytes: int, seed: int) -> List[dict]:
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    want_dense = case.peers and case.kv_dtype == "bf16"
    copies = max(1, min(8, math.ceil(4 * l2_bytes / max(1, case.cache_bytes()))))
    sets = [build_inputs(case, dev, gen, want_dense) for _ in range(copies)]
    sinks = make_sinks(case, dev, gen)
    rows = check_rows(case)
    ref = reference(case, sets[0], rows, sinks)
    records = []

    # Ours.
    rec = base_record(case, M.IMPL_OURS)
    if ours is None:
        rec["error"] = ours_error or "pagedmha not importable"
    else:
        try:
            ws = ours.workspace(case, dev)
            for s in sets:
                s.k_arg, s.v_arg = ours.cache_arg(s.k_pool), ours.cache_arg(s.v_pool)
                s.out = torch.full_like(s.q, float("nan"))  # poison: every element must be written
            ours.call(case, sets[0], sinks, ws)
            torch.cuda.synchronize()
            out = sets[0].out
            written = bool(torch.isfinite(out).all())
            err = rel_l2(out.view(case.batch, case.q_len, *out.shape[1:])[rows], ref)
            rec.update({"rel_l2": err, "all_written": written,
                        "check_pass": written and passes(err)})
            timing = time_graph([lambda s=s: ours.call(case, s, sinks, ws) for s in sets])
            finish_record(rec, case, timing, ceilings)
        except Exception as e:  # noqa: BLE001 - record and go on
            rec["error"] = err_text(e)
            log_traceback()
    records.append(rec)

    # Peers.
    if case.peers:
        for impl in (M.IMPL_CUDNN, M.IMPL_FLASH):
            rec = base_record(case, impl)
            records.append(rec)
            if case.kv_dtype != "bf16":
                rec["error"] = f"SDPA takes no {case.kv_dtype} KV cache"
                continue
            if case.sinks:
                rec["note"] = "SDPA has no attention sinks: peer runs without them"
            try:
                peer = Peer(impl)
                mask, is_causal, how = peer.prepare(case, dev)
                rec["mask"] = how
                fns, gqa, first_err = None, None, None
                for mode in ("enable_gqa", "expanded"):
                    try:
                        if mode == "expanded":
                            grp = case.geom["hq"] // case.geom["hkv"]
                            if sum(s.k_dense.numel() for s in sets) * 4 * grp > 40e9:
                                raise RuntimeError("expanded K/V would not fit")
                        fns = [peer.make_fn(case, s, mask, is_causal, mode) for s in sets]
                        out = fns[0]()
                        torch.cuda.synchronize()
                        gqa = mode
                        break
                    except Exception as e:  # noqa: BLE001
                        first_err = first_err or err_text(e)
                        fns = None
                if fns is None:
                    raise RuntimeError(first_err)
                rec["gqa"] = gqa
                if gqa == "expanded":
                    rec["note"] = ((rec.get("note", "") + "; ") if rec.get("note") else "") + \
                        f"enable_gqa unsupported ({first_err[:120]}): K/V heads expanded " \
                        "once outside timing; the peer reads G times the bytes"
                o = out.transpose(1, 2)  # [B, n, Hq, D]
                ref_p = ref
                if case.sinks:  # compare with the same problem without sinks
                    ref_p = reference(case, sets[0], rows, None)
                err = rel_l2(o[rows], ref_p)
                rec.update({"rel_l2": err, "check_pass": passes(err)})
                if not passes(err):
                    raise RuntimeError(f"peer result off the reference: rel L2 {err}")
                finish_record(rec, case, time_graph(fns), ceilings)
            except Exception as e:  # noqa: BLE001
                rec["error"] = err_text(e)
    del sets
    torch.cuda.empty_cache()
    return records


# --- Output ----------------------------------------------------------------------------

def git_commit() -> str:
    env = os.environ.get("PAGEDMHA_COMMIT")
    if env:
        return env
    try:
        sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) if sha else "unknown"
    except Exception:  # noqa: BLE001
        return "unknown"


def summary_table(records: List[dict]) -> str:
    peers = M.peer_index(records)
    lines = [f"{'case':<46} {'ours us':>9} {'ours':>7} {'cudnn':>7} {'flash':>7} "
             f"{'x cudnn':>7} {'x flash':>7} {'relL2':>8}"]
    for r in records:
        if r["impl"] != M.IMPL_OURS:
            continue
        c = Case(r["op"], r["model"], r["batch"], r["ctx"], r["q_len"], r["page_size"],
                 r["kv_dtype"], r["window_left"])
        unit = "TB/s" if r["op"] == "decode" else "TF/s"

        def fig(rec):
            v = None if rec is None else M.metric_of(rec)
            return f"{v:7.2f}" if v else f"{'-':>7}"

        def rat(impl):
            v = M.ratio_to_peer(r, peers, impl)
            return f"{v:7.2f}" if v else f"{'-':>7}"
        cu = peers.get((M.shape_key(r), M.IMPL_CUDNN))
        fl = peers.get((M.shape_key(r), M.IMPL_FLASH))
        t = f"{r['time_us']:9.1f}" if M.ok(r) else f"{'ERR':>9}"
        e = r.get("rel_l2")
        el = f"{e:8.1e}" if isinstance(e, float) else f"{'-':>8}"
        if r.get("check_pass") is False:
            el += " CHECK FAILED"
        lines.append(f"{c.name + ' ' + unit:<46} {t} {fig(r if M.ok(r) else None)} {fig(cu)} "
                     f"{fig(fl)} {rat(M.IMPL_CUDNN)} {rat(M.IMPL_FLASH)} {el}")
    lines.append("")
    lines.append("targets:")
    for t in M.evaluate_targets(records):
        lines.append("  " + M.fmt_target(t))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a handful of shapes (< 60 s)")
    ap.add_argument("--prefill", action="store_true",
                    help="the prefill rows (pages 1 / 16 / 64, fp8, gemma, chunked; *-attention-prefill-*)")
    ap.add_argument("--replay-shapes", action="store_true",
                    help="the shapes that dominate the trace replays (written as *-attention-replay-shapes-*)")
    ap.add_argument("--module-path", default=None,
                    help="folder holding the built pagedmha package (<build>/python); default: "
                         "$PAGEDMHA_BUILD_DIR/python when it exists, else PYTHONPATH")
    ap.add_argument("--filter", default=None, help="regex on case names, e.g. 'decode llama'")
    ap.add_argument("--out-dir", default=str(REPO / "bench" / "results"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--skip-ours", action="store_true", help="peers and ceilings only")
    args = ap.parse_args(argv)

    global torch, F
    try:
        import torch as _torch
        import torch.nn.functional as _F
        torch, F = _torch, _F
    except Exception as e:  # noqa: BLE001
        log(f"bench_attention: needs PyTorch (import failed: {err_text(e)})")
        return 2
    if not torch.cuda.is_available():
        log("bench_attention: no CUDA device visible to PyTorch")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference is true fp32
    dev = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(dev)
    gpu = torch.cuda.get_device_name(dev)
    l2 = int(getattr(props, "L2_cache_size", 0) or 60 * 2 ** 20)

    ours, ours_error = None, None
    if not args.skip_ours:
        module_path = args.module_path
        build_dir = os.environ.get("PAGEDMHA_BUILD_DIR")
        if not module_path and build_dir and (Path(build_dir) / "python" / "pagedmha").is_dir():
            module_path = str(Path(build_dir) / "python")  # the built package (.so inside)
        if module_path:
            sys.path.insert(0, os.path.abspath(module_path))
        try:
            import pagedmha
            ours = Ours(pagedmha)
            log(f"pagedmha from {getattr(pagedmha, '__file__', '?')}")
        except Exception as e:  # noqa: BLE001
            ours_error = f"import pagedmha failed: {err_text(e)}"
            log(ours_error + " (peers and ceilings still run)")
    else:
        ours_error = "skipped (--skip-ours)"

    t0 = time.time()
    log(f"{gpu}: torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
        f"L2 {l2 / 2 ** 20:.0f} MiB")
    ceilings = measure_ceilings(dev)
    log("ceilings: " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                    for k, v in ceilings.items()}))

    cases = (quick_plan() if args.quick else prefill_plan() if args.prefill
             else replay_plan() if args.replay_shapes else full_plan())
    if args.filter:
        cases = [c for c in cases if re.search(args.filter, c.name)]
    records = []
    for i, case in enumerate(cases):
        t1 = time.time()
        try:
            recs = run_case(case, dev, ours, ours_error, ceilings, l2, args.seed + i)
        except Exception as e:  # noqa: BLE001 - e.g. out of memory building inputs
            log_traceback()
            recs = [dict(base_record(case, M.IMPL_OURS), error=err_text(e))]
            torch.cuda.empty_cache()
        records.extend(recs)
        brief = ", ".join(
            f"{r['impl']} {r['time_us']:.1f} us" if M.ok(r) else f"{r['impl']} ERR"
            for r in recs)
        log(f"[{i + 1}/{len(cases)}] {case.name}: {brief} ({time.time() - t1:.1f} s)")

    now = datetime.datetime.now(datetime.timezone.utc)
    doc = {
        "gpu": gpu,
        "commit": git_commit(),
        "command": M.repo_relative_command(["python3", sys.argv[0], *(sys.argv[1:] if argv is None else argv)],
                                           REPO),
        "date": now.isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "method": "CUDA-graph replay, median of replays; inputs rotated past L2; "
                  "peers on dense caches with the same content",
        "ceilings": ceilings,
        "records": records,
        "targets": M.evaluate_targets(records),
        "wall_s": round(time.time() - t0, 1),
    }
    plan = ("-quick" if args.quick else "-prefill" if args.prefill
            else "-replay-shapes" if args.replay_shapes else "")
    name = f"{M.gpu_slug(gpu)}-attention{plan}-{now:%Y%m%d}.json"
    text = json.dumps(doc, indent=1)
    dirs = [Path(args.out_dir)]
    if os.environ.get("OUT"):
        dirs.append(Path(os.environ["OUT"]))
    for dname in dirs:
        try:
            dname.mkdir(parents=True, exist_ok=True)
            (dname / name).write_text(text + "\n")
            log(f"wrote {dname / name}")
        except OSError as e:
            log(f"could not write {dname / name}: {e}")

    print(f"{gpu}  copy {ceilings.get('copy_tbps', 0):.2f} TB/s  read "
          f"{ceilings.get('read_tbps', 0):.2f} TB/s  gemm {ceilings.get('gemm_bf16_tflops', 0):.0f}"
          f" TFLOP/s  ({doc['wall_s']} s)")
    print(summary_table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
