"""Cases of the attention benchmark (bench_attention.py): the Case shape, the plans, how
SDPA masks a case, the fp8 scales, and logging. Standard library only (with metrics.py):
--help, the plans and the tests need no torch."""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass
from typing import List

import metrics as M  # stdlib only; bench_attention.py puts bench/ on sys.path

FP8_K_SCALE = 0.04  # randn / 0.04 stays well inside e4m3's +-448
FP8_V_SCALE = 0.03


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


_tracebacks_left = [3]


def log_traceback() -> None:
    """The first few tracebacks only: one broken op would otherwise flood the output."""
    if _tracebacks_left[0] > 0:
        _tracebacks_left[0] -= 1
        log(traceback.format_exc())


def err_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".strip()[:400]


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
        k = M.len_label
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
# (batch, ctx) lists shared with the targets (metrics.py).
DECODE_BXC, FP8_BXC, WINDOW_BXC, TP8_BXC = M.DECODE_BXC, M.FP8_BXC, M.WINDOW_BXC, M.TP8_BXC


def decode_pages(model: str, shapes) -> List[Case]:
    """bf16 q_len 1 decode at page 16 (with the peers) and page 64 (ours only: the peers
    read a dense cache, page_size changes nothing for them) for each (batch, ctx)."""
    return [Case("decode", model, b, c, 1, p, peers=p == 16) for b, c in shapes for p in (16, 64)]


def full_plan() -> List[Case]:
    cases: List[Case] = []
    for model in ("llama3-8b", "gpt-oss"):
        cases += decode_pages(model, DECODE_BXC)
        for b, c in FP8_BXC:
            cases.append(Case("decode", model, b, c, 1, 16, "fp8_e4m3"))
        cases.append(Case("decode", model, 128, K32, 1, 64, "fp8_e4m3", peers=False))
        for b, c in [(16, K8), (64, K4), (128, K32)]:  # speculative verify
            cases.append(Case("decode", model, b, c, 4, 16))
        cases.append(Case("decode", model, 64, K4, 4, 64, peers=False))
        # Sliding window 127 at 32k, against the same shape without a window.
        cases.append(Case("decode", model, 64, K32, 1, 16))
        for b, c in WINDOW_BXC:
            cases.append(Case("decode", model, b, c, 1, 16, window_left=127))
        for s in (1024, K4, K16):  # prefill: B*S = 16k, causal
            cases.append(Case("prefill", model, K16 // s, s, s, 16))
        cases.append(Case("prefill", model, 4, K4, K4, 64, peers=False))
        cases.append(Case("prefill", model, 8, K8, K2, 16))  # chunked: 2k new over 6k cached
    return cases


def decode_plan() -> List[Case]:
    """Issue 13's decode rows (all q_len 1 unless said): for llama3-8b and gpt-oss every
    standard batch x ctx in bf16 at page 16 and 64; verify (q_len 4) at 64x4k against
    q_len 1; fp8 KV against bf16 KV at 1x32k, 64x4k, 128x32k; window 127 at 64x32k and
    128x32k; page 1 against page 16 at llama3-8b 128x8k; one TP-8 rank of llama3-70b at
    1x32k, 32x2k, 256x2k and 64x8k, page 16 and 64."""
    cases: List[Case] = []
    for model in ("llama3-8b", "gpt-oss"):
        cases += decode_pages(model, DECODE_BXC)  # holds q_len 1 at 64x4k p16 for verify
        cases.append(Case("decode", model, 64, K4, 4, 16))
        for b, c in FP8_BXC:  # the peers record that SDPA takes no fp8 KV
            cases.append(Case("decode", model, b, c, 1, 16, "fp8_e4m3"))
        for b, c in WINDOW_BXC:
            cases.append(Case("decode", model, b, c, 1, 16, window_left=127))
    cases.append(Case("decode", "llama3-8b", 128, K8, 1, 16))
    cases.append(Case("decode", "llama3-8b", 128, K8, 1, 1, peers=False))
    return cases + decode_pages("llama3-70b-tp8", TP8_BXC)


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
    """The shapes that dominate the trace replays (docs/perf-notes/replays.md): Mooncake's 8k
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


def scales(case: Case):
    """(bmm1_scale, bmm2_scale) for ours; the peers take sm_scale on dequantised data."""
    sm = case.geom["d"] ** -0.5
    if case.kv_dtype == "fp8_e4m3":
        return sm * FP8_K_SCALE, FP8_V_SCALE
    return sm, 1.0


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
