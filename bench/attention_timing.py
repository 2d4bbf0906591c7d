"""Timing of the attention benchmark: CUDA-graph replay of rotated input copies, event
timing of large ops, and the device ceilings (copy, read stream, bf16 GEMM). Needs torch."""

from __future__ import annotations

import math
import statistics
from typing import Callable, List

import torch

from attention_cases import err_text

GRAPH_TARGET_US = 4000.0  # device time per graph replay
REPLAYS = 15


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
