"""pagedmha.merge_attention_states on NumPy inputs: parts computed by batch_decode over
shards of a paged cache merged and compared with the fp64 attention over all keys, and
the merge formula checked in fp64 (empty parts, sinks, in place, bf16 bits, errors)."""

import numpy as np
import pytest

import pagedmha as pm
from test_ops_numpy import Paged, assert_lse, bf16_bits, bf16_value, fp16, ref_attention

NEG_INF = np.float32(-np.inf)


def ref_merge(o, lse, sinks=None):
    """The merge in fp64: o [K, T, H, D], lse [K, T, H] -> (out [T, H, D], lse [T, H])."""
    o = np.asarray(o, np.float64)
    lse = np.asarray(lse, np.float64)
    sink = np.full(lse.shape[2], -np.inf) if sinks is None else np.asarray(sinks, np.float64)
    m = np.maximum(lse.max(axis=0, initial=-np.inf), sink[None, :])
    m_safe = np.where(np.isneginf(m), 0.0, m)
    w = np.where(np.isneginf(lse), 0.0, np.exp(lse - m_safe))  # [K, T, H]
    z = w.sum(axis=0) + np.exp(sink[None, :] - m_safe)
    terms = np.where(w[..., None] > 0, w[..., None] * np.nan_to_num(o), 0.0)  # empty parts unread
    out = np.where(np.isneginf(m)[..., None], 0.0, terms.sum(axis=0) / np.where(z > 0, z, 1)[..., None])
    return out, np.where(np.isneginf(m), -np.inf, m_safe + np.log(np.where(z > 0, z, 1)))


def shard(pg, k, num_ranks):
    """Rank k's page table and lengths when pages are dealt round-robin over num_ranks."""
    table = np.zeros_like(pg.page_table)
    lens = np.zeros_like(pg.seq_lens)
    for b, length in enumerate(pg.seq_lens):
        mine = [c for c in range(-(-int(length) // pg.page_size)) if c % num_ranks == k]
        table[b, :len(mine)] = pg.page_table[b, mine]
        lens[b] = sum(min(pg.page_size, int(length) - c * pg.page_size) for c in mine)
    return table, lens


@pytest.mark.parametrize("num_ranks", [1, 2, 3])
def test_merge_decode_shards_fp16(rng, num_ranks):
    hq, hkv, d, page_size = 4, 2, 64, 4
    pg = Paged(rng, [0, 3, 17, 40], page_size, hkv, d)
    q = fp16(rng.standard_normal((4, hq, d)))
    k, v = fp16(pg.k), fp16(pg.v)
    sinks = np.array([-np.inf, 0.0, 2.0, -1.0], np.float32)
    o = np.full((num_ranks,) + q.shape, np.nan, np.float16)
    lse = np.full((num_ranks,) + q.shape[:2], np.nan, np.float32)
    for r in range(num_ranks):
        table, lens = shard(pg, r, num_ranks)
        pm.batch_decode(q, k, v, table, lens, page_size, 1, o[r], bmm1_scale=0.125, lse=lse[r])
    out = np.full(q.shape, np.nan, np.float16)
    out_lse = np.full(q.shape[:2], np.nan, np.float32)
    pm.merge_attention_states(o, lse, out, out_lse=out_lse, sinks=sinks)
    ref, ref_lse = ref_attention(q, k, v, pg.page_table, pg.seq_lens, [(b, 1) for b in range(4)],
                                 page_size, bmm1_scale=0.125, sinks=sinks)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=0, atol=4e-3)
    assert np.all(out[0] == 0)  # request 0 has no key: exactly 0, lse = the sink
    assert_lse(out_lse, ref_lse)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_merge_formula(rng, dtype):
    k, t, h, d = 5, 7, 3, 128
    o = rng.standard_normal((k, t, h, d)).astype(np.float32)
    lse = (rng.uniform(-40, 40, (k, t, h))).astype(np.float32)
    empty = rng.uniform(size=(k, t, h)) < 0.3
    lse[empty] = NEG_INF
    o[empty] = np.nan  # never read
    lse[:, 0, :] = NEG_INF  # row 0: no key anywhere
    sinks = np.array([-np.inf, 0.5, 30.0], np.float32)
    out_lse = np.full((t, h), np.nan, np.float32)
    if dtype == "bf16":
        bits = bf16_bits(np.nan_to_num(o))
        bits[empty] = 0x7FC1
        out_bits = np.full((t, h, d), 0x7FC1, np.uint16)
        pm.merge_attention_states(pm.view_as(bits, "bf16"), lse, pm.view_as(out_bits, "bf16"),
                                  out_lse=out_lse, sinks=sinks)
        got = bf16_value(out_bits).astype(np.float64)
        ref, ref_lse = ref_merge(np.where(empty[..., None], np.nan, bf16_value(bits)), lse, sinks)
        tol = 2.0**-8
    else:
        out = np.full((t, h, d), np.nan, np.float32)
        pm.merge_attention_states(o, lse, out, out_lse=out_lse, sinks=sinks)
        got = out.astype(np.float64)
        ref, ref_lse = ref_merge(o, lse, sinks)
        tol = 1e-5
    row_max = np.abs(ref).max(axis=2, keepdims=True)
    assert np.all(np.abs(got - ref) <= tol * row_max + 1e-30)
    assert np.all(got[0, 0] == 0) and out_lse[0, 0] == -np.inf  # sink -inf, no key
    assert out_lse[0, 2] == np.float32(30.0)                     # no key: the sink
    assert_lse(out_lse, ref_lse)


def test_merge_in_place_and_all_empty(rng):
    o = rng.standard_normal((3, 4, 2, 64)).astype(np.float32)
    lse = rng.uniform(-3, 3, (3, 4, 2)).astype(np.float32)
    ref, ref_lse = ref_merge(o, lse)
    pm.merge_attention_states(o, lse, o[1], out_lse=lse[1])
    np.testing.assert_allclose(o[1], ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse[1], ref_lse, rtol=1e-6, atol=1e-6)

    none = np.full((2, 4, 2, 64), np.nan, np.float16)
    out = np.full((4, 2, 64), np.nan, np.float16)
    out_lse = np.zeros((4, 2), np.float32)
    pm.merge_attention_states(none, np.full((2, 4, 2), -np.inf, np.float32), out, out_lse=out_lse)
    assert np.all(out == 0) and np.all(np.isneginf(out_lse))
    out[:] = np.nan
    pm.merge_attention_states(np.zeros((0, 4, 2, 64), np.float16), np.zeros((0, 4, 2), np.float32), out,
                              sinks=np.array([1.0, -np.inf], np.float32))  # K = 0
    assert np.all(out == 0)


def test_merge_errors(rng):
    o = np.zeros((2, 3, 2, 64), np.float32)
    lse = np.zeros((2, 3, 2), np.float32)
    out = np.zeros((3, 2, 64), np.float32)
    with pytest.raises(pm.Error, match=r"merge_attention_states: lse: expected shape \[2, 3, 2\], got \[2, 3, 3\]"):
        pm.merge_attention_states(o, np.zeros((2, 3, 3), np.float32), out)
    with pytest.raises(pm.Error, match=r"merge_attention_states: out: expected dtype fp32, got fp16"):
        pm.merge_attention_states(o, lse, out.astype(np.float16))
    with pytest.raises(pm.Error, match=r"merge_attention_states: out: expected o\[i\] itself"):
        pm.merge_attention_states(o, lse, o[1, :, :, :][::-1])
    bad = lse.copy()
    bad[1, 2, 0] = np.nan
    with pytest.raises(pm.Error, match=r"merge_attention_states: lse: .*nan at \[1, 2, 0\]"):
        pm.merge_attention_states(o, bad, out)
    ro = out.copy()
    ro.setflags(write=False)
    with pytest.raises(pm.Error, match=r"^merge_attention_states: out: expected a writable array"):
        pm.merge_attention_states(o, lse, ro)
