#!/usr/bin/env python3
"""Plot a `pagedmha replay --json` report: step latency vs batch tokens, and KV pages in use over time."""
import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("report", help="JSON written by pagedmha replay --json")
    ap.add_argument("-o", "--output", default="replay.png", help="image file (PNG)")
    args = ap.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_replay.py: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return 1
    try:
        with open(args.report) as f:
            rep = json.load(f)
        cols = rep["steps"]  # columns of the (strided) per-step records
        rep["model"]["cache_groups"], rep["summary"]["steps"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"plot_replay.py: {args.report}: not a readable pagedmha replay --json report ({e!r})", file=sys.stderr)
        return 1
    n = len(cols["step"])
    groups = [g["name"] for g in rep["model"]["cache_groups"]]
    # A dry run (--dry-run) times nothing: plot each step's roofline floor instead.
    dry = bool(rep.get("options", {}).get("dry_run"))
    y_key, y_label = ("floor_us", "roofline floor, all layers [us]") if dry else \
        ("attention_us", "attention time, all layers [us]")
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.8))
    for kind, color in (("decode", "tab:blue"), ("extend", "tab:orange")):
        sel = [i for i in range(n) if (cols["extend_rows"][i] == 0) == (kind == "decode")]
        a.scatter([cols["tokens"][i] for i in sel], [cols[y_key][i] for i in sel], s=6, alpha=0.6,
                  color=color, label=f"{kind} steps ({len(sel)} shown)")
    a.set_xlabel("query tokens in the step")
    a.set_ylabel(y_label)
    a.set_xscale("symlog")
    if any(v > 0 for v in cols[y_key]):  # a log axis needs a positive value (none: no steps)
        a.set_yscale("log")
    else:
        a.text(0.5, 0.5, "no steps", transform=a.transAxes, ha="center", va="center")
    a.set_title("step " + ("floor" if dry else "latency") + " vs batch tokens" +
                (f" (every {cols['stride']}th step)" if cols["stride"] > 1 else ""))
    a.legend()
    # In use includes prompt blocks only the prefix cache holds; live pages (reports since
    # live_pages exist) are those running requests reference.
    live = cols.get("live_pages")
    for gi, name in enumerate(groups):
        line, = b.plot(cols["step"], cols["pages_in_use"][gi],
                       label=f"{name}: in use" + (" (live + prefix cache)" if live else ""))
        if live:
            b.plot(cols["step"], live[gi], color=line.get_color(), ls=":", label=f"{name}: live")
    b.axhline(rep["options"]["pages_per_group"] - 1, color="gray", ls="--", lw=1, label="pool capacity")
    b.set_xlabel("step")
    b.set_ylabel("KV pages")
    b.set_title("KV pages over time")
    b.legend()
    s = rep["summary"]
    trunc = f" (truncated: {s['finished']}/{s['requests']} finished)" if rep.get("truncated") else ""
    if dry:
        figures = f"dry run, floor {s['roofline_floor_s']:.1f} s, " if s.get("roofline_floor_s") is not None \
            else "dry run, "
    else:
        fig_of = lambda key, f: "-" if s.get(key) is None else format(s[key], f)  # noqa: E731
        figures = f"{fig_of('achieved_tbps', '.3f')} TB/s, {fig_of('achieved_tflops', '.2f')} TFLOP/s, "
        if s.get("ratio_roofline") is not None:
            figures += f"roofline ratio {s['ratio_roofline']:.3f}, "
    # null (with prefix_hit_rate_na saying why) when no prompt could hit the prefix cache
    prefix = "prefix hit n/a" if s.get("prefix_hit_rate") is None else f"prefix hit {s['prefix_hit_rate']:.1%}"
    fig.suptitle(f"{rep['model']['name']} on {rep['device']}: {s['requests']} requests, {s['steps']} steps, "
                 f"{figures}{prefix}, preemptions {s['preemptions']}{trunc}")
    fig.tight_layout()
    try:
        fig.savefig(args.output, dpi=110)
    except OSError as e:
        print(f"plot_replay.py: -o/--output: expected a writable image file, got {args.output} ({e.strerror})",
              file=sys.stderr)
        return 1
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
