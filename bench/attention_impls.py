"""The implementations the attention benchmark compares (pagedmha, torch SDPA pinned to
cuDNN or flash) and one case run through them: checked against the reference, then
timed. Needs torch."""

from __future__ import annotations

import math
from typing import List, Optional

import torch
import torch.nn.functional as F

import metrics as M
from attention_cases import Case, err_text, log_traceback, peer_mask_mode, scales
from attention_inputs import InputSet, build_inputs, check_rows, make_sinks, passes, reference, rel_l2
from attention_timing import time_graph

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
