#!/usr/bin/env python3
"""A host model of how evenly the Hopper prefill's persistent grid shares a batch: the
plan's units (pairs of a request's query tiles, or single tiles: policy.h
kPlanPairRounds) sorted longest first and dealt to the walkers (clusters) as
params.cuh Walk deals them, round-robin or serpentine (hopper/walk_order.h). A
prediction tool for docs/perf-notes, not a measurement: it counts KV tiles (plus half a
tile per unit for an item's fixed cost), not time, and ignores the L2 and the pipeline.

Balance = ideal / makespan, the ideal being the total work over the walkers.

  python3 bench/plan_balance.py                 # the standard shapes and TP-8 extends
  python3 bench/plan_balance.py --replay R.json # time share of a replay report's steps
  python3 bench/plan_balance.py --replay R.json --shapes D.json
      # and, per group, the decode rows' estimated share of a step and the prefill part's
      # flops floor / time; D: a report with the per-step "extend" rows (R itself when it
      # has them, else `pagedmha replay --dry-run` with R's options: the same steps)

The geometry follows prefill_sm90/policy.h for causal bf16 / fp8 KV loaded by TMA:
192-row tiles at D = 64 bf16 (three consumer warpgroups) and at D = 64 fp8 where
fp8_rows192_pays says so, else 128; clusters of two for bf16 with an even GQA group; the
largest pack <= 16 that divides the group per cluster; 128-key tiles up to D = 128, 80 at
D = 256 bf16, 64 for D = 256 fp8.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
from typing import List, Sequence, Tuple

UNIT_OVERHEAD = 0.5  # KV tiles' worth of an item's fixed cost (first step, epilogue)
SMS = 132


def fp8_rows192_pays(rows: int, batch: int, max_q: int, pack: int, head_units: int, ctas: int) -> bool:
    """policy.h fp8_rows192_pays (its default): 4 x the rounds of 192-row tiles <= 3 x
    those of 128-row tiles, each request's partial last tile bounded from the host values."""
    if rows <= 0 or batch <= 0 or max_q <= 0 or ctas <= 0:
        return False

    def rounds(block_m: int) -> int:
        tokens = block_m // pack
        tiles = min(-(-rows // tokens) + batch - 1, batch * -(-max_q // tokens))
        return -(-tiles * head_units // ctas)

    return 4 * rounds(192) <= 3 * rounds(128)


def geometry(hq: int, hkv: int, d: int, fp8: bool, sms: int = SMS,
             requests: Sequence[Tuple[int, int]] = ()) -> Tuple[int, int, int, int]:
    """(tokens per query tile, units per plan entry, keys per KV tile, walkers) for a
    launch of `requests` ((queries, keys) each: fp8 at D = 64 chooses its tile by them)."""
    group = hq // hkv
    cluster = 2 if not fp8 and group % 2 == 0 else 1
    g = group // cluster
    pack = next((p for p in range(min(g, 16), 1, -1) if g % p == 0), 1)
    per_entry = hkv * (group // pack) // cluster
    queries = [n for n, _ in requests]
    rows192 = d == 64 and (not fp8 or fp8_rows192_pays(sum(queries), len(queries), max(queries, default=0), pack,
                                                       per_entry, sms))
    block_m = 192 if rows192 else 128
    block_n = 128 if d <= 128 else (64 if fp8 else 80)
    return block_m // pack, per_entry, block_n, sms // cluster


def tile_costs(requests: Sequence[Tuple[int, int]], tokens: int, block_n: int) -> List[List[int]]:
    """KV tiles of each query tile of each (queries n, keys L) request, causal bottom-right."""
    out = []
    for n, keys in requests:
        costs = []
        for m in range(math.ceil(n / tokens)):
            rest = n - m * tokens
            hi = keys - rest + min(rest, tokens)
            costs.append(math.ceil(hi / block_n))
        out.append(costs)
    return out


def units(costs: List[List[int]], pairs: bool) -> List[int]:
    """Unit costs: tile n - 1 - j with tile j per request, or every tile alone."""
    if not pairs:
        return [c for request in costs for c in request]
    out = []
    for request in costs:
        n = len(request)
        for j in range((n + 1) // 2):
            m0 = n - 1 - j
            out.append(request[m0] + (request[j] if j < m0 else 0))
    return out


def balance(unit_costs: List[int], per_entry: int, walkers: int, serpentine: bool) -> float:
    """Ideal / makespan of the units dealt longest first, per_entry items each."""
    items = [c + UNIT_OVERHEAD for c in sorted(unit_costs, reverse=True) for _ in range(per_entry)]
    load = [0.0] * walkers
    for q, cost in enumerate(items):
        k, r = divmod(q, walkers)
        load[walkers - 1 - r if serpentine and k % 2 else r] += cost
    return (sum(load) / walkers) / max(load) if items else 1.0


def report(name: str, requests, model, pair_rounds: int = 3) -> str:
    tokens, per_entry, block_n, walkers = geometry(*model, requests=requests)
    costs = tile_costs(requests, tokens, block_n)
    main = balance(units(costs, True), per_entry, walkers, False)
    n_pairs = len(units(costs, True))
    use_pairs = n_pairs * per_entry >= pair_rounds * walkers
    knob = balance(units(costs, use_pairs), per_entry, walkers, True)
    return (f"{name:44s} pairs {n_pairs:5d} ({n_pairs * per_entry / walkers:5.1f} rounds): "
            f"main {main:.2f}, knob {knob:.2f} ({'pairs' if use_pairs else 'single tiles'})")


MODELS = {
    "llama3-8b": (32, 8, 128, False), "gpt-oss": (64, 8, 64, False), "gemma": (16, 8, 256, False),
    "gpt-oss fp8": (64, 8, 64, True), "gpt-oss-tp8": (8, 1, 64, False), "gpt-oss-tp8 fp8": (8, 1, 64, True),
}


def standard_rows() -> List[str]:
    rows = []
    for name in ("llama3-8b", "gpt-oss", "gemma", "gpt-oss fp8"):
        for label, reqs in (("1x16k", [(16384, 16384)]), ("4x4k", [(4096, 4096)] * 4),
                            ("16x1k", [(1024, 1024)] * 16), ("8x8k q2k", [(2048, 8192)] * 8)):
            rows.append(report(f"{name} {label}", reqs, MODELS[name]))
    for name in ("gpt-oss-tp8", "gpt-oss-tp8 fp8"):
        rows.append(report(f"{name} 1x16k q8k", [(8192, 16384)], MODELS[name]))
    rows.append(report("gpt-oss-tp8 fp8 q2000 over 30000", [(2000, 30000)], MODELS["gpt-oss-tp8 fp8"]))
    rows.append(report("gpt-oss-tp8 fp8 2 x q3000 over 20000", [(3000, 20000)] * 2, MODELS["gpt-oss-tp8 fp8"]))
    return rows


def replay_shares(doc: dict) -> List[str]:
    """A replay report's sampled steps by (extend tokens in thousands, extend rows): steps,
    share of the sampled attention time, and floor / time (the steps' roofline ratio)."""
    s = doc["steps"]
    total = sum(s["attention_us"]) or 1.0
    acc = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for tok, dec, rows, us, floor in zip(s["tokens"], s["decode_rows"], s["extend_rows"], s["attention_us"],
                                         s["floor_us"]):
        key = (min((tok - dec) // 1024, 8), min(rows, 4))
        acc[key][0] += 1
        acc[key][1] += us
        acc[key][2] += floor
    out = ["extend tokens (k), extend rows: steps, time share, floor / time"]
    for key in sorted(acc):
        n, us, floor = acc[key]
        out.append(f"{key[0]}k, {key[1]}{'+' if key[1] == 4 else ''}: {n}, {us / total:.3f}, "
                   f"{floor / us if us else 0:.2f}")
    return out


def mixed_split(doc: dict, shapes: dict, tflops_ceiling: float = 760e12) -> List[str]:
    """Mixed steps split into their decode rows and their prefill launch. The decode part
    is estimated from the decode-only steps of >= 200 rows (a least-squares line of time
    against KV tokens), applied to a step's KV tokens outside its extend rows; the rest is
    the prefill's time, against its flops floor (the decode rows' flops are negligible)."""
    s, ext = doc["steps"], shapes["steps"]["extend"]
    if shapes["steps"]["step"] != s["step"]:
        raise SystemExit("plan_balance: --shapes is not a report of the same steps as --replay")
    pts = [(kv, us) for kv, us, e, d in zip(s["kv_tokens"], s["attention_us"], s["extend_rows"], s["decode_rows"])
           if e == 0 and d >= 200]
    if len(pts) < 2:
        return ["too few decode-only steps to estimate the decode rows' time"]
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / (sum((x - mx) ** 2 for x, _ in pts) or 1.0)
    acc = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for i, rows in enumerate(ext):
        if not rows:
            continue
        dec_kv = s["kv_tokens"][i] - sum(seq for _, seq in rows)
        dec_us = my + slope * (dec_kv - mx) if s["decode_rows"][i] > 0 else 0.0
        a = acc[min(len(rows), 4)]
        a[0] += s["attention_us"][i]
        a[1] += dec_us
        a[2] += s["flops"][i] / tflops_ceiling * 1e6
    out = [f"decode-only steps: {len(pts)}, time = {my:.0f} us + {slope * 1e3:.3f} us per 1k KV tokens from "
           f"{mx / 1e3:.0f}k", "extend rows: decode share of the time, prefill flops floor / prefill time"]
    for k in sorted(acc):
        us, dec, floor = acc[k]
        out.append(f"{k}{'+' if k == 4 else ''}: {dec / us:.2f}, {floor / (us - dec) if us > dec else 0:.2f}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replay", help="a pagedmha replay report (bench/results/*-replay-*.json)")
    ap.add_argument("--shapes", help="with --replay: a report of the same steps with their extend rows")
    args = ap.parse_args(argv)
    if args.replay:
        with open(args.replay) as f:
            doc = json.load(f)
        print("\n".join(replay_shares(doc)))
        if args.shapes:
            with open(args.shapes) as f:
                print("\n".join(mixed_split(doc, json.load(f))))
    else:
        print("\n".join(standard_rows()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
