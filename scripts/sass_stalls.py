#!/usr/bin/env python3
"""Issue cycles of the Hopper attention kernels' KV-step loop along its common path, from
the stall counts ptxas encodes in each instruction: a CPU-only estimate for comparing
variants (or another kernel, e.g. FlashAttention-3's, built the same way) before
spending device time on them. A report, not a check, and not a prediction of time:

- the stall counts cover fixed-latency dependences and pipe throughput (the MUFU's eight
  cycles per warp instruction, for one); results of variable latency (shared and global
  loads, MUFU, SHFL, wgmma, barriers) wait on scoreboards, which cost nothing here;
- one warp alone: the other warps of its SM sub-partition, which share its issue slot and
  MUFU, are not modelled.

KV-step loop: the smallest range from a backward branch's target to the branch holding
both wgmma forms (each back-edge on its own: a barrier's retry block after the function's
end branches back into the loop too), S = Q K^T (HGMMA with A from shared memory) and O += P V
(A from registers). Common path: from the loop's head, unconditional branches are
followed; a conditional branch forward inside the loop is taken when the instruction
before its target is not an unconditional branch (it skips a block that falls through
to the target: a rescale, a mask, a clamp laid out inline), and not taken otherwise (it
jumps to an out-of-line block that branches back) or when its target lies outside the
loop (a barrier's retry loop); the walk ends at the back-edge.

  python3 scripts/sass_stalls.py build/.../prefill_sm90_hd128.cu.o [--kernels REGEX] [--path]

Prints per kernel: the loop's address range, the path's instruction count and stall
cycles, and the opcodes with the most cycles (count / cycles). --path lists the path.
Exit status 0; 1 when a matching kernel has no such loop; 2 when nothing matched or
cuobjdump failed.
"""
import argparse
import collections
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_listing import back_edges, branch_target, demangle, instructions, matching_functions  # noqa: E402


def _is_rs(ins):
    """An HGMMA whose A operand is a register (P V with P from registers)."""
    ops = [o.strip() for o in ins.operands.split(",")]
    return len(ops) > 1 and ops[1].startswith("R")


def kv_step_loop(ins):
    """(start, end) indices (inclusive) of the KV-step loop, or None (see the module doc)."""
    best = None
    for s, e in back_edges(ins):
        hg = [y for y in ins[s:e + 1] if y.base == "HGMMA"]
        if any(_is_rs(y) for y in hg) and any(not _is_rs(y) for y in hg) and (best is None or e - s < best[1] - best[0]):
            best = (s, e)
    return best


def common_path(ins, start, end):
    """The Instructions the loop's common path issues, in order (see the module doc)."""
    index = {x.addr: i for i, x in enumerate(ins)}
    lo, hi = ins[start].addr, ins[end].addr
    path, i = [], start
    for _ in range(4 * (end - start + 1)):  # a cycle in the walk would be a misread layout
        x = ins[i]
        path.append(x)
        if i == end:
            return path
        t = branch_target(x)
        if t is not None and t in index:
            if not x.pred:
                i = index[t]
                continue
            if lo <= t <= hi and t > x.addr and index[t] > 0:
                before = ins[index[t] - 1]
                if not (before.base == "BRA" and not before.pred):
                    i = index[t]
                    continue
        i += 1
    raise ValueError("the walk did not reach the loop's back-edge")


def report(path):
    """(instructions, cycles, Counter of count by opcode, Counter of cycles by opcode)."""
    count, cycles = collections.Counter(), collections.Counter()
    for x in path:
        count[x.base] += 1
        cycles[x.base] += x.stall
    return len(path), sum(cycles.values()), count, cycles


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="object files or executables with sm_90a code")
    ap.add_argument("--kernels", default=r"prefill_kernel", help="regex over mangled kernel names")
    ap.add_argument("--arch", default="sm_90a", help="the code to read ('all': every arch)")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    ap.add_argument("--path", action="store_true", help="list the common path with each stall")
    ap.add_argument("--top", type=int, default=8, help="opcodes listed per kernel")
    args = ap.parse_args()
    try:
        found = [(name, instructions(lines)) for _, _, name, lines in
                 matching_functions(args.cuobjdump, args.files, args.kernels, args.arch)]
    except RuntimeError as e:
        print(f"sass_stalls: {e}", file=sys.stderr)
        return 2
    if not found:
        print("sass_stalls: no kernel matched", args.kernels, file=sys.stderr)
        return 2
    missing = 0
    for (name, ins), pretty in zip(found, demangle([n for n, _ in found])):
        loop = kv_step_loop(ins)
        if loop is None:
            print(f"{pretty[:160]}\n  no KV-step loop (both wgmma forms in one loop)")
            missing += 1
            continue
        path = common_path(ins, *loop)
        n, cyc, count, cycles = report(path)
        print(f"{pretty[:160]}\n  loop {ins[loop[0]].addr:#x}-{ins[loop[1]].addr:#x}: {n} instructions, {cyc} stall cycles; "
              + " ".join(f"{op} {count[op]}/{c}" for op, c in cycles.most_common(args.top)))
        if args.path:
            for x in path:
                print(f"    {x.addr:06x} {x.stall:2d}  {x.pred + ' ' if x.pred else ''}{x.op} {x.operands}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
