"""Tests of bench/plan_balance.py (a host model of the Hopper prefill grid's balance)
against examples worked by hand: the geometry of policy.h, a causal request's tile
costs, pairs against single tiles, and a ramp dealt round-robin and serpentine."""

import pytest

from script_module import REPO, load_script

PB = load_script("plan_balance", REPO / "bench" / "plan_balance.py")


def test_geometry_follows_the_policy():
    # llama3-8b: group 4, clusters of two, pack 2: 64 tokens, 8 KV heads x 2 groups / 2.
    assert PB.geometry(32, 8, 128, False) == (64, 8, 128, 66)
    # gemma: group 2, clusters of two, pack 1; 80-key tiles.
    assert PB.geometry(16, 8, 256, False) == (128, 8, 80, 66)
    # gpt-oss bf16: 192-row tiles, pack 4; fp8: no clusters, pack 8, 128 rows without
    # requests, and by policy.h's rule with them: the TP-8 rank's 8k extend (342 tiles,
    # three rounds, against 512, four) takes 192, a 2k chunk (84 against 125, one round
    # each) keeps 128.
    assert PB.geometry(64, 8, 64, False) == (48, 8, 128, 66)
    assert PB.geometry(8, 1, 64, True) == (16, 1, 128, 132)
    assert PB.geometry(8, 1, 64, True, requests=[(8192, 16384)]) == (24, 1, 128, 132)
    assert PB.geometry(8, 1, 64, True, requests=[(2000, 30000)]) == (16, 1, 128, 132)
    # 200 requests of 16 tokens are a tile each either way: 128 rows.
    assert not PB.fp8_rows192_pays(3200, 200, 16, 8, 8, 132)


def test_causal_tile_costs_and_units():
    # 256 queries over 256 keys in 128-token tiles: tile 0 sees 128 keys, tile 1 256.
    assert PB.tile_costs([(256, 256)], 128, 128) == [[1, 2]]
    # A 40-key prefix moves every tile's last key by 40.
    assert PB.tile_costs([(256, 296)], 128, 128) == [[2, 3]]
    assert PB.units([[1, 2, 3]], True) == [4, 2]  # tile 2 with tile 0; the middle alone
    assert PB.units([[1, 2, 3]], False) == [1, 2, 3]


def test_serpentine_balances_a_ramp():
    # Eight units of 8 .. 1 tiles (+0.5 each) on four walkers: round-robin loads 13, 11,
    # 9, 7 against an ideal 10; serpentine 10 each.
    ramp = [8, 7, 6, 5, 4, 3, 2, 1]
    assert PB.balance(ramp, 1, 4, False) == pytest.approx(10 / 13)
    assert PB.balance(ramp, 1, 4, True) == pytest.approx(1.0)


def test_a_short_grid_of_pairs_idles():
    # Two requests of two equal tiles on four walkers: two pairs leave two walkers idle
    # (balance 0.5); four single tiles use all four.
    costs = [[3, 3], [3, 3]]
    assert PB.balance(PB.units(costs, True), 1, 4, False) == pytest.approx(0.5)
    assert PB.balance(PB.units(costs, False), 1, 4, True) == pytest.approx(1.0)


def test_replay_shares():
    doc = {"steps": {"tokens": [8192, 8192, 10], "decode_rows": [0, 0, 10], "extend_rows": [1, 2, 0],
                     "attention_us": [600.0, 300.0, 100.0], "floor_us": [300.0, 90.0, 50.0]}}
    rows = PB.replay_shares(doc)
    assert rows[1:] == ["0k, 0: 1, 0.100, 0.50", "8k, 1: 1, 0.600, 0.50", "8k, 2: 1, 0.300, 0.30"]


def test_mixed_split():
    # Decode-only steps of 200 rows: 1000 us at 1M KV tokens, 2000 us at 3M (a line of
    # 0.5 us per 1k). The mixed step: 2.5M KV tokens, 0.5M of them its extend row's, so
    # its decode rows take 1,500 us of its 4,000; the prefill's 760 GFLOP is 1,000 us of
    # floor against its 2,500 us.
    doc = {"steps": {"step": [0, 1, 2], "kv_tokens": [1_000_000, 3_000_000, 2_500_000],
                     "attention_us": [1000.0, 2000.0, 4000.0], "extend_rows": [0, 0, 1],
                     "decode_rows": [200, 200, 200], "flops": [0.0, 0.0, 760e9]}}
    shapes = {"steps": {"step": [0, 1, 2], "extend": [[], [], [[8000, 500_000]]]}}
    rows = PB.mixed_split(doc, shapes)
    assert rows[2:] == ["1: 0.38, 0.40"]
    with pytest.raises(SystemExit):
        PB.mixed_split(doc, {"steps": {"step": [0, 1], "extend": [[], []]}})

