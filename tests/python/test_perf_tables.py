"""Tests of the benchmark's counting helpers (bench/metrics.py), its torch-free planning
(bench/bench_attention.py), the table generator (scripts/perf_tables.py) and the
replay plot (scripts/plot_replay.py).
Standard library + pytest (the plot tests also need matplotlib): no torch, no GPU."""

import itertools
import json
import sys
from pathlib import Path

import pytest

from script_module import REPO, load_script

M = load_script("metrics", REPO / "bench" / "metrics.py")
PT = load_script("perf_tables", REPO / "scripts" / "perf_tables.py")
BA = load_script("bench_attention", REPO / "bench" / "bench_attention.py")


# --- Counting ---------------------------------------------------------------------------

def brute_pairs(n, L, W, causal):
    count = 0
    for i in range(n):
        p = L - n + i
        for j in range(L):
            if causal and j > p:
                continue
            if W >= 0 and j < p - W:
                continue
            count += 1
    return count


@pytest.mark.parametrize("causal", [True, False])
def test_visible_pairs_matches_brute_force(causal):
    for n, L, W in itertools.product([0, 1, 2, 3, 5, 8, 13], [0, 1, 4, 7, 13],
                                     [-1, 0, 1, 2, 5, 20]):
        assert M.visible_pairs(n, L, W, causal) == brute_pairs(n, L, W, causal), (n, L, W)


def test_visible_pairs_hand_values():
    assert M.visible_pairs(4, 4) == 1 + 2 + 3 + 4
    assert M.visible_pairs(2, 5) == 4 + 5  # queries at positions 3 and 4
    assert M.visible_pairs(4, 4, window_left=1) == 1 + 2 + 2 + 2
    assert M.visible_pairs(6, 4) == 1 + 2 + 3 + 4  # two queries before the first key
    assert M.visible_pairs(3, 10, causal=False) == 30
    assert M.visible_pairs(1, 32768, window_left=127) == 128
    assert M.visible_pairs(4096, 4096) == 4096 * 4097 // 2


def test_prefill_flops_hand_values():
    # llama3-8b, 4 x 4k causal: 4 * Hq * D * pairs.
    assert M.prefill_flops([4096] * 4, [4096] * 4, 32, 128) == 4 * 32 * 128 * 4 * (4096 * 4097 // 2)
    # chunked: 2k new over 6k cached, each query sees 6145..8192 keys.
    pairs = sum(range(6145, 8193))
    assert M.prefill_flops([2048], [8192], 64, 64) == 4 * 64 * 64 * pairs


def test_decode_bytes_hand_values():
    # llama3-8b 64 x 4k, q_len 1, bf16: K+V 64*4096*8*128*2 B each, Q and O 64*32*128*2 B.
    kv = 2 * 64 * 4096 * 8 * 128 * 2
    qo = 2 * 64 * 32 * 128 * 2
    assert M.decode_bytes(64, 4096, 1, 32, 8, 128, "bf16") == kv + qo == 1_074_790_400
    # fp8 KV halves the cache term only.
    assert M.decode_bytes(64, 4096, 1, 32, 8, 128, "fp8_e4m3") == kv // 2 + qo
    # Window 127: 128 keys for one query, 131 for four (the union of their windows).
    assert M.decode_bytes(2, 32768, 1, 64, 8, 64, "bf16", window_left=127) == \
        2 * 128 * 8 * 64 * 2 * 2 + 2 * 2 * 64 * 64 * 2
    assert M.visible_keys(4, 32768, 127) == 131
    assert M.visible_keys(4, 100, 127) == 100
    assert M.visible_keys(0, 100) == 0


def test_rates_and_slug():
    assert M.tbps(4.6e12 * 1e-3, 1000.0) == pytest.approx(4.6)
    assert M.tflops(700e12 * 2e-3, 2000.0) == pytest.approx(700.0)
    assert M.gpu_slug("NVIDIA H200") == "h200"
    assert M.gpu_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
    assert M.gpu_slug("") == "unknown-gpu"
    with pytest.raises(ValueError):
        M.elem_bytes("int4")


def test_report_paths_are_repository_relative():
    repo = REPO.resolve()
    far = repo.parent.parent / "pagedmha_nowhere" / "out"  # two levels above the repository
    assert M.repo_relative(str(repo / "bench" / "results" / "x.json"), repo) == "bench/results/x.json"
    assert M.repo_relative(str(far / "r.json"), repo) == "r.json"
    assert M.repo_relative("", repo) == ""
    if repo.parent != Path(repo.anchor):  # beside the repository: our CI's ../shared/traces
        assert M.repo_relative(str(repo.parent / "shared" / "t.csv"), repo) == "../shared/t.csv"
    assert (M.repo_relative_command(["python3", str(repo / "bench" / "bench_attention.py"), "--prefill",
                                     "--out-dir", str(far), f"--json={far}/r.json"], repo)
            == "python3 bench/bench_attention.py --prefill --out-dir out --json=r.json")


def test_committed_reports_name_no_absolute_path():
    for f in sorted((REPO / "bench" / "results").glob("*.json")):
        doc = json.loads(f.read_text())
        words = str(doc.get("command") or "").split() + [str((doc.get("options") or {}).get("trace") or "")]
        assert not [w for w in words if w.split("=")[-1].startswith("/")], f.name


# --- Records and targets ----------------------------------------------------------------

def rec(impl, op="decode", model="llama3-8b", batch=64, ctx=4096, q_len=1, page=16,
        kv="bf16", window=-1, time_us=100.0, **extra):
    r = {"op": op, "impl": impl, "model": model, "batch": batch, "ctx": ctx, "q_len": q_len,
         "page_size": page if impl == M.IMPL_OURS else None, "kv_dtype": kv,
         "window_left": window, "sinks": False}
    r.update(extra)
    if time_us is None:  # a failed run carries an error and no figures
        return r
    r["time_us"] = time_us
    g = M.MODELS[model]
    if op == "decode":
        r["tbps"] = M.tbps(M.decode_bytes(batch, ctx, q_len, g["hq"], g["hkv"], g["d"], kv,
                                          window_left=window), time_us)
    else:
        r["tflops"] = M.tflops(M.prefill_flops([q_len] * batch, [ctx] * batch, g["hq"], g["d"]),
                               time_us)
    return r


def synthetic_records():
    return [
        rec("pagedmha", time_us=250.0, rel_l2=3e-3, check_pass=True),
        rec("torch-cudnn", time_us=240.0),
        rec("torch-flash", time_us=300.0),
        rec("pagedmha", page=64, time_us=245.0),
        rec("pagedmha", batch=1, ctx=32768, time_us=40.0),
        rec("torch-cudnn", batch=1, ctx=32768, time_us=38.0),
        rec("pagedmha", batch=128, ctx=32768, time_us=4000.0),
        rec("pagedmha", batch=128, ctx=32768, kv="fp8_e4m3", time_us=2200.0),
        rec("torch-cudnn", batch=128, ctx=32768, kv="fp8_e4m3", time_us=None,
            error="SDPA takes no fp8_e4m3 KV cache"),
        rec("pagedmha", batch=64, ctx=32768, time_us=2000.0),
        rec("pagedmha", batch=64, ctx=32768, window=127, time_us=50.0),
        rec("pagedmha", op="prefill", batch=4, ctx=4096, q_len=4096, time_us=1000.0),
        rec("torch-cudnn", op="prefill", batch=4, ctx=4096, q_len=4096, time_us=1100.0),
        rec("torch-flash", op="prefill", batch=4, ctx=4096, q_len=4096, time_us=1500.0),
    ]


def test_ratio_pairs_ours_with_the_peer_of_the_same_shape():
    recs = synthetic_records()
    peers = M.peer_index(recs)
    ours = recs[0]
    assert M.ratio_to_peer(ours, peers, M.IMPL_CUDNN) == pytest.approx(240.0 / 250.0)
    assert M.ratio_to_peer(ours, peers, M.IMPL_FLASH) == pytest.approx(300.0 / 250.0)
    p64 = recs[3]  # page size is not part of the peer key (peers are dense)
    assert M.ratio_to_peer(p64, peers, M.IMPL_CUDNN) == pytest.approx(240.0 / 245.0)
    fp8 = recs[7]  # the failed peer record pairs with nothing
    assert M.ratio_to_peer(fp8, peers, M.IMPL_CUDNN) is None


def test_evaluate_targets():
    t = {x["name"]: x for x in M.evaluate_targets(synthetic_records())}
    # issue 13: 2 geometries x (5 shapes x 2 pages + verify + 3 fp8 + 2 windows), page 1,
    # 4 TP-8 shapes; the window speed-up; prefill against cuDNN and flash
    assert len(t) == 2 * (10 + 1 + 3 + 2) + 1 + 4 + 1 + 2
    v = t["decode llama3-8b 64x4k p16 bf16: TB/s vs cuDNN"]
    assert v["value"] == pytest.approx(0.96) and v["threshold"] == 1.02 and v["met"] is False
    v = t["decode llama3-8b 1x32k p16 bf16: TB/s vs cuDNN"]
    assert v["value"] == pytest.approx(0.95) and v["met"] is False
    v = t["decode llama3-8b 128x32k p16: fp8-KV tokens/s vs bf16-KV"]
    assert v["value"] == pytest.approx(4000 / 2200) and v["threshold"] == 1.8 and v["met"] is True
    v = t["decode llama3-8b 64x32k p16 bf16: speed-up of window 127"]
    assert v["value"] == pytest.approx(40.0) and v["met"] is True
    v = t["prefill llama3-8b causal 4x4k: TFLOP/s vs cuDNN"]
    assert v["value"] == pytest.approx(1.1) and v["met"] is True
    v = t["prefill llama3-8b causal 4x4k: TFLOP/s vs flash"]
    assert v["value"] == pytest.approx(1.5) and v["met"] is True
    assert all(x["bound"] == ">=" for k, x in t.items() if "q_len 4" not in k)


def test_evaluate_targets_without_data():
    for t in M.evaluate_targets([rec("torch-cudnn")]):
        assert t["value"] is None and t["met"] is None
        assert "no data" in M.fmt_target(t)


# --- perf_tables ------------------------------------------------------------------------

def write_doc(tmp_path, name="h200-attention-20261201.json", records=None, **kw):
    doc = {"gpu": "NVIDIA H200", "commit": "abc123", "command": "python3 bench/x.py",
           "date": "2026-12-01T10:00:00+00:00",
           "ceilings": {"read_tbps": 4.6, "copy_tbps": 4.25, "gemm_bf16_tflops": 760.0},
           "records": synthetic_records() if records is None else records}
    doc.update(kw)
    (tmp_path / name).write_text(json.dumps(doc))
    return doc


def test_perf_tables_no_results(tmp_path):
    out = tmp_path / "performance.md"
    assert PT.main(["--results-dir", str(tmp_path), "--out", str(out)]) == 0
    text = out.read_text()
    assert "No benchmark results yet" in text
    assert "TB/s |" not in text  # no table, no numbers


def test_perf_tables_renders_records(tmp_path):
    write_doc(tmp_path)
    (tmp_path / "broken.json").write_text("{not json")
    out = tmp_path / "docs" / "performance.md"
    assert PT.main(["--results-dir", str(tmp_path), "--out", str(out)]) == 0
    text = out.read_text()
    assert "NVIDIA H200" in text and "`abc123`" in text and "`python3 bench/x.py`" in text
    assert "### decode, llama3-8b" in text and "### prefill, llama3-8b" in text
    assert "4.25 TB/s" in text and "760 TFLOP/s" in text
    # 64 x 4k bf16 page 16: ours 1074790400 B / 250 us, cuDNN at 240 us.
    row = next(l for l in text.splitlines()
               if l.startswith("| 64 x 4k | 1 | 16 | bf16 | - |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[6] == "250.0"
    assert cells[7] == f"{1_074_790_400 / 250e-6 / 1e12:.2f}"
    assert cells[8] == f"{100 * 1_074_790_400 / 250e-6 / 1e12 / 4.6:.0f}%"
    assert cells[11] == "0.96x" and cells[12] == "1.20x"
    assert cells[13] == "3.0e-03"
    # fp8 row: no peer ratio, the peer's error listed.
    fp8 = next(l for l in text.splitlines() if "| 128 x 32k | 1 | 16 | fp8_e4m3 |" in l)
    assert fp8.rstrip().endswith("| - | - | - | - | - |")
    assert "SDPA takes no fp8_e4m3 KV cache" in text
    assert "**not met**" in text and "| met |" in text
    assert "broken.json" in text and "Files skipped" in text


def test_perf_tables_peer_only_shapes_show_no_invented_numbers(tmp_path):
    write_doc(tmp_path, records=[rec("torch-cudnn", time_us=240.0)])
    out = tmp_path / "p.md"
    PT.main(["--results-dir", str(tmp_path), "--out", str(out)])
    row = next(l for l in out.read_text().splitlines() if l.startswith("| 64 x 4k |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[6] == "error" and cells[7] == "-" and cells[11] == "-"
    assert cells[9] == f"{1_074_790_400 / 240e-6 / 1e12:.2f}"


def test_perf_tables_newest_file_first(tmp_path):
    write_doc(tmp_path, name="a.json", date="2026-11-01T00:00:00+00:00", commit="old")
    write_doc(tmp_path, name="b.json", date="2026-12-02T00:00:00+00:00", commit="new")
    docs, problems = PT.load(tmp_path)
    assert [n for n, _ in docs] == ["b.json", "a.json"] and problems == []


# --- bench_attention without torch -----------------------------------------------------

def test_bench_plan_is_torch_free_and_consistent():
    assert BA.torch is None  # importing the module did not need torch
    plan = BA.full_plan()
    names = [c.name for c in plan]
    assert len(names) == len(set(names))
    peer_keys = [(c.op, c.model, c.batch, c.ctx, c.q_len, c.kv_dtype, c.window_left)
                 for c in plan if c.peers]
    assert len(peer_keys) == len(set(peer_keys))  # each peer shape timed once
    # Every target has the records it needs.
    need = [("decode", "llama3-8b", 64, 4096, 1, 16, "bf16", -1),
            ("decode", "llama3-8b", 1, 32768, 1, 16, "bf16", -1),
            ("decode", "llama3-8b", 128, 32768, 1, 16, "fp8_e4m3", -1),
            ("decode", "llama3-8b", 64, 32768, 1, 16, "bf16", 127),
            ("prefill", "llama3-8b", 4, 4096, 4096, 16, "bf16", -1)]
    have = {(c.op, c.model, c.batch, c.ctx, c.q_len, c.page_size, c.kv_dtype, c.window_left)
            for c in plan}
    for n in need:
        assert n in have
    for c in BA.quick_plan():
        assert c.name


def test_bench_case_geometry():
    c = BA.Case("decode", "llama3-8b", 64, 32768, 4, 16, window_left=127)
    assert c.first_key == 32768 - 4 - 127
    assert c.work()["bytes"] == M.decode_bytes(64, 32768, 4, 32, 8, 128, "bf16", window_left=127)
    assert BA.peer_mask_mode(c) == "explicit"
    assert BA.peer_mask_mode(BA.Case("decode", "gpt-oss", 1, 32768, 1)) == "none"
    assert BA.peer_mask_mode(BA.Case("decode", "gpt-oss", 64, 4096, 4)) == "lower_right"
    assert BA.peer_mask_mode(BA.Case("prefill", "gpt-oss", 4, 4096, 4096)) == "causal"
    assert BA.peer_mask_mode(BA.Case("prefill", "gpt-oss", 8, 8192, 2048)) == "lower_right"
    assert BA.Case("decode", "gpt-oss", 1, 32768, 1).sinks
    p = BA.Case("prefill", "llama3-8b", 8, 8192, 2048)
    assert p.work()["flops"] == 8 * M.prefill_flops([2048], [8192], 32, 128)
    assert p.name == "prefill llama3-8b 8x8k q2k p16 bf16"


def test_bench_summary_table_from_records():
    text = BA.summary_table(synthetic_records())
    lines = text.splitlines()
    row = next(l for l in lines if l.startswith("decode llama3-8b 64x4k q1 p16 bf16 TB/s"))
    assert "0.96" in row and "1.20" in row and "3.0e-03" in row
    assert any("NOT met" in l for l in lines) and any(l.rstrip().endswith(" met") for l in lines)


# --- perf_tables: replay reports and backend overhead ------------------------------------

def replay_doc(truncated=True, decode_steps=3, **summary):
    s = {"requests": 10, "finished": 4, "truncated": truncated, "steps": 5,
         "decode_steps": decode_steps, "attention_time_per_step_us": 1234.56,
         "attention_time_per_generated_token_us": 98.765, "decode_steps_tbps": 3.4321,
         "ratio_decode_read_ceiling": 0.7461, "extend_steps_tflops": 17.09,
         "ratio_roofline": 0.1804, "backend_metadata_host_time_per_step_us": 18.51,
         "backend_metadata_host_time_per_decode_step_us": 16.32, "prefix_hit_rate": 0.034,
         "prefix_hit_tokens": 60416, "preemptions": 2, "wall_time_s": 60.01,
         "ceilings": {"read_tbps": 4.6, "tflops": 760.0}}
    s.update(summary)
    return {"tool": "pagedmha replay", "gpu": "NVIDIA H200", "device": "cuda:0",
            "executor": "MhaBackend(pagedmha) on cuda:0", "truncated": truncated,
            "command": "pagedmha replay --trace t.csv", "commit": "c0ffee1",
            "options": {"trace": ".traces/t.csv", "kv_dtype": "fp8", "model": "llama3-8b",
                        "time_limit_s": 60.0},
            "model": {"name": "llama3-8b", "layers": 32, "q_heads": 32, "kv_heads": 8,
                      "head_dim": 128},
            "check": {"ok": True, "steps_checked": 3, "rows_checked": 16,
                      "max_rel_err": 0.0027, "failure": ""},
            "summary": s, "steps": {"step": [0, 1, 2, 3, 4]}}


def overhead_doc(t256=4.2):
    recs = []
    for mode, q in (("decode", 1), ("verify", 4)):
        for b in (1, 8, 64, 256):
            for op in ("init_forward_metadata", "replay_prepare"):
                t = t256 if (b == 256 and op == "replay_prepare" and mode == "verify") else 4.0 + q
                recs.append({"op": op, "impl": "pagedmha", "mode": mode, "batch": b,
                             "ctx": 8192, "q_len": q, "page_size": 64, "time_us": t})
    return {"gpu": "NVIDIA H200", "commit": "c0ffee1", "command": "backend_overhead --device cuda",
            "date": "20261130", "ceilings": {}, "records": recs}


def cells_of(text, label):
    row = next(l for l in text.splitlines() if l.startswith(f"| {label} |"))
    return [c.strip() for c in row.strip().strip("|").split("|")][1:]


def render_dir(tmp_path, files, plots=()):
    res = tmp_path / "results"
    res.mkdir()
    for name, doc in files.items():
        (res / name).write_text(json.dumps(doc))
    docs_dir = tmp_path / "docs"
    docs_dir.mkdir()
    for p in plots:
        (docs_dir / p).write_bytes(b"png")
    out = docs_dir / "performance.md"
    assert PT.main(["--results-dir", str(res), "--out", str(out)]) == 0
    return out.read_text()


def test_kinds_are_recognised():
    assert PT.kind_of(replay_doc()) == PT.REPLAY
    assert PT.kind_of(overhead_doc()) == PT.OVERHEAD
    assert PT.kind_of({"records": synthetic_records()}) == PT.ATTENTION
    assert PT.kind_of({"tool": "pagedmha replay"}) is None  # no summary
    assert PT.kind_of([]) is None
    assert PT.replay_name("h200-replay-azure-conv-llama3-8b-20261130.json") == \
        "azure-conv-llama3-8b"


def test_replay_table_and_plot_link(tmp_path):
    done = replay_doc(truncated=False, decode_steps=0, finished=10)
    done["annotation"] = "added by hand"
    text = render_dir(tmp_path, {"h200-replay-a-20261130.json": replay_doc(),
                                 "h200-replay-b-20261130.json": done},
                      plots=["replay-a.png"])
    assert "## Trace replay" in text
    head = next(l for l in text.splitlines() if l.startswith("|  |"))
    names = [c.strip() for c in head.strip("|").split("|")][1:]
    a, b = names.index("a"), names.index("b")
    assert cells_of(text, "requests finished / total")[a] == "4 / 10 **TRUNCATED**"
    assert cells_of(text, "requests finished / total")[b] == "10 / 10"
    assert cells_of(text, "KV dtype")[a] == "fp8"
    assert cells_of(text, "trace")[a] == "t.csv"
    assert cells_of(text, "attention us / step")[a] == "1234.6"
    assert cells_of(text, "attention us / output token")[a] == "98.8"
    assert cells_of(text, "decode-only steps TB/s")[a] == "3.43"
    assert cells_of(text, "decode-only steps / read ceiling")[a] == "0.75 of 4.6 TB/s"
    # No decode-only steps: no bandwidth figure is made up from the 0.0 in the file.
    assert cells_of(text, "decode-only steps TB/s")[b] == "n/a (no decode-only steps)"
    assert cells_of(text, "decode-only steps / read ceiling")[b] == "n/a (no decode-only steps)"
    assert cells_of(text, "extend steps TFLOP/s")[a] == "17.1"
    assert cells_of(text, "whole-trace roofline ratio")[a] == "0.180"
    assert cells_of(text, "backend metadata host us / step")[a] == "18.5 (decode steps 16.3)"
    assert cells_of(text, "backend metadata host us / step")[b] == "18.5"
    assert cells_of(text, "prefix-cache hit rate")[a] == "3.4% (60416 tokens)"
    assert cells_of(text, "preemptions")[a] == "2"
    assert cells_of(text, "checks")[a] == "ok: 3 steps / 16 rows, max rel err 2.7e-03"
    assert "- plot: [docs/replay-a.png](replay-a.png)" in text
    assert "replay-b.png" not in text  # no such plot: no link
    assert "`c0ffee1`" in text and "- note: added by hand" in text
    assert "Targets:" not in text  # the attention targets belong to attention files only


def test_replay_prefers_the_reports_dated_plot(tmp_path):
    text = render_dir(tmp_path, {"h200-replay-a-20261130.json": replay_doc(),
                                 "h200-replay-a-20261202.json": replay_doc()},
                      plots=["replay-a.png", "replay-a-20261202.png"])
    assert "- plot: [docs/replay-a-20261202.png](replay-a-20261202.png)" in text
    assert "- plot: [docs/replay-a.png](replay-a.png)" in text  # the older report keeps the name's plot


def test_replay_prefix_hit_rate_that_does_not_apply_says_why(tmp_path):
    """A trace without prefix ids (Azure) has a null rate and the reason, not 0.0%."""
    doc = replay_doc(prefix_hit_rate=None, prefix_hit_rate_na="trace has no prefix ids", prefix_hit_tokens=0)
    text = render_dir(tmp_path, {"cpu-replay-azure.json": doc})
    assert cells_of(text, "prefix-cache hit rate")[0] == "n/a (trace has no prefix ids)"


def test_replay_check_mismatch_and_missing_ceilings(tmp_path):
    doc = replay_doc(ratio_roofline=None, ratio_decode_read_ceiling=None, ceilings=None)
    doc["check"] = {"ok": False, "failure": "step 7: relative L2 error 0.5 > 1e-02"}
    text = render_dir(tmp_path, {"cpu-replay-x.json": doc})
    assert cells_of(text, "checks")[0] == "**MISMATCH**: step 7: relative L2 error 0.5 > 1e-02"
    assert cells_of(text, "whole-trace roofline ratio")[0] == "n/a (no roofline ceilings)"
    assert cells_of(text, "decode-only steps / read ceiling")[0] == "n/a (no roofline ceilings)"


def test_backend_overhead_table_marks_the_target(tmp_path):
    text = render_dir(tmp_path, {"h200-backend_overhead-20261130.json": overhead_doc(t256=25.0)})
    assert "## Backend host overhead, NVIDIA H200, 20261130" in text
    assert "| op | mode | q_len | bs 1 us | bs 8 us | bs 64 us | bs 256 us | target at bs 256 |" \
        in text
    assert "| init_forward_metadata | decode | 1 | 5.0 | 5.0 | 5.0 | 5.0 | <= 10 us: met |" in text
    assert "| replay_prepare | verify | 4 | 8.0 | 8.0 | 8.0 | 25.0 | <= 20 us: **not met** |" in text
    assert "Targets:" not in text and "Files skipped" not in text


def test_backend_overhead_decode_steps_have_the_10us_target(tmp_path):
    """Issue 13: decode-step host time <= 10 us at bs 256; other modes keep 20 us."""
    doc = overhead_doc()
    for r in doc["records"]:
        if r["batch"] == 256 and r["op"] == "init_forward_metadata":
            r["time_us"] = 12.0  # over the decode bound, under the verify one
    text = render_dir(tmp_path, {"h200-backend_overhead-20261130.json": doc})
    assert "| init_forward_metadata | decode | 1 | 5.0 | 5.0 | 5.0 | 12.0 | <= 10 us: **not met** |" in text
    assert "| init_forward_metadata | verify | 4 | 8.0 | 8.0 | 8.0 | 12.0 | <= 20 us: met |" in text


def test_sections_in_order_attention_replay_overhead(tmp_path):
    att = json.loads(json.dumps({"gpu": "NVIDIA H200", "commit": "a", "command": "b",
                                 "date": "2026-11-30T10:00:00+00:00", "ceilings": {},
                                 "records": synthetic_records()}))
    text = render_dir(tmp_path, {"h200-replay-a-20261201.json": replay_doc(),
                                 "h200-backend_overhead-20261201.json": overhead_doc(),
                                 "h200-attention-20261130.json": att})
    i_att = text.index("(`bench/results/h200-attention-20261130.json`)")
    i_rep = text.index("## Trace replay")
    i_ovh = text.index("## Backend host overhead")
    assert i_att < i_rep < i_ovh
    assert text.count("Targets:") == 1


def test_replay_shapes_plan_and_a_file_without_target_shapes():
    cases = BA.replay_plan()
    names = [c.name for c in cases]
    assert len(set(names)) == len(names)
    tp8 = [c for c in cases if c.model == "gpt-oss-tp8"]
    assert tp8 and all(c.sinks for c in tp8)
    # one TP-8 rank: 1/8 of the full-head flops for the same prefill shape
    full = next(c for c in cases if c.op == "prefill" and c.model == "gpt-oss" and c.kv_dtype == "bf16")
    rank = next(c for c in tp8 if c.op == "prefill" and c.kv_dtype == "bf16" and c.window_left < 0)
    assert rank.work()["flops"] * 8 == full.work()["flops"]
    # a results file holding none of the target shapes says so instead of a "no data" table
    assert "none of the target shapes" in PT.targets_section([])
    assert "no data" not in PT.targets_section([])


# --- scripts/plot_replay.py ---------------------------------------------------------------

def _report(steps, dry_run, live=False):
    cols = {k: [] for k in ("step", "rows", "extend_rows", "decode_rows", "tokens", "kv_tokens", "attention_us",
                            "floor_us", "bytes", "flops", "running", "waiting")}
    cols["pages_in_use"] = [[]]
    if live:  # reports since the live / prefix-cache split; older ones lack the column
        cols["live_pages"] = [[]]
    for i in range(steps):
        for k in cols:
            if k not in ("pages_in_use", "live_pages"):
                cols[k].append(0 if dry_run and k == "attention_us" else i + 1)
        cols["pages_in_use"][0].append(10 + i)
        if live:
            cols["live_pages"][0].append(5 + i)
    cols["stride"] = 1
    null = None if dry_run or steps == 0 else 1.0
    return {"tool": "pagedmha replay", "device": "cpu", "truncated": steps == 0,
            "options": {"pages_per_group": 100, "dry_run": dry_run},
            "model": {"name": "m", "cache_groups": [{"name": "full_attention", "window_left": -1}]},
            "summary": {"requests": 3, "finished": 0 if steps == 0 else 3, "steps": steps,
                        "achieved_tbps": null, "achieved_tflops": null, "ratio_roofline": null,
                        "roofline_floor_s": 0.5, "preemptions": 0,
                        # no admission before the stop: null and the reason (as replay writes it)
                        "prefix_hit_rate": None if steps == 0 else 0.25,
                        "prefix_hit_rate_na": "no request admitted" if steps == 0 else None},
            "steps": cols}


@pytest.mark.parametrize("steps,dry_run,live", [(0, False, False), (0, True, False), (5, True, False),
                                               (5, False, False), (5, False, True)])
def test_plot_replay_draws_dry_run_and_zero_step_reports(tmp_path, steps, dry_run, live):
    pytest.importorskip("matplotlib")
    import subprocess
    rep = tmp_path / "r.json"
    rep.write_text(json.dumps(_report(steps, dry_run, live)))
    png = tmp_path / "r.png"
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "plot_replay.py"), "-o", str(png), str(rep)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert png.stat().st_size > 0


def test_plot_replay_unwritable_output_names_the_argument(tmp_path):
    pytest.importorskip("matplotlib")
    import subprocess
    rep = tmp_path / "r.json"
    rep.write_text(json.dumps(_report(3, False)))
    out = tmp_path / "missing-dir" / "r.png"
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "plot_replay.py"), "-o", str(out), str(rep)],
                       capture_output=True, text=True)
    assert p.returncode == 1
    assert "-o/--output" in p.stderr and str(out) in p.stderr and "Traceback" not in p.stderr


def variants_doc(recs, date, command="bash bench/prefill_variants.sh", gpu="NVIDIA H200", **extra):
    return {"gpu": gpu, "commit": "abc123", "command": command, "date": date, "records": recs, **extra}


def test_variants_file_renders_one_column_per_variant(tmp_path):
    recs = [{"op": "prefill", "impl": "pagedmha-variant", "variant": v, "model": "llama3-8b", "batch": 1,
             "ctx": 16384, "q_len": 16384, "page_size": p, "kv_dtype": "bf16", "time_us": 1.0, "tflops": t}
            for v, p, t in [("default", 16, 442.4), ("cluster1", 16, 359.5), ("default", 64, 446.3)]]
    doc = variants_doc(recs, "2026-12-01")
    assert PT.kind_of(doc) == PT.VARIANTS
    text = render_dir(tmp_path, {"h200-prefill-variants-20261201.json": doc})
    assert "| shape | default | cluster1 |" in text
    assert "| llama3-8b 1 x 16k p16 | 442 | 360 |" in text
    assert "| llama3-8b 1 x 16k p64 | 446 | - |" in text  # no invented number


def test_variants_keep_fp8_rows_apart_and_decode_reads_tbps(tmp_path):
    base = {"impl": "pagedmha-variant", "model": "llama3-8b", "batch": 1, "page_size": 16, "time_us": 1.0}
    prefill = [{**base, "op": "prefill", "variant": "default", "ctx": 16384, "q_len": 16384, "kv_dtype": kv,
                "tflops": t} for kv, t in [("bf16", 575.2), ("fp8_e4m3", 401.7)]]
    decode = [{**base, "op": "decode", "variant": v, "ctx": 32768, "q_len": 1, "kv_dtype": "bf16", "window_left": w,
               "tbps": t} for v, w, t in [("sm90", -1, 3.004), ("portable", -1, 3.301), ("portable", 127, 2.156)]]
    text = render_dir(tmp_path, {
        "h200-prefill-variants-20261202.json": variants_doc(prefill, "2026-12-02"),
        "h200-decode-variants-20261202.json": variants_doc(decode, "2026-12-02",
                                                           command="KERNEL=decode bash bench/prefill_variants.sh")})
    assert "| llama3-8b 1 x 16k p16 | 575 |" in text
    assert "| llama3-8b 1 x 16k p16 fp8_e4m3 | 402 |" in text  # not merged into the bf16 row
    assert "| shape | sm90 | portable |" in text
    assert "| llama3-8b 1 x 32k p16 | 3.00 | 3.30 |" in text
    assert "| llama3-8b 1 x 32k p16 w127 | - | 2.16 |" in text


def test_variants_keep_page_orders_apart(tmp_path):
    base = {"op": "prefill", "model": "llama3-8b", "batch": 1, "ctx": 16384, "q_len": 16384, "kv_dtype": "bf16",
            "time_us": 1.0}
    recs = [{**base, "impl": "pagedmha-variant", "variant": "default", "page_size": 16, "tflops": 590.4},
            {**base, "impl": "pagedmha-variant", "variant": "default", "page_size": 16, "page_order": "in order",
             "tflops": 601.6},
            {**base, "impl": "fa3", "variant": "fa3-dense", "page_size": 0, "page_order": "dense", "tflops": 660.2}]
    text = render_dir(tmp_path, {"h200-prefill-variants-20261205.json": variants_doc(recs, "2026-12-05")})
    assert "| shape | default | fa3-dense |" in text
    assert "| llama3-8b 1 x 16k p16 | 590 | - |" in text  # the random order, not overwritten
    assert "| llama3-8b 1 x 16k p16 in order | 602 | - |" in text
    assert "| llama3-8b 1 x 16k dense | - | 660 |" in text


def test_variants_keep_chunks_apart_from_whole_prompts(tmp_path):
    # A 2k-query chunk over 8k keys and an 8k prompt of the same batch are two rows.
    base = {"op": "prefill", "impl": "pagedmha-variant", "variant": "default", "model": "gemma", "batch": 8,
            "ctx": 8192, "page_size": 16, "kv_dtype": "bf16", "time_us": 1.0}
    recs = [{**base, "q_len": 2048, "tflops": 635.2},
            {**base, "tflops": 588.0},  # no q_len: an older record, a whole prompt
            {**base, "batch": 4, "q_len": 8192, "tflops": 601.4}]
    text = render_dir(tmp_path, {"h100-prefill-variants-20261206.json":
                                 variants_doc(recs, "2026-12-06", gpu="NVIDIA H100 80GB HBM3")})
    assert "| gemma 8 x 8k q2k p16 | 635 |" in text
    assert "| gemma 8 x 8k p16 | 588 |" in text
    assert "| gemma 4 x 8k p16 | 601 |" in text  # q_len == ctx: no query count in the label


def test_variants_render_the_output_comparison(tmp_path):
    recs = [{"op": "prefill", "impl": "pagedmha-variant", "variant": v, "model": "gemma", "batch": 4, "ctx": 4096,
             "q_len": 4096, "page_size": 16, "kv_dtype": "bf16", "time_us": 1.0, "tflops": t}
            for v, t in [("default", 588.0), ("bn80", 610.0)]]
    cmp = [{"variant": "bn80", "reference": "default", "file": "gemma-4x4096-p16-bf16.bin", "values": 10,
            "max_abs_diff": 0.00390625, "max_abs_ref": 2.5, "nonfinite": 0},
           {"variant": "broken", "reference": "default", "file": "gemma-4x4096-p16-bf16.lse.bin", "values": 10,
            "max_abs_diff": None, "max_abs_ref": 11.0, "nonfinite": 3},
           {"variant": "nobuild", "reference": "default", "file": "gemma-4x4096-p16-bf16.bin", "values": 0,
            "max_abs_diff": None, "max_abs_ref": 2.5, "nonfinite": None, "missing": True}]
    doc = variants_doc(recs, "2026-12-05", command="COMPARE=1 bash bench/prefill_variants.sh", compare=cmp)
    text = render_dir(tmp_path, {"h200-prefill-variants-20261205.json": doc})
    assert "Outputs against `default`" in text
    assert "| bn80 | gemma-4x4096-p16-bf16.bin | 0.00391 | 2.5 | 0 |" in text
    assert "| broken | gemma-4x4096-p16-bf16.lse.bin | - | 11 | 3 |" in text  # NaN: no number invented
    assert "| nobuild | gemma-4x4096-p16-bf16.bin | missing | 2.5 | - |" in text


def test_prefill_plan_covers_the_issue_rows():
    plan = BA.prefill_plan()
    names = [c.name for c in plan]
    assert len(names) == len(set(names))
    have = {(c.model, c.batch, c.ctx, c.q_len, c.page_size, c.kv_dtype) for c in plan}
    for model in ("llama3-8b", "gpt-oss", "gemma"):
        for s in (1024, 4096, 16384):
            assert (model, 16384 // s, s, s, 16, "bf16") in have
    for p in (1, 64):
        assert ("llama3-8b", 4, 4096, 4096, p, "bf16") in have
    assert ("llama3-8b", 4, 4096, 4096, 16, "fp8_e4m3") in have


# --- Issue 13: the decode plan and its targets -------------------------------------------

def test_decode_plan_covers_the_issue_13_rows():
    plan = BA.decode_plan()
    names = [c.name for c in plan]
    assert len(names) == len(set(names))
    assert all(c.op == "decode" for c in plan)
    have = {(c.model, c.batch, c.ctx, c.q_len, c.page_size, c.kv_dtype, c.window_left, c.peers)
            for c in plan}
    std = [(1, 32768), (16, 8192), (64, 4096), (256, 2048), (128, 32768)]
    for model in ("llama3-8b", "gpt-oss"):
        for b, c in std:  # peers once per shape, on the page-16 row
            assert (model, b, c, 1, 16, "bf16", -1, True) in have
            assert (model, b, c, 1, 64, "bf16", -1, False) in have
        assert (model, 64, 4096, 4, 16, "bf16", -1, True) in have  # verify
        for b, c in [(128, 32768), (64, 4096), (1, 32768)]:
            assert any(h[:7] == (model, b, c, 1, 16, "fp8_e4m3", -1) for h in have)
        for b, c in [(64, 32768), (128, 32768)]:
            assert (model, b, c, 1, 16, "bf16", 127, True) in have
    assert ("llama3-8b", 128, 8192, 1, 1, "bf16", -1, False) in have
    assert ("llama3-8b", 128, 8192, 1, 16, "bf16", -1, True) in have
    for b, c in [(1, 32768), (32, 2048), (256, 2048), (64, 8192)]:
        assert ("llama3-70b-tp8", b, c, 1, 16, "bf16", -1, True) in have
        assert ("llama3-70b-tp8", b, c, 1, 64, "bf16", -1, False) in have
    assert len(plan) == 2 * (10 + 1 + 3 + 2) + 2 + 8  # nothing beyond what the targets need
    tp8 = next(c for c in plan if c.model == "llama3-70b-tp8")
    assert (tp8.geom, tp8.sinks) == ({"hq": 8, "hkv": 1, "d": 128}, False)
    # one KV head of llama3-8b's eight, Q and O of 8 of its 32 heads
    assert tp8.work()["bytes"] == 32768 * 128 * 2 * 2 + 2 * 8 * 128 * 2


def test_bench_plan_flags_are_exclusive_and_need_no_torch():
    assert BA.PLANS["decode"][0] is BA.decode_plan
    assert BA.PLANS["decode"][1] == "-decode"
    for pair in (["--quick", "--decode"], ["--decode", "--prefill"], ["--replay-shapes", "--decode"]):
        with pytest.raises(SystemExit) as e:  # argparse refuses before torch is imported
            BA.main(pair)
        assert e.value.code == 2
    assert BA.torch is None


def issue13_records(page1_us=1200.0):
    """Hand-made times: each target's value is a ratio of two of them (see the test)."""
    tp8 = dict(model="llama3-70b-tp8")
    return [
        rec("pagedmha", time_us=250.0), rec("torch-cudnn", time_us=240.0),  # 0.96x
        rec("pagedmha", page=64, model="gpt-oss", batch=16, ctx=8192, time_us=90.0),
        rec("torch-cudnn", model="gpt-oss", batch=16, ctx=8192, time_us=100.0),  # no p16 row
        rec("pagedmha", q_len=4, time_us=270.0),  # verify 270 / 250
        rec("pagedmha", model="gpt-oss", batch=64, ctx=4096, time_us=100.0),
        rec("pagedmha", model="gpt-oss", batch=64, ctx=4096, q_len=4, time_us=120.0),
        rec("pagedmha", kv="fp8_e4m3", time_us=200.0),  # 250 / 200 over bf16 64x4k
        rec("pagedmha", batch=1, ctx=32768, kv="fp8_e4m3", time_us=20.0),  # no bf16 1x32k
        rec("pagedmha", batch=64, ctx=32768, window=127, time_us=50.0),
        rec("torch-cudnn", batch=64, ctx=32768, window=127, time_us=45.0),
        rec("pagedmha", model="gpt-oss", batch=128, ctx=32768, window=127, time_us=30.0),
        rec("torch-cudnn", model="gpt-oss", batch=128, ctx=32768, window=127, time_us=33.0),
        rec("torch-cudnn", model="gpt-oss", batch=128, ctx=32768, time_us=3000.0),  # no window
        rec("pagedmha", batch=128, ctx=8192, time_us=1000.0),
        rec("pagedmha", batch=128, ctx=8192, page=1, time_us=page1_us),
        rec("pagedmha", batch=1, ctx=32768, time_us=10.0, **tp8),
        rec("torch-cudnn", batch=1, ctx=32768, time_us=12.0, **tp8),
        rec("pagedmha", batch=32, ctx=2048, time_us=10.0, **tp8),
        rec("torch-cudnn", batch=32, ctx=2048, time_us=10.1, **tp8),
        rec("pagedmha", batch=256, ctx=2048, time_us=None, error="launch failed", **tp8),
        rec("torch-cudnn", batch=256, ctx=2048, time_us=50.0, **tp8),
        rec("pagedmha", batch=64, ctx=8192, page=64, time_us=40.0, **tp8),  # a p64 row only
        rec("torch-cudnn", batch=64, ctx=8192, time_us=50.0, **tp8),
    ]


def test_issue13_targets_hand_computed():
    t = {x["name"]: x for x in M.evaluate_targets(issue13_records())}

    def check(name, value, threshold, met, bound=">="):
        row = t[name]
        assert row["threshold"] == threshold and row["bound"] == bound, name
        assert row["met"] is met, name
        assert (row["value"] is None) if value is None else row["value"] == pytest.approx(value), name

    check("decode llama3-8b 64x4k p16 bf16: TB/s vs cuDNN", 240 / 250, 1.02, False)
    # page 64 pairs with the page-independent peer record of its shape
    check("decode gpt-oss 16x8k p64 bf16: TB/s vs cuDNN", 100 / 90, 1.02, True)
    check("decode gpt-oss 16x8k p16 bf16: TB/s vs cuDNN", None, 1.02, None)
    check("decode llama3-8b 64x4k p64 bf16: TB/s vs cuDNN", None, 1.02, None)
    # verify: an upper bound on q_len 4 time / q_len 1 time
    check("decode llama3-8b 64x4k p16 bf16: q_len 4 time vs q_len 1", 270 / 250, 1.1, True, "<=")
    check("decode gpt-oss 64x4k p16 bf16: q_len 4 time vs q_len 1", 120 / 100, 1.1, False, "<=")
    # fp8 tokens/s over bf16 = bf16 time / fp8 time; 1.8 at 128x32k, 1.5 elsewhere
    check("decode llama3-8b 64x4k p16: fp8-KV tokens/s vs bf16-KV", 250 / 200, 1.5, False)
    check("decode llama3-8b 1x32k p16: fp8-KV tokens/s vs bf16-KV", None, 1.5, None)
    check("decode gpt-oss 128x32k p16: fp8-KV tokens/s vs bf16-KV", None, 1.8, None)
    # window 127 against cuDNN's window record, not the full-context one
    check("decode llama3-8b 64x32k p16 bf16 w127: TB/s vs cuDNN", 45 / 50, 1.0, False)
    check("decode gpt-oss 128x32k p16 bf16 w127: TB/s vs cuDNN", 33 / 30, 1.0, True)
    check("decode llama3-8b 128x32k p16 bf16 w127: TB/s vs cuDNN", None, 1.0, None)
    # page 1 tokens/s over page 16 = page 16 time / page 1 time
    check("decode llama3-8b 128x8k bf16: page 1 tokens/s vs page 16", 1000 / 1200, 0.8, True)
    check("decode llama3-70b-tp8 1x32k p16 bf16: TB/s vs cuDNN", 12 / 10, 1.02, True)
    check("decode llama3-70b-tp8 32x2k p16 bf16: TB/s vs cuDNN", 10.1 / 10, 1.02, False)
    check("decode llama3-70b-tp8 256x2k p16 bf16: TB/s vs cuDNN", None, 1.02, None)  # failed run
    check("decode llama3-70b-tp8 64x8k p16 bf16: TB/s vs cuDNN", None, 1.02, None)  # p64 only
    t = {x["name"]: x for x in M.evaluate_targets(issue13_records(page1_us=1300.0))}
    check("decode llama3-8b 128x8k bf16: page 1 tokens/s vs page 16", 1000 / 1300, 0.8, False)


def test_target_bounds():
    assert M.target("a", 1.1, 1.1, "<=")["met"] is True
    assert M.target("a", 1.1001, 1.1, "<=")["met"] is False
    assert M.target("a", 0.5, 1.1, "<=")["met"] is True
    assert M.target("a", 0.5, 1.1)["met"] is False and M.target("a", 1.1, 1.1)["met"] is True
    assert M.target("a", None, 1.1, "<=")["met"] is None
    with pytest.raises(ValueError, match="bound.*'<'"):
        M.target("a", 1.0, 1.0, "<")
    assert M.fmt_target(M.target("v", 1.2, 1.1, "<=")) == "v: 1.20x (target <= 1.1x) NOT met"
    assert M.fmt_target(M.target("v", 1.0, 1.02)) == "v: 1.00x (target >= 1.02x) NOT met"
    assert M.fmt_bound({"threshold": 0.85}) == ">= 0.85x"  # rows written before bounds


def test_perf_tables_renders_issue13_targets(tmp_path):
    write_doc(tmp_path, records=issue13_records())
    out = tmp_path / "p.md"
    assert PT.main(["--results-dir", str(tmp_path), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| decode llama3-8b 64x4k p16 bf16: q_len 4 time vs q_len 1 | 1.08x | <= 1.1x | met |" in text
    assert ("| decode gpt-oss 64x4k p16 bf16: q_len 4 time vs q_len 1 | 1.20x | <= 1.1x "
            "| **not met** |") in text
    assert "| decode llama3-70b-tp8 1x32k p16 bf16: TB/s vs cuDNN | 1.20x | >= 1.02x | met |" in text
    assert "| decode llama3-70b-tp8 64x8k p16 bf16: TB/s vs cuDNN | - | >= 1.02x | no data |" in text
    # no prefill record: the prefill targets are left out with one line, not as "no data" rows
    assert "prefill llama3-8b causal 4x4k" not in text
    assert "No prefill target shape is in this file." in text
    assert "(target <= 1.1x)" in BA.summary_table(issue13_records())
