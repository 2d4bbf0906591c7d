#!/usr/bin/env python3
"""Summary of an Nsight Compute per-instruction SASS export (bench/prefill_profile.sh's
<name>-s<shape>-sass.csv): the instructions the kernel executed by opcode, grouped by how
often each ran (the KV-step loop's instructions all run the same number of times, the
most of any large group), and the warp-stall samples of that loop by reason, with cycles
per step per warp estimated as loop instructions / the share of its samples that issued.

    python3 bench/ncu_sass_summary.py <sass.csv or .csv.gz> [...]

A report for comparing kernels (e.g. ours against FlashAttention-3's in the same run), not
a test; numbers are ncu's sampling, so shares move by a percent or two between runs.
"""
import argparse
import collections
import csv
import gzip
import sys


def load(path):
    """Rows of one export: dicts of address, source text, executions, samples, stalls."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    header = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if header is None:  # e.g. ncu's error text, which prefill_profile.sh writes in its place
        raise SystemExit(f"ncu_sass_summary: {path}: expected ncu's SASS export (a row starting "
                         f"with \"Address\"), got none; first line: {rows[0][:1] if rows else 'empty file'}")
    names = rows[header]
    col = {n: i for i, n in enumerate(names)}
    stall_cols = [(n[len("stall_"):], i) for n, i in col.items() if n.startswith("stall_") and "Not Issued" not in n]
    out = []
    for r in rows[header + 1:]:
        if len(r) < len(names):
            continue
        out.append({
            "src": r[col["Source"]].strip(),
            "ex": int(r[col["Instructions Executed"]] or 0),
            "samples": int(r[col["Warp Stall Sampling (All Samples)"]] or 0),
            "stalls": {n: int(r[i] or 0) for n, i in stall_cols},
        })
    return out


def opcode(src):
    words = src.split()
    if not words:
        return "?"
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


def summarize(path, top=14):
    ins = load(path)
    total = sum(i["ex"] for i in ins)
    samples = sum(i["samples"] for i in ins) or 1
    print(f"== {path}: {total / 1e6:.1f} M warp instructions, {samples} samples")
    ops = collections.Counter()
    for i in ins:
        ops[opcode(i["src"])] += i["ex"]
    print("  by opcode (M): " + " ".join(f"{k} {v / 1e6:.1f}" for k, v in ops.most_common(top)))
    groups = collections.defaultdict(lambda: [0, 0, 0])  # executions -> [instructions, total, samples]
    for i in ins:
        if i["ex"] > 0:
            g = groups[i["ex"]]
            g[0] += 1
            g[1] += i["ex"]
            g[2] += i["samples"]
    print("  by execution count:")
    for ex, (n, tot, smp) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:8]:
        print(f"    {ex:>10} x {n:>5} instructions = {tot / 1e6:7.1f} M ({100 * tot / total:4.1f}%), "
              f"samples {100 * smp / samples:4.1f}%")
    # The loop: the largest group of at least 100 instructions sharing one count.
    loop_ex = max((ex for ex, g in groups.items() if g[0] >= 100), key=lambda ex: groups[ex][1], default=None)
    if loop_ex is None:
        return
    loop = [i for i in ins if i["ex"] == loop_ex]
    reasons = collections.Counter()
    for i in loop:
        reasons.update(i["stalls"])
    n = sum(reasons.values()) or 1
    issued = reasons.get("selected", 0) / n
    cycles = len(loop) / issued if issued > 0 else float("nan")
    print(f"  loop ({loop_ex} executions): {len(loop)} instructions, ~{cycles:.0f} cycles per step per warp; "
          "stalls (cycles per step):")
    print("    " + " ".join(f"{k} {cycles * v / n:.0f}" for k, v in reasons.most_common(12)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    for f in args.files:
        summarize(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
