"""Inputs of one benchmark case (a paged pool whose pages are a random permutation, dense
copies for the peers) and the fp32 reference the results are checked against. Needs torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

from attention_cases import FP8_K_SCALE, FP8_V_SCALE, Case, scales

CHECK_TOL = 2e-2


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
