"""Tests of bench/ncu_sass_summary.py (an Nsight Compute SASS export summarised) on a
hand-written export: the loop found as the largest group sharing one execution count,
its cycles per step from the issued share of its samples."""

import csv
import gzip

import pytest

from script_module import REPO, load_script

NS = load_script("ncu_sass_summary", REPO / "bench" / "ncu_sass_summary.py")

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
          "stall_selected", "stall_wait", "stall_long_sb", "stall_wait (Not Issued)"]


def export(tmp_path, rows):
    path = tmp_path / "k-sass.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "k"])
        w.writerow(HEADER)
        for n, (src, ex, sel, wait, lsb) in enumerate(rows):
            w.writerow([hex(0x1000 + 16 * n), src, sel + wait + lsb, ex, sel, wait, lsb, 99])
    return path


def test_loop_and_cycles(tmp_path, capsys):
    # 100 loop instructions run 50 times (each 1 issued sample, 3 waiting); a producer
    # of 4 instructions run 10 times; one predicated branch.
    rows = [(f"FFMA R{i}, R1, R2, R3", 50, 1, 3, 0) for i in range(99)]
    rows.append(("@!P0 BRA 0x1000", 50, 1, 0, 4))
    rows += [("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R6", 10, 0, 0, 9)] * 4
    NS.summarize(str(export(tmp_path, rows)))
    out = capsys.readouterr().out
    assert "5.0 M" not in out and "0.0 M warp instructions" in out  # 5,040 instructions
    assert "by opcode (M): FFMA 0.0 BRA 0.0 SYNCS 0.0" in out
    assert "50 x   100 instructions" in out and "10 x     4 instructions" in out
    # 100 issued samples of 401 in the loop: 100 / (100 / 401) = 401 cycles; 297 of them wait.
    assert "loop (50 executions): 100 instructions, ~401 cycles per step per warp" in out
    assert "wait 297 selected 100 long_sb 4" in out  # the Not-Issued column is not counted


def test_opcode_of_predicated_and_empty():
    assert NS.opcode("@!P0  BRA 0x7f00") == "BRA"
    assert NS.opcode("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], RZ") == "HGMMA"
    assert NS.opcode("") == "?"


def test_gzipped_export_through_main(tmp_path, capsys):
    rows = [(f"FADD R{i}, R1, R2", 7, 1, 1, 0) for i in range(100)]
    plain = export(tmp_path, rows)
    packed = tmp_path / "k-sass.csv.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert NS.main([str(packed)]) == 0
    assert "loop (7 executions): 100 instructions, ~200 cycles per step per warp" in capsys.readouterr().out


def test_not_an_export_is_named(tmp_path):
    bad = tmp_path / "k-sass.csv"
    bad.write_text("==ERROR== Failed to profile\n")
    with pytest.raises(SystemExit, match=r"expected ncu's SASS export .*Failed to profile"):
        NS.main([str(bad)])
