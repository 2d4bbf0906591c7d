#!/usr/bin/env python3
"""Attention benchmark: pagedmha against PyTorch SDPA (cuDNN and flash backends).

Same process, same run, same content: our kernels read a paged cache whose pages are a
random permutation of the pool; the peers read dense [B, L, Hkv, D] tensors holding the
same keys and values. Every implementation is timed by CUDA-graph replay (K launches per
graph, inputs rotated among copies so L2 does not hold them), median of replays. Each case
is first checked against an fp32 reference (relative L2 < 2e-2, recorded). The device
ceilings (copy, read stream, bf16 GEMM) are measured in the same run.

Writes bench/results/<gpu>-attention[-<plan>]-<yyyymmdd>.json (PERFORMANCE.md schema) and a copy
under $OUT when set; prints a table with the ratios to torch-cudnn and the targets last.

  python3 bench/bench_attention.py --module-path build/cuda/python \
      [--quick | --decode | --prefill | --replay-shapes]
  PAGEDMHA_BUILD_DIR=build/cuda python3 bench/bench_attention.py --filter 'decode llama'
  PYTHONPATH=build/cuda/python python3 bench/bench_attention.py --skip-ours   # peers only

This file is the driver (options, the run, the results file and table). Beside it:
attention_cases.py (shapes and plans, torch-free), attention_inputs.py (inputs and the fp32
reference), attention_timing.py (graph timing, ceilings), attention_impls.py (pagedmha and
the SDPA peers, one case's run), metrics.py (byte / flop counts, targets).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import metrics as M  # noqa: E402  (stdlib only)
# The torch-free parts: cases, plans, masks, logging (the tests use them without torch).
from attention_cases import (Case, decode_plan, err_text, full_plan, log,  # noqa: E402,F401
                             log_traceback, peer_mask_mode, prefill_plan, quick_plan, replay_plan)

torch = None  # imported in main() so --help and the helpers work without it

# The plan flags (at most one; none: full_plan): option dest -> (plan, file-name suffix).
PLANS = {"quick": (quick_plan, "-quick"), "prefill": (prefill_plan, "-prefill"),
         "replay_shapes": (replay_plan, "-replay-shapes"), "decode": (decode_plan, "-decode")}


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
    plan = ap.add_mutually_exclusive_group()
    plan.add_argument("--quick", action="store_true", help="a handful of shapes (< 60 s)")
    plan.add_argument("--prefill", action="store_true",
                      help="the prefill rows (pages 1 / 16 / 64, fp8, gemma, chunked; *-attention-prefill-*)")
    plan.add_argument("--replay-shapes", action="store_true",
                      help="the shapes that dominate the trace replays (written as *-attention-replay-shapes-*)")
    plan.add_argument("--decode", action="store_true",
                      help="issue 13's decode rows: standard shapes at pages 16 / 64, verify, fp8, "
                           "window 127, page 1, llama3-70b-tp8 (written as *-attention-decode-*)")
    ap.add_argument("--module-path", default=None,
                    help="folder holding the built pagedmha package (<build>/python); default: "
                         "$PAGEDMHA_BUILD_DIR/python when it exists, else PYTHONPATH")
    ap.add_argument("--filter", default=None, help="regex on case names, e.g. 'decode llama'")
    ap.add_argument("--out-dir", default=str(REPO / "bench" / "results"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--skip-ours", action="store_true", help="peers and ceilings only")
    args = ap.parse_args(argv)

    global torch
    try:
        import torch as _torch
        import torch.nn.functional  # noqa: F401  (the peers' SDPA)
        torch = _torch
    except Exception as e:  # noqa: BLE001
        log(f"bench_attention: needs PyTorch (import failed: {err_text(e)})")
        return 2
    # The parts that run on the GPU import torch themselves.
    from attention_impls import Ours, base_record, run_case
    from attention_timing import measure_ceilings
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

    make_plan, suffix = next((PLANS[k] for k in PLANS if getattr(args, k)), (full_plan, ""))
    cases = make_plan()
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
    name = f"{M.gpu_slug(gpu)}-attention{suffix}-{now:%Y%m%d}.json"
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
