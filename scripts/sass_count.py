#!/usr/bin/env python3
"""Counts the SASS instructions of the attention kernels' key-tile loop, by phase.

A report for before / after comparisons (docs/perf-notes/decode.md), not a check: the rules below
are simple and deterministic, not an exact attribution of every instruction.

For every kernel whose mangled name matches --kernels (default: the decode kernels, the
portable decode_kernel and the Hopper decode_sm90_kernel) in
the code for --arch (default sm_90a) of the given object files or executables
(cuobjdump --dump-sass), it finds the key-tile loop and classifies its instructions.

Key-tile loop: each backward branch (target <= its own address) closes a loop [target,
branch] (back-edges to one target: the last one). The key-tile loop is the innermost loop
that holds an HMMA and an LDGSTS, UTMALDG or SYNCS (the portable decode's cp.async
loads; the Hopper decode's consumers wait on the ring's stage barriers; the persistent
work-item loop around it holds them too, so the largest would be the wrong one). Counts
are static: each instruction of the
address range once, both sides of its branches (soft cap, boundary-tile mask) and inner
loops (the page walk) included, not what one tile executes.

Phases, the first rule that matches wins:
  sync     barriers and control: BAR, DEPBAR, SYNCS, BRA, BSSY, BSYNC, WARPSYNC, VOTE, ...
  loader   copies and their addressing data: LDGSTS, LDGDEPBAR, LDG (page ids), UTMALDG,
           UBLKCP, LDC / ULDC (strides, page size: the softmax's few scalars ride along)
  qk, pv   HMMA, LDSM, MOVM (the operand-swapped decode's P^T transposes) and wide LDS
           (.64 / .128: fragments): before the loop's first MUFU.EX2 (in address order)
           QK, after it PV
  convert  the fp8 conversion: PRMT, half-precision ops (HADD2, HMUL2, HFMA2), F2FP from
           fp8 (E4M3 / E5M2), and any integer or move instruction that reads a register
           derived from an LDSM fragment (tracked in address order through the convert
           instructions: the bit moves of the bf16 conversion)
  softmax  MUFU, fp32 ops (FMUL, FFMA, FADD, FMNMX, FSEL, FSETP, FRND, ...), SHFL, the
           other F2FP (packing P), 32-bit LDS (the boundary mask's row bounds)
  loader   the remaining integer and address instructions (IMAD, IADD3, LEA, SHF, LOP3,
           ISETP, SEL, their uniform U* forms, the division's I2F / F2I but not its
           MUFU.RCP): the loader's integer work is interleaved with the mask's and the
           loop counter's, so this is an upper bound of the loader
  other    moves (MOV, IMAD.MOV, CS2R, S2R, P2R, ...), NOP and anything else

Per kernel: the template instance read from the demangled AttentionTraits<D, T, KV, WM,
MT, KW, ...> (c++filt), keys per tile BN = KW * (4 / WM) with KW's default as in
attention_mainloop.cuh, the loop's count, the count per phase, and instructions per key:
each warp runs the loop body once per tile for its KW keys, so count / KW per warp. For
decode_sm90_kernel<D, T, KV, rows, heads> KW (and BN, a warp's tile) comes from SM90_KW
below (the defaults of decode_sm90/policy.h), WM is reported as 1 and the row tile (16,
or 8 for the operand-swapped tile) as rows, times the KV heads of a work item when two
(D = 64: rows=8x2, 16 keys per warp for 16-bit caches; the instructions per key are then
per key and head).

  python3 scripts/sass_count.py build/cuda/src/CMakeFiles/pagedmha.dir/cuda/decode/*.o --json counts.json

Exit status 0; 1 when a kernel has no key-tile loop (the rules no longer fit the code);
2 when nothing matched, cuobjdump failed or the JSON could not be written.
"""
import argparse
import json
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_listing import back_edges, demangle, instructions, matching_functions  # noqa: E402

PHASES = ("loader", "qk", "softmax", "pv", "convert", "sync", "other")

SYNC = {"BAR", "DEPBAR", "SYNCS", "ARRIVES", "MEMBAR", "ERRBAR", "BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT",
        "BSSY", "BSYNC", "BREAK", "WARPSYNC", "VOTE", "VOTEU", "YIELD", "NANOSLEEP"}
LOADER_MEM = {"LDGSTS", "LDGDEPBAR", "LDG", "UTMALDG", "UTMAPF", "UBLKCP", "LDC", "ULDC"}
CONVERT = {"PRMT", "HADD2", "HMUL2", "HFMA2"}
SOFTMAX = {"MUFU", "FMUL", "FFMA", "FADD", "FMNMX", "FSEL", "FSETP", "FRND", "FCHK", "FSWZADD", "SHFL", "F2F", "F2FP"}
INTEGER = {"IMAD", "IADD3", "IADD", "VIADD", "IMUL", "LEA", "SHF", "SHL", "SHR", "LOP3", "LOP", "ISETP", "SEL",
           "IABS", "IMNMX", "VIMNMX", "POPC", "FLO", "BMSK", "BREV", "SGXT", "PLOP3", "I2F", "F2I", "I2I"}
MOVES = {"MOV", "MOV32I", "UMOV", "CS2R", "S2R", "S2UR", "R2UR", "P2R", "R2P"}


def _regs(text):
    return [int(r) for r in re.findall(r"\bR(\d+)\b", text)]


def _dest_and_sources(ins):
    """Registers written (first operand, an LDSM's .2 / .4 vector whole) and read."""
    parts = ins.operands.split(",", 1)
    if not re.fullmatch(r"R\d+", parts[0].strip()):
        return [], _regs(ins.operands)
    d = int(parts[0].strip()[1:])
    width = 1
    if ins.base == "LDSM":
        width = int(ins.op.rsplit(".", 1)[1]) if re.search(r"\.[124]$", ins.op) else 1
    return list(range(d, d + width)), _regs(parts[1] if len(parts) > 1 else "")


def _is_integer(ins):
    b = ins.base[1:] if ins.base.startswith("U") and ins.base[1:] in INTEGER else ins.base
    return b in INTEGER and not ins.op.startswith("IMAD.MOV")


def _is_move(ins):
    return ins.base in MOVES or ins.op.startswith("IMAD.MOV")


def classify(body):
    """The phase of each instruction of a loop body (list of Instructions, address order)."""
    first_ex2 = next((i for i, x in enumerate(body) if x.op.startswith("MUFU.EX2")), len(body))
    derived = set()  # registers holding LDSM fragments or values converted from them
    phases = []
    for i, ins in enumerate(body):
        dest, srcs = _dest_and_sources(ins)
        b = ins.base
        if b in SYNC:
            p = "sync"
        elif b in LOADER_MEM:
            p = "loader"
        elif b in ("HMMA", "LDSM", "MOVM") or (b == "LDS" and re.search(r"\.(64|128)\b", ins.op)):
            p = "qk" if i < first_ex2 else "pv"
        elif b in CONVERT or (b == "F2FP" and re.search(r"E4M3|E5M2", ins.op)):
            p = "convert"
        elif (_is_integer(ins) or _is_move(ins)) and derived.intersection(srcs):
            p = "convert"
        elif b in SOFTMAX or b == "LDS":
            p = "softmax"
        elif _is_integer(ins):
            p = "loader"
        else:
            p = "other"
        if b == "LDSM" or p == "convert":
            derived.update(dest)
        else:
            derived.difference_update(dest)
        phases.append(p)
    return phases


def key_tile_loop(ins):
    """(start, end) indices (inclusive) of the key-tile loop in a function's Instructions,
    or None: the innermost backward-branch range holding an HMMA and an LDGSTS, UTMALDG or
    SYNCS (the Hopper decode's consumer warps wait on the ring's barriers)."""
    loops = {}  # target index -> last back-edge index
    for s, e in back_edges(ins):
        loops[s] = max(loops.get(s, e), e)
    best = None
    for s, e in loops.items():
        ops = {y.base for y in ins[s:e + 1]}
        if "HMMA" in ops and ops & {"LDGSTS", "UTMALDG", "SYNCS"} and (best is None or e - s < best[1] - best[0]):
            best = (s, e)
    return best


_TYPES = {"__nv_bfloat16": "bf16", "__half": "fp16", "__nv_fp8_e4m3": "fp8", "__nv_fp8_e5m2": "fp8e5m2"}


SM90_KW = {64: 32, 128: 16}  # decode_sm90/policy.h defaults for 16-bit caches; fp8: 32, 64 at D = 64 with 8 rows of one head


def traits(demangled):
    """The instance of AttentionTraits<D, T, KV, WM, MT = 1, KW = 0, ...> in a demangled
    kernel name, with KW's default resolved and BN = KW * (4 / WM), or of
    decode_sm90_kernel<D, T, KV, rows, heads> (KW from SM90_KW, BN = KW: one warp's tile); None if absent."""
    t = lambda s: _TYPES.get(s.split("::")[-1], s.split("::")[-1])
    m = re.search(r"decode_sm90_kernel<(\d+), ([\w:]+)(?:, ([\w:]+))?(?:, (\d+))?(?:, (\d+))?>", demangled)
    if m:
        d = int(m.group(1))
        kv = t(m.group(3) or m.group(2))
        rows = int(m.group(4) or 16)
        heads = int(m.group(5) or 1)
        kw = ((64 if d == 64 and rows == 8 and heads == 1 else 32) if kv == "fp8"
              else 16 if heads == 2 else SM90_KW.get(d, 32))
        return {"D": d, "T": t(m.group(2)), "KV": kv, "WM": 1, "MT": 1, "KW": kw, "BN": kw,
                "rows": rows if heads == 1 else f"{rows}x{heads}", "heads": heads}
    m = re.search(r"AttentionTraits<(\d+), ([\w:]+), ([\w:]+), (\d+)((?:, \w+)*)>", demangled)
    if not m:
        return None
    rest = [x.strip() for x in m.group(5).split(",") if x.strip()]
    d, wm = int(m.group(1)), int(m.group(4))
    mt = int(rest[0]) if len(rest) > 0 else 1
    kw = int(rest[1]) if len(rest) > 1 else 0
    wn = 4 // wm
    if kw == 0:  # as AttentionTraits::KW
        kw = ((32 if d == 256 or mt == 2 else 64) if wn == 1 else 16)
    return {"D": d, "T": t(m.group(2)), "KV": t(m.group(3)), "WM": wm, "MT": mt, "KW": kw, "BN": kw * wn}


def short(demangled, tr):
    if tr is None:
        return demangled[:40]
    kind = re.search(r"(\w+)_kernel<", demangled)
    mt = f" MT={tr['MT']}" if tr["MT"] != 1 else ""
    mt += f" rows={tr['rows']}" if "rows" in tr else ""
    return f"{kind.group(1) if kind else 'kernel'} D={tr['D']} {tr['T']}/{tr['KV']} WM={tr['WM']}{mt}"


def report(name, demangled, ins):
    """The row of one kernel (mangled and demangled name, its Instructions); the loop's
    (Instruction, phase) pairs under "listing". No "phases" when it has no key-tile loop."""
    tr = traits(demangled)
    row = {"kernel": name, "instance": short(demangled, tr), "traits": tr}
    loop = key_tile_loop(ins)
    if loop is None:
        return row
    body = ins[loop[0]:loop[1] + 1]
    phases = classify(body)
    row.update({
        "loop": [f"{body[0].addr:#06x}", f"{body[-1].addr:#06x}"],
        "instructions": len(body),
        "phases": {p: phases.count(p) for p in PHASES},
        "listing": list(zip(body, phases)),
    })
    if tr is not None:
        keys = tr["KW"] * tr.get("heads", 1)
        row["per_key"] = round(len(body) / keys, 2)
        row["per_key_phases"] = {p: round(n / keys, 2) for p, n in row["phases"].items()}
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="object files or executables")
    ap.add_argument("--kernels", default=r"decode_(sm90_)?kernel", help="regex over mangled kernel names")
    ap.add_argument("--arch", default="sm_90a", help="the code to read (cuobjdump's `code for ARCH`), or 'all'")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    ap.add_argument("--list", action="store_true", help="also print every loop instruction with its phase")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    args = ap.parse_args()

    try:  # (file, arch, mangled name, Instructions)
        found = [(f, arch, name, instructions(lines))
                 for f, arch, name, lines in matching_functions(args.cuobjdump, args.files, args.kernels, args.arch)]
    except RuntimeError as e:
        print(f"sass_count: {e}", file=sys.stderr)
        return 2
    if not found:
        print(f"sass_count: no kernel matched {args.kernels!r} in the {args.arch} code", file=sys.stderr)
        return 2

    rows = []
    for (f, arch, name, ins), pretty in zip(found, demangle([n for _, _, n, _ in found])):
        row = {"file": f, "arch": arch, **report(name, pretty, ins)}
        listing = row.pop("listing", [])
        if args.list and listing:
            print(f"# {row['instance']} ({arch}): loop {row['loop'][0]}..{row['loop'][1]}")
            for x, p in listing:
                print(f"  {x.addr:#06x}  {p:8} {x.pred + ' ' if x.pred else ''}{x.op} {x.operands}")
        rows.append(row)
    missing = sum("phases" not in r for r in rows)
    order = lambda r: (0, r["traits"]["D"], r["traits"]["T"], r["traits"]["KV"], r["traits"]["WM"], r["kernel"]) \
        if r["traits"] else (1, 0, "", "", 0, r["kernel"])
    rows.sort(key=order)
    head = f"{'kernel':34} {'BN':>4} {'KW':>3} {'loop':>5} " + " ".join(f"{p:>7}" for p in PHASES) + f" {'per key':>8}"
    print(head)
    for r in rows:
        tr = r["traits"] or {}
        if "phases" not in r:
            print(f"{r['instance']:34} {tr.get('BN', '?'):>4} {tr.get('KW', '?'):>3}  no key-tile loop found")
            continue
        print(f"{r['instance']:34} {tr.get('BN', '?'):>4} {tr.get('KW', '?'):>3} {r['instructions']:5} "
              + " ".join(f"{r['phases'][p]:7}" for p in PHASES) + f" {r.get('per_key', '?'):>8}")
    if args.json:
        try:
            with open(args.json, "w") as out:
                json.dump({"arch": args.arch, "phases": list(PHASES), "kernels": rows}, out, indent=1)
        except OSError as e:
            print(f"sass_count: cannot write --json {args.json}: {e.strerror}", file=sys.stderr)
            return 2
    if missing:
        print(f"sass_count: {missing} kernel(s) without a key-tile loop (a backward branch around HMMA and "
              "LDGSTS)", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
