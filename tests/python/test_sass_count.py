"""Tests of scripts/sass_count.py (instructions of the decode kernels' key-tile loop per
phase) on hand-written cuobjdump listings: no GPU, no CUDA toolkit."""

import json
import shutil

from script_module import REPO, assemble, load_script, run_with_listing

import pytest

SCRIPT = REPO / "scripts" / "sass_count.py"

SC = load_script("sass_count", SCRIPT)
from sass_listing import instructions  # noqa: E402  (on sys.path through sass_count)

# decode_kernel<AttentionTraits<128, __nv_bfloat16, __nv_bfloat16, 1, 1, 0, false>>: KW 16, BN 64.
KERNEL = "_ZN8pagedmha4cuda13decode_kernelINS0_15AttentionTraitsILi128E13__nv_bfloat16S3_Li1ELi1ELi0ELb0EEEEEvNS0_13AttentionArgsE"


def listing(sections):
    """A --dump-sass listing: sections of (arch, kernel name, instruction lines)."""
    out = []
    for arch, name, body in sections:
        out += ["", f"\tcode for {arch}", f"\t\tFunction : {name}", "\t.headerflags\t@\"EF_CUDA_SM90\""]
        out += assemble(body)
    return "\n".join(out) + "\n"


def run(tmp_path, sections, *extra):
    rc, out, err = run_with_listing(tmp_path, SCRIPT, listing(sections), *extra)
    return rc, out + err


# A persistent work-item loop around a prologue copy, a key-tile loop (with a page walk
# nested in it and an early back-edge) and an epilogue loop with HMMA but no copy.
TILE_BODY = [
    "tile: LDG.E.CONSTANT R8, desc[UR4][R10.64]",
    "walk: IADD3 R5, R5, -R6, RZ",
    "ISETP.GE.AND P0, PT, R5, R6, PT",
    "@P0 BRA walk",
    "LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64]",
    "@P4 BRA tile",
    "HMMA.16816.F32.BF16 R12, R40, R26, R12",
    "MUFU.EX2 R12, R12",
    "HMMA.16816.F32.BF16 R0, R48, R44, R0",
    "@P1 BRA tile",
]
KERNEL_BODY = [
    "S2R R0, SR_TID.X",
    "item: BAR.SYNC.DEFER_BLOCKING 0x0",
    "LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64]",
    *TILE_BODY,
    "epi: HMMA.16816.F32.BF16 R12, R40, R26, R12",
    "@P2 BRA epi",
    "@P3 BRA item",
    "EXIT",
    "self: BRA self",
]


def test_key_tile_loop_is_the_innermost_with_hmma_and_ldgsts():
    ins = instructions(assemble(KERNEL_BODY))
    start, end = SC.key_tile_loop(ins)
    # From the tile label to its last back-edge: the page walk inside, the item loop around.
    assert (ins[start].addr, ins[end].addr) == (16 * 3, 16 * (3 + len(TILE_BODY) - 1))
    assert end - start + 1 == len(TILE_BODY)


def test_no_key_tile_loop_without_ldgsts_or_hmma(tmp_path):
    no_copy = [l.replace("LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64]", "NOP") for l in KERNEL_BODY]
    assert SC.key_tile_loop(instructions(assemble(no_copy))) is None
    no_mma = [l.replace("HMMA.16816.F32.BF16", "FFMA") for l in KERNEL_BODY]
    assert SC.key_tile_loop(instructions(assemble(no_mma))) is None
    rc, out = run(tmp_path, [("sm_90a", KERNEL, no_copy)])
    assert rc == 1 and "no key-tile loop" in out, out


def test_key_tile_loop_of_a_tma_stream():
    # The Hopper decode's warps issue their next tile's TMA boxes inside the tile loop:
    # UTMALDG stands for LDGSTS.
    tma = [l.replace("LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64]", "UTMALDG.4D [UR8], [UR16]") for l in KERNEL_BODY]
    ins = instructions(assemble(tma))
    start, end = SC.key_tile_loop(ins)
    assert end - start + 1 == len(TILE_BODY)
    assert SC.classify(ins[start:end + 1]).count("loader") == 4  # LDG, the walk's IADD3 / ISETP, UTMALDG


# (instruction, its phase under the documented rules)
PHASED = [
    ("BAR.SYNC.DEFER_BLOCKING 0x0", "sync"),
    ("LDGSTS.E.BYPASS.128 [R3+0x100], desc[UR4][R4.64]", "loader"),
    ("LDGDEPBAR", "loader"),
    ("LDG.E.CONSTANT R8, desc[UR4][R10.64]", "loader"),
    ("ULDC.64 UR6, c[0x0][0x2f0]", "loader"),
    ("IMAD.WIDE.U32 R4, R8, UR6, R4", "loader"),
    ("ISETP.GE.AND P0, PT, R9, R12, PT", "loader"),
    ("UIADD3 UR5, UR5, 0x1, URZ", "loader"),
    ("LDSM.16.M88.4 R20, [R30]", "qk"),
    ("LDS.64 R40, [R31]", "qk"),
    ("PRMT R24, R20, 0x1404, RZ", "convert"),
    ("SHF.R.U32.HI R25, RZ, 0x4, R24", "convert"),        # reads R24, converted from R20
    ("LOP3.LUT R26, R25, 0x7f007f0, RZ, 0xc0, !PT", "convert"),
    ("LOP3.LUT R27, R9, 0xff, RZ, 0xc0, !PT", "loader"),  # R9 is no fragment
    ("HMUL2.BF16_V2 R26, R26, R28", "convert"),
    ("F2FP.F16.E4M3.UNPACK_B R29, R23", "convert"),
    ("HMMA.16816.F32.BF16 R12, R40, R26, R12", "qk"),
    ("LDS R33, [R32]", "softmax"),
    ("FMNMX R34, R12, R13, !PT", "softmax"),
    ("SHFL.BFLY PT, R35, R34, 0x1, 0x1f", "softmax"),
    ("FFMA R12, R12, R36, -R34", "softmax"),
    ("MUFU.EX2 R12, R12", "softmax"),
    ("LDSM.16.MT88.4 R44, [R30+0x2000]", "pv"),
    ("F2FP.BF16.F32.PACK_AB R48, R13, R12", "softmax"),
    ("MOVM.16.MT88 R48, R48", "pv"),                       # P^T by transpose (operand swap)
    ("HMMA.16816.F32.BF16 R0, R48, R44, R0", "pv"),
    ("LDS.64 R42, [R31+0x10]", "pv"),
    ("IMAD.MOV.U32 R50, RZ, RZ, R9", "other"),
    ("CS2R R52, SRZ", "other"),
    ("MOV R21, R9", "other"),                              # R21 (an LDSM fragment) overwritten
    ("IADD3 R51, R21, 0x1, RZ", "loader"),                 # so no longer derived
    ("MOV R53, R22", "convert"),                           # R22: the same LDSM's third register
    ("DEPBAR.LE SB0, 0x1", "sync"),
    ("@P1 BRA 0x0", "sync"),
]


def test_phase_classification():
    ins = instructions(assemble([l for l, _ in PHASED]))
    assert len(ins) == len(PHASED)
    assert list(zip([l for l, _ in PHASED], SC.classify(ins))) == PHASED


def test_hmma_split_at_the_first_ex2():
    body = ["HMMA.16816.F32.BF16 R12, R40, R26, R12", "MUFU.EX2 R12, R12", "MUFU.EX2 R13, R13",
            "HMMA.16816.F32.BF16 R0, R48, R44, R0", "MUFU.EX2 R14, R14", "HMMA.16816.F32.BF16 R4, R48, R44, R4"]
    assert SC.classify(instructions(assemble(body))) == ["qk", "softmax", "softmax", "pv", "softmax", "pv"]


def test_traits_and_keys_per_tile():
    t = SC.traits("void pagedmha::cuda::decode_kernel<pagedmha::cuda::AttentionTraits<128, __nv_bfloat16, "
                  "__nv_bfloat16, 1, 1, 0, false> >(pagedmha::cuda::AttentionArgs)")
    assert t == {"D": 128, "T": "bf16", "KV": "bf16", "WM": 1, "MT": 1, "KW": 16, "BN": 64}
    # KW given: 32 keys per warp, 4 warps on the keys.
    t = SC.traits("decode_kernel<pagedmha::cuda::AttentionTraits<64, __half, __nv_fp8_e4m3, 1, 1, 32, false> >")
    assert (t["T"], t["KV"], t["KW"], t["BN"]) == ("fp16", "fp8", 32, 128)
    # One warp on the keys: KW 64, or 32 at D = 256 or with two row tiles.
    assert SC.traits("AttentionTraits<128, __half, __half, 4, 1, 0, false>")["BN"] == 64
    assert SC.traits("AttentionTraits<256, __half, __half, 4, 1, 0, false>")["BN"] == 32
    assert SC.traits("AttentionTraits<128, __half, __half, 4, 2, 0, false>")["BN"] == 32
    # Two warps on the keys (defaults omitted): 16 keys each.
    t = SC.traits("AttentionTraits<128, __half, __half, 2>")
    assert (t["KW"], t["BN"]) == (16, 32)
    assert SC.traits("void other_kernel<64>()") is None
    # The Hopper decode: one warp's tile, KW from decode_sm90/policy.h's defaults.
    t = SC.traits("void pagedmha::cuda::sm90::decode_sm90_kernel<128, __nv_bfloat16>(pagedmha::cuda::sm90::"
                  "DecodeSm90Params)")
    assert t == {"D": 128, "T": "bf16", "KV": "bf16", "WM": 1, "MT": 1, "KW": 16, "BN": 16, "rows": 16,
                 "heads": 1}
    assert SC.traits("decode_sm90_kernel<64, __half>")["KW"] == 32
    # The row tile: 16 rows, or 8 (operand-swapped).
    t = SC.traits("decode_sm90_kernel<64, __nv_bfloat16, __nv_fp8_e4m3, 8>")
    assert (t["KV"], t["KW"], t["rows"]) == ("fp8", 64, 8)
    assert SC.traits("decode_sm90_kernel<64, __half, __nv_fp8_e4m3, 16>")["KW"] == 32
    assert SC.traits("decode_sm90_kernel<128, __half, __half, 16>")["rows"] == 16
    # Two KV heads per work item (fp8 D = 64): 32 keys of both heads' 128-byte rows.
    t = SC.traits("decode_sm90_kernel<64, __half, __nv_fp8_e4m3, 8, 2>")
    assert (t["KW"], t["rows"], t["heads"]) == (32, "8x2", 2)
    assert SC.traits("decode_sm90_kernel<64, __half, __nv_fp8_e4m3, 8, 1>")["KW"] == 64
    assert SC.traits("decode_sm90_kernel<64, __half, __half, 8, 2>")["KW"] == 16


def test_per_key_normalisation():
    body = [l for l, _ in PHASED[:-1]] + ["@P1 BRA top"]
    body[0] = "top: " + body[0]
    demangled = ("void pagedmha::cuda::decode_kernel<pagedmha::cuda::AttentionTraits<128, __half, __nv_fp8_e4m3, "
                 "1, 1, 32, false> >(pagedmha::cuda::AttentionArgs)")
    row = SC.report("k", demangled, instructions(assemble(body)))
    assert row["instance"] == "decode D=128 fp16/fp8 WM=1"
    assert row["instructions"] == len(PHASED)
    assert row["per_key"] == round(len(PHASED) / 32, 2)  # per warp: KW = 32 keys per tile
    assert row["phases"]["qk"] == 3 and row["per_key_phases"]["qk"] == round(3 / 32, 2)
    # Two KV heads per item: per key and head.
    row = SC.report("k", "void pagedmha::cuda::sm90::decode_sm90_kernel<64, __half, __nv_fp8_e4m3, 8, 2>"
                         "(pagedmha::cuda::sm90::DecodeSm90Params)", instructions(assemble(body)))
    assert row["per_key"] == round(len(PHASED) / 64, 2)
    assert sum(row["phases"].values()) == len(PHASED)


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="c++filt (binutils) absent")
def test_report_table_and_json(tmp_path):
    # The same kernel for sm_80 (a shorter loop) and sm_90a: only the sm_90a code is read.
    sm80 = [l for l in KERNEL_BODY if "walk" not in l and "ISETP" not in l]
    out_json = tmp_path / "counts.json"
    rc, out = run(tmp_path, [("sm_80", KERNEL, sm80), ("sm_90a", KERNEL, KERNEL_BODY)], "--json", str(out_json))
    assert rc == 0, out
    row = next(l for l in out.splitlines() if l.startswith("decode D=128"))
    n = len(TILE_BODY)
    # instance, BN, KW, loop count, 7 phases, per key (count / KW = 16)
    assert row.split()[:7] == ["decode", "D=128", "bf16/bf16", "WM=1", "64", "16", str(n)]
    assert float(row.split()[-1]) == round(n / 16, 2)
    data = json.loads(out_json.read_text())
    (k,) = data["kernels"]
    assert k["arch"] == "sm_90a" and k["instructions"] == n and k["traits"]["BN"] == 64
    # LDG + the walk's IADD3 / ISETP + LDGSTS: loader; the branches: sync
    assert k["phases"] == {"loader": 4, "qk": 1, "softmax": 1, "pv": 1, "convert": 0, "sync": 3, "other": 0}
    rc, out = run(tmp_path, [("sm_80", KERNEL, sm80)])
    assert rc == 2 and "no kernel matched" in out
