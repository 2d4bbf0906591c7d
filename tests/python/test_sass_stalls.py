"""Tests of scripts/sass_stalls.py (issue cycles of the Hopper kernels' KV-step loop along
its common path) on hand-written cuobjdump listings with hand-set control bits: no GPU,
no CUDA toolkit."""

import re

from script_module import REPO, assemble, load_script, run_with_listing

SCRIPT = REPO / "scripts" / "sass_stalls.py"

SS = load_script("sass_stalls", SCRIPT)
from sass_listing import instructions  # noqa: E402  (on sys.path through sass_stalls)

KERNEL = "_ZN8pagedmha4cuda4sm9014prefill_kernelINS1_13PrefillPolicyILi128ELb0ELb1EEEEEvv"


def listing(body, name=KERNEL):
    return "\n".join(["", "\tcode for sm_90a", f"\t\tFunction : {name}", "\t.headerflags\t@\"EF_CUDA_SM90\"",
                      *assemble(body)]) + "\n"


# An item loop around: a barrier wait whose retry lies outside the loop, S = Q K^T (SS),
# an inline rescale skipped by a vote, P V (RS), a mask skipped on interior tiles, a
# clamp laid out out of line (branched to, branching back), the step's back-edge; then an
# epilogue loop with only the RS form.
BODY = [
    "S2R R0, SR_TID.X",
    "item: SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR4], RZ",
    "step: SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR5], R6 | 2",
    "@!P0 BRA retry",
    "VOTE.ANY P1, P1 | 3",
    "@!P1 BRA issue",
    "FMUL R88, R88, R2 | 1",
    "FMUL R89, R89, R2 | 1",
    "issue: HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], RZ, !UPT | 4",
    "HGMMA.64x128x16.F32.BF16 R88, R172, gdesc[UR16].tnspB, R88 | 5",
    "@!P2 BRA body",
    "FSEL R24, R24, -INF, P3 | 2",
    "body: FMNMX R0, R24, R25, !PT | 6",
    "@P4 BRA clamp",
    "MUFU.EX2 R24, R24 | 8",
    "join: F2FP.BF16.F32.PACK_AB R172, R25, R24 | 7",
    "@P5 BRA step | 3",
    "HGMMA.64x128x16.F32.BF16 R88, R172, gdesc[UR16].tnspB, R88",
    "@P6 BRA item",
    "EXIT",
    "clamp: FMNMX R24, RZ, R24, PT | 9",
    "MUFU.EX2 R24, R24 | 9",
    "BRA join | 9",
    "retry: SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR5], R6",
    "@!P0 BRA retry",
    "BRA step",
]


def test_stall_bits_decoded_from_the_upper_word():
    ins = instructions(assemble(["FMUL R1, R1, R2 | 11", "MUFU.EX2 R1, R1 | 0", "EXIT | 15"]))
    assert [x.stall for x in ins] == [11, 0, 15]
    assert ins[0].ctrl == 11 << 41 | 1 << 45 | 5 << 49


def test_listing_without_encodings_counts_zero():
    ins = instructions([" /*0000*/ FMUL R1, R1, R2 ;", " /*0010*/ EXIT ;"])
    assert [x.stall for x in ins] == [0, 0]


def test_loop_is_the_innermost_with_both_wgmma_forms():
    ins = instructions(assemble(BODY))
    start, end = SS.kv_step_loop(ins)
    # From `step` to its back-edge: not the item loop around it, which holds it too.
    assert ins[start].addr == 16 * 2 and ins[end].op == "BRA" and ins[end].addr == 16 * 16


def test_loop_needs_both_forms():
    ins = instructions(assemble(["top: HGMMA.64x128x16.F32.BF16 R88, R172, gdesc[UR16].tnspB, R88", "@P0 BRA top"]))
    assert SS.kv_step_loop(ins) is None


def test_common_path_skips_inline_blocks_and_leaves_out_of_line_ones():
    ins = instructions(assemble(BODY))
    path = SS.common_path(ins, *SS.kv_step_loop(ins))
    ops = [x.op for x in path]
    # The retry (outside the loop) and the clamp (out of line) are not taken; the rescale
    # and the mask (inline) are skipped.
    assert ops == ["SYNCS.PHASECHK.TRANS64.TRYWAIT", "BRA", "VOTE.ANY", "BRA", "HGMMA.64x128x16.F32.BF16",
                   "HGMMA.64x128x16.F32.BF16", "BRA", "FMNMX", "BRA", "MUFU.EX2", "F2FP.BF16.F32.PACK_AB", "BRA"]
    n, cycles, count, by_op = SS.report(path)
    # 2 + 1 + 3 + 1 + 4 + 5 + 1 + 6 + 1 + 8 + 7 + 3 (unmarked instructions stall 1).
    assert (n, cycles) == (12, 42)
    assert count["HGMMA"] == 2 and by_op["HGMMA"] == 9 and by_op["BRA"] == 7


def test_report_and_exit_status(tmp_path):
    rc, out, err = run_with_listing(tmp_path, SCRIPT, listing(BODY), "--path")
    assert rc == 0, err
    assert "12 instructions, 42 stall cycles" in out
    assert "MUFU 1/8" in out and "F2FP 1/7" in out
    assert re.search(r"^\s+0000e0\s+8\s+MUFU\.EX2 R24, R24$", out, re.M)


def test_no_loop_and_no_match(tmp_path):
    rc, out, _ = run_with_listing(tmp_path, SCRIPT, listing(["EXIT"]))
    assert rc == 1 and "no KV-step loop" in out
    rc, _, err = run_with_listing(tmp_path, SCRIPT, listing(["EXIT"]), "--kernels", "nothing_like_this")
    assert rc == 2 and "no kernel matched" in err
