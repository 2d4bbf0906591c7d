"""Tests of bench/replay_step_kinds.py against a report worked by hand: steps split into
mixed, decode-only and prefill-only from a first step on, times scaled by the stride."""

import json

from script_module import REPO, load_script

RK = load_script("replay_step_kinds", REPO / "bench" / "replay_step_kinds.py")

# Five recorded steps at stride 2: 0 and 2 are before --from-step 4; 4 mixed, 6 decode-only,
# 8 prefill-only.
REPORT = {"steps": {
    "stride": 2,
    "step": [0, 2, 4, 6, 8],
    "extend_rows": [1, 1, 2, 0, 3],
    "decode_rows": [0, 5, 7, 9, 0],
    "attention_us": [1000.0, 2000.0, 300.0, 50.0, 400.0],
    "floor_us": [500.0, 900.0, 150.0, 40.0, 100.0],
}}


def test_kinds_by_hand(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(REPORT))
    k = RK.kinds(str(path), first=4)
    assert k["mixed"] == [600.0, 2, 300.0]  # 300 us x 2, two steps, floor 150 x 2
    assert k["decode"] == [100.0, 2, 80.0]
    assert k["prefill"] == [800.0, 2, 200.0]
    assert k["all_ms"] == (1000 + 2000 + 300 + 50 + 400) * 2 / 1e3  # every step, whatever first
    # From step 0 the two early steps count too: step 0 prefill-only, step 2 mixed.
    k0 = RK.kinds(str(path), first=0)
    assert k0["mixed"][:2] == [(2000.0 + 300.0) * 2, 4]
    assert k0["prefill"][:2] == [(1000.0 + 400.0) * 2, 4]
