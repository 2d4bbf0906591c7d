#!/usr/bin/env python3
"""Attention time of replay reports by step kind: mixed steps (extend and decode rows),
decode-only and prefill-only steps, counted from a first step on. For reports of the
same trace and options (the scheduler's steps do not depend on timing), so that one
change can be read step kind by step kind. Times are the reports' per-step records
scaled by their stride; floor / time uses the report's roofline floor.

  python3 bench/replay_step_kinds.py [--from-step N] R1.json R2.json ...
"""

from __future__ import annotations

import argparse
import json


def kinds(path: str, first: int) -> dict:
    with open(path) as f:
        doc = json.load(f)
    s = doc["steps"]
    stride = s["stride"]
    out = {k: [0.0, 0, 0.0] for k in ("mixed", "decode", "prefill")}  # time us, steps, floor us
    for i, step in enumerate(s["step"]):
        if step < first:
            continue
        ext, dec = s["extend_rows"][i], s["decode_rows"][i]
        kind = "mixed" if ext and dec else "prefill" if ext else "decode"
        out[kind][0] += s["attention_us"][i] * stride
        out[kind][1] += stride
        out[kind][2] += s["floor_us"][i] * stride
    out["all_ms"] = sum(s["attention_us"]) * stride / 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+")
    ap.add_argument("--from-step", type=int, default=500, help="first step counted (default 500: past the ramp)")
    args = ap.parse_args()
    print("| report | mixed ms | steps | floor / time | decode-only ms | steps | prefill-only ms | steps | all steps ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for path in args.reports:
        k = kinds(path, args.from_step)
        m, d, p = k["mixed"], k["decode"], k["prefill"]
        ratio = m[2] / m[0] if m[0] else 0.0
        print(f"| {path.split('/')[-1]} | {m[0] / 1e3:.1f} | {m[1]} | {ratio:.3f} | {d[0] / 1e3:.1f} | {d[1]} | "
              f"{p[0] / 1e3:.1f} | {p[1]} | {k['all_ms']:.1f} |")


if __name__ == "__main__":
    main()
