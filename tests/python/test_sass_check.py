"""Tests of scripts/sass_check.py (the SASS gate of the Hopper kernels) on hand-written
cuobjdump listings, through a stand-in cuobjdump: no GPU, no CUDA toolkit."""

from script_module import REPO, load_script, run_with_listing

SCRIPT = REPO / "scripts" / "sass_check.py"

SC = load_script("sass_check", SCRIPT)

KERNEL = "_ZN8pagedmha4cuda4sm9014prefill_kernelINS1_13PrefillPolicyILi64ELb0ELb1EEE13__nv_bfloat16S5_EEvNS1_10Sm90ParamsE"


def listing(body):
    """A cuobjdump --dump-sass listing of KERNEL with the given instruction lines."""
    lines = [f"        /*{16 * i:04x}*/                   {ins} ;" for i, ins in enumerate(body)]
    return "\n\tcode for sm_90a\n\t\tFunction : " + KERNEL + "\n" + "\n".join(lines) + "\n"


def run(tmp_path, body, *extra):
    rc, out, _ = run_with_listing(tmp_path, SCRIPT, listing(body), *extra)
    return rc, out


PIPELINED = [
    "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xa0",
    "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], RZ, !UPT",
    "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], R24",
    "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], R24, gsb0",
    "FMUL R30, R24, R25",
    "USETMAXREG.DEALLOC.CTAPOOL 0x18",
    "IADD3 R2, R3, R4, RZ",
    "EXIT",
]


def test_pipelined_kernel_passes(tmp_path):
    rc, out = run(tmp_path, PIPELINED)
    assert rc == 0, out
    assert "1 of 1 kernels ok" in out
    # 3 HGMMA, one of them waiting; consumer registers up to R30, producer up to R4.
    row = next(l for l in out.splitlines() if l.rstrip().endswith("ok") and "sass_check" not in l)
    assert row.split()[-8:-1] == ["3", "1", "0", "0", "31", "5", "8"]


def test_injected_wgmma_wait_in_build_log_fails(tmp_path):
    # SASS that passes, but ptxas said it injected a warpgroup.wait (C7517).
    log = tmp_path / "build.log"
    log.write_text("[3/9] Building CUDA object prefill_sm90_hd128.cu.o\n"
                   "ptxas info    : (C7517) warpgroup.wait is injected in around line 4051 by compiler to allow "
                   "use of registers defined by GMMA in function 'prefill_kernel'\n")
    rc, out = run(tmp_path, PIPELINED, "--build-log", str(log))
    assert rc == 1, out
    assert "injected 1 warpgroup.wait (C7517)" in out
    # The same SASS with a clean log passes.
    log.write_text("[3/9] Building CUDA object prefill_sm90_hd128.cu.o\nptxas info    : Used 168 registers\n")
    rc, out = run(tmp_path, PIPELINED, "--build-log", str(log))
    assert rc == 0, out


def test_serialized_wgmma_fails(tmp_path):
    # ptxas serializing the pipeline: every HGMMA waits for itself.
    body = [l if "HGMMA" not in l or "gsb0" in l else l + ", gsb0" for l in PIPELINED]
    rc, out = run(tmp_path, body)
    assert rc == 1, out
    assert "FAIL" in out and "0 of 1 kernels ok" in out


def test_local_memory_fails_by_role(tmp_path):
    body = PIPELINED[:4] + ["STL [R1], R7"] + PIPELINED[4:]
    rc, out = run(tmp_path, body)
    assert rc == 1 and "FAIL" in out
    a = SC.analyse([f"/*0000*/ {l} ;" for l in body])
    assert (a["stl_ldl_consumer"], a["stl_ldl_producer"]) == (1, 0)
    b = SC.analyse([f"/*0000*/ {l} ;" for l in PIPELINED[:6] + ["LDL R2, [R1]"] + PIPELINED[6:]])
    assert (b["stl_ldl_consumer"], b["stl_ldl_producer"]) == (0, 1)


def test_no_hgmma_fails(tmp_path):
    rc, out = run(tmp_path, [l for l in PIPELINED if "HGMMA" not in l])
    assert rc == 1 and "FAIL" in out


def test_short_names_read_the_policy():
    # As c++filt prints the kernels (cuobjdump, nvcc 13.0): the policy's tile-size argument
    # (0: its default) and the variant's soft-cap flag.
    ns = "pagedmha::cuda::sm90::"
    name = lambda pol, t, kv, cap: (f"void {ns}prefill_kernel<{ns}PrefillPolicy<{pol}>, {t}, {kv}, "
                                    f"{ns}DeviceVariant<{cap}> >({ns}Sm90Params)")
    assert SC.short(name("128, false, true, 0", "__nv_bfloat16", "__nv_bfloat16", "false")) == \
        "prefill D=128 bf16/bf16 tma"
    assert SC.short(name("128, true, false, 0", "__half", "__nv_fp8_e4m3", "true")) == \
        "prefill D=128 fp16/fp8 gather cap"
    assert SC.short(name("256, false, true, 64", "__half", "__half", "false")) == "prefill D=256 fp16/fp16 tma bn64"
    # Names without the later arguments (older builds) still read.
    assert SC.short(f"void {ns}prefill_kernel<{ns}PrefillPolicy<64, false, true>, __nv_bfloat16, "
                    f"__nv_bfloat16>({ns}Sm90Params)") == "prefill D=64 bf16/bf16 tma"
