#!/usr/bin/env python3
"""Reads the SASS of the Hopper attention kernels and fails when one is off its path.

For every kernel whose name matches --kernels (default: the sm_90a prefill kernel) in
the given object files or executables (cuobjdump --dump-sass), it reports:
  * HGMMA instructions (none: the kernel is not on wgmma), and how many of them wait for
    their own completion (gsb0: a batch's last; when every HGMMA carries it, ptxas has
    serialized the wgmma pipeline, e.g. for registers or a call inside it),
  * local-memory traffic (STL / LDL), split by role: the consumer warpgroups run the code
    before the producer's `USETMAXREG.DEALLOC`, the producer the code after it,
  * the highest register each role touches (against the setmaxnreg budgets).
With --build-log, it also reads the compiler output of the build that made them and
fails on ptxas warning C7517 (it injected a warpgroup.wait because registers of an
in-flight wgmma were used: that wgmma is then serialized with what follows).
Exit status 1 when any kernel has no HGMMA, serialized HGMMAs or any STL / LDL, or the
build log has a C7517; 2 when nothing matched.

  python3 scripts/sass_check.py build/cuda/src/CMakeFiles/pagedmha.dir/cuda/prefill_sm90/*.o
"""
import argparse
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_listing import demangle, matching_functions  # noqa: E402


def max_reg(lines):
    top = -1
    for l in lines:
        for r in re.findall(r"\bR(\d+)\b", l):
            top = max(top, int(r))
    return top + 1


def analyse(lines):
    split = next((i for i, l in enumerate(lines) if "USETMAXREG.DEALLOC" in l), len(lines))
    cons, prod = lines[:split], lines[split:]
    count = lambda ls, op: sum(1 for l in ls if re.search(r"\b" + op + r"\b", l))
    return {
        "hgmma": count(lines, r"HGMMA\.[\w.]+"),
        "hgmma_gsb0": sum(1 for l in lines if "HGMMA" in l and "gsb0" in l),
        "stl_ldl_consumer": count(cons, r"(STL|LDL)(\.\w+)*"),
        "stl_ldl_producer": count(prod, r"(STL|LDL)(\.\w+)*"),
        "regs_consumer": max_reg(cons),
        "regs_producer": max_reg(prod),
        "instructions": sum(1 for l in lines if re.match(r"\s*/\*[0-9a-f]{4,}\*/", l)),
    }


def short(name):
    # prefill_kernel<PrefillPolicy<D, fp8, tma[, keys per tile: 0 = the policy's default]>,
    # T, KV[, DeviceVariant<soft-cap>]>
    m = re.search(r"PrefillPolicy<(\d+), (true|false), (true|false)(?:, (\d+))?>, (\w+), (\w+)[,>]", name)
    if m:
        load = "tma" if m.group(3) == "true" else "gather"
        if m.group(4) not in (None, "0"):
            load += f" bn{m.group(4)}"
        if "DeviceVariant<true>" in name:
            load += " cap"
        t = m.group(5).strip("_").replace("nv_bfloat16", "bf16").replace("half", "fp16")
        kv = m.group(6).strip("_").replace("nv_bfloat16", "bf16").replace("half", "fp16").replace("nv_fp8_e4m3", "fp8")
        return f"prefill D={m.group(1)} {t}/{kv} {load}"
    return name[:44]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="object files or executables with sm_90a code")
    ap.add_argument("--kernels", default=r"sm90.*prefill_kernel", help="regex over mangled kernel names")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    ap.add_argument("--build-log", help="compiler output of the build (ptxas C7517 fails the check)")
    args = ap.parse_args()
    rows, bad = [], 0
    try:
        for _, _, name, lines in matching_functions(args.cuobjdump, args.files, args.kernels):
            rows.append((name, analyse(lines)))
    except RuntimeError as e:
        print(f"sass_check: {e}", file=sys.stderr)
        return 2
    if not rows:
        print("sass_check: no kernel matched", args.kernels, file=sys.stderr)
        return 2
    names = demangle([n for n, _ in rows])
    print(f"{'kernel':44} {'HGMMA':>6} {'gsb0':>5} {'STL/LDL c':>9} {'STL/LDL p':>9} {'regs c':>6} {'regs p':>6} {'instr':>6}  verdict")
    for (name, a), pretty in zip(rows, names):
        serial = a["hgmma"] > 0 and a["hgmma_gsb0"] == a["hgmma"]
        ok = a["hgmma"] > 0 and not serial and a["stl_ldl_consumer"] == 0 and a["stl_ldl_producer"] == 0
        bad += not ok
        print(f"{short(pretty):44} {a['hgmma']:6} {a['hgmma_gsb0']:5} {a['stl_ldl_consumer']:9} {a['stl_ldl_producer']:9} "
              f"{a['regs_consumer']:6} {a['regs_producer']:6} {a['instructions']:6}  {'ok' if ok else 'FAIL'}")
    injected = 0
    if args.build_log:
        with open(args.build_log, errors="replace") as f:
            injected = sum(1 for line in f if "C7517" in line)
        if injected:
            print(f"sass_check: ptxas injected {injected} warpgroup.wait (C7517) in {args.build_log}")
    print(f"sass_check: {len(rows) - bad} of {len(rows)} kernels ok" + (", C7517 in the build log" if injected else ""))
    return 1 if bad or injected else 0


if __name__ == "__main__":
    sys.exit(main())
