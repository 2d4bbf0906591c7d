"""pagedmha ops on NumPy inputs (CPU) against NumPy references written here (fp64 math).

NumPy has no bf16 or fp8: fp16 tests use float16 arrays; bf16 and fp8 caches are raw
uint16 / uint8 bit buffers passed through pagedmha.view_as, with the conversions below.
Outputs are pre-filled with NaN (or a sentinel) so an element that is not written fails.
"""

import math

import numpy as np
import pytest

import pagedmha as pm

# ---------------------------------------------------------------------------------------
# Number formats (independent of the library)


def bf16_bits(x):
    """fp32 -> bf16 bits, round to nearest even (inputs here are finite)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _fp8_e4m3_table():
    """Values of the 256 E4M3FN codes (NaN at 0x7F / 0xFF)."""
    values = np.empty(256, np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exp, man = (code >> 3) & 0xF, code & 0x7
        if exp == 0xF and man == 0x7:
            values[code] = np.nan
        elif exp == 0:
            values[code] = sign * man / 8 * 2.0**-6
        else:
            values[code] = sign * (1 + man / 8) * 2.0 ** (exp - 7)
    return values


FP8_VALUES = _fp8_e4m3_table()


def fp8_bits(x):
    """fp64 -> E4M3FN bits: round to nearest even, saturate to +-448, sign kept (-0 -> 0x80)."""
    x = np.asarray(x, np.float64)
    mags = FP8_VALUES[:127]  # codes 0x00..0x7E, increasing
    a = np.minimum(np.abs(x), 448.0)
    hi = np.clip(np.searchsorted(mags, a), 0, 126)
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = a - mags[lo], mags[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    return np.where(np.signbit(x), code | 0x80, code).astype(np.uint8)


def fp8_value(bits):
    return FP8_VALUES[bits]


def ulp(ref, dtype):
    """One unit in the last place of `dtype` at |ref| (the rounding of an fp32 result)."""
    if dtype == "bf16":
        mag = np.maximum(np.abs(ref), 2.0**-126)
        return 2.0 ** (np.floor(np.log2(mag)) - 7)
    return np.spacing(np.abs(ref).astype(np.float16)).astype(np.float64)


# ---------------------------------------------------------------------------------------
# Attention reference (docs/semantics.md section 1), fp64, dense loops over requests


def ref_attention(q, k_slots, v_slots, page_table, seq_lens, rows, page_size, *,
                  bmm1_scale=1.0, bmm2_scale=1.0, window_left=-1, logits_soft_cap=0.0,
                  sinks=None, causal=True):
    """q: [R, Hq, D] float; k_slots, v_slots: [num_slots, Hkv, D] float (dequantised);
    rows: per request b the (first_row, n) of its queries. Returns (out, lse) in fp64."""
    q = np.asarray(q, np.float64)
    hq, hkv = q.shape[1], k_slots.shape[1]
    group = hq // hkv
    out = np.zeros(q.shape, np.float64)
    lse = np.full(q.shape[:2], -np.inf)
    for b, (first, n) in enumerate(rows):
        length = int(seq_lens[b])
        pos = np.arange(length)
        slots = page_table[b, pos // page_size].astype(np.int64) * page_size + pos % page_size
        k = np.repeat(k_slots[slots].astype(np.float64), group, axis=1)  # [L, Hq, D]
        v = np.repeat(v_slots[slots].astype(np.float64), group, axis=1)
        for i in range(n):
            p = length - n + i
            s = bmm1_scale * np.einsum("jhd,hd->hj", k, q[first + i])  # [Hq, L]
            if logits_soft_cap > 0:
                s = logits_soft_cap * np.tanh(s / logits_soft_cap)
            visible = np.ones(length, bool) if not causal else pos <= p
            if window_left >= 0:
                visible &= pos >= p - window_left
            s = np.where(visible[None, :], s, -np.inf)
            sink = np.full(hq, -np.inf) if sinks is None else np.asarray(sinks, np.float64)
            m = np.maximum(s.max(axis=1, initial=-np.inf), sink)
            if np.all(np.isneginf(m)):
                continue
            m_safe = np.where(np.isneginf(m), 0.0, m)
            w = np.exp(s - m_safe[:, None])
            z = w.sum(axis=1) + np.exp(sink - m_safe)
            out[first + i] = bmm2_scale * np.einsum("hj,jhd->hd", w, v) / np.where(z > 0, z, 1)[:, None]
            lse[first + i] = np.where(z > 0, m_safe + np.log(np.where(z > 0, z, 1)), -np.inf)
    return out, lse


def assert_close_ulp(got, ref, dtype, ulps=1):
    """got within `ulps` units of `dtype` rounding of the fp64 reference; no NaN passes."""
    got = np.asarray(got, np.float64)
    assert np.all(np.isfinite(got)), "non-finite output"
    err = np.abs(got - ref)
    bound = ulps * ulp(ref, dtype) + 1e-7
    bad = np.argwhere(err > bound)
    assert bad.size == 0, f"{len(bad)} elements off, first at {bad[0]}: got {got[tuple(bad[0])]}, ref {ref[tuple(bad[0])]}"


def assert_lse(got, ref):
    assert not np.any(np.isnan(got))
    assert np.array_equal(np.isneginf(got), np.isneginf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------
# A paged problem: random pages per request, page 0 reserved, every other slot poisoned


class Paged:
    def __init__(self, rng, seq_lens, page_size, hkv, d, cols=None, extra_pages=3):
        self.seq_lens = np.asarray(seq_lens, np.int32)
        self.page_size = page_size
        need = [-(-int(n) // page_size) for n in self.seq_lens]
        self.cols = cols or max(max(need), 1) + 1
        self.num_pages = 1 + sum(need) + extra_pages
        ids = rng.permutation(np.arange(1, self.num_pages))
        self.page_table = np.full((len(need), self.cols), -1, np.int32)  # stale tails
        at = 0
        for b, n in enumerate(need):
            self.page_table[b, :n] = ids[at:at + n]
            at += n
        self.k = rng.standard_normal((self.num_pages * page_size, hkv, d))
        self.v = rng.standard_normal((self.num_pages * page_size, hkv, d))


def fp16(x):
    return np.asarray(x, np.float16)


# ---------------------------------------------------------------------------------------
# batch_decode


@pytest.mark.parametrize("hq,hkv,d,page_size,n", [(4, 2, 64, 3, 1), (8, 1, 128, 16, 1), (6, 3, 64, 4, 3)])
def test_batch_decode_fp16(rng, hq, hkv, d, page_size, n):
    seq_lens = [17, 5, 1, 40][: 4 if n == 1 else 3]
    if n > 1:
        seq_lens = [max(s, n) for s in seq_lens]
    pg = Paged(rng, seq_lens, page_size, hkv, d)
    bs = len(seq_lens)
    q = fp16(rng.standard_normal((bs * n, hq, d)))
    k, v = fp16(pg.k), fp16(pg.v)
    out = np.full(q.shape, np.nan, np.float16)
    lse = np.full(q.shape[:2], np.nan, np.float32)
    scale = d ** -0.5
    pm.batch_decode(q, k, v, pg.page_table, pg.seq_lens, page_size, n, out,
                    bmm1_scale=scale, lse=lse)
    ref, ref_lse = ref_attention(q, k, v, pg.page_table, pg.seq_lens,
                                 [(b * n, n) for b in range(bs)], page_size, bmm1_scale=scale)
    assert_close_ulp(out, ref, "fp16")
    assert_lse(lse, ref_lse)


def test_batch_decode_features(rng):
    """Window, soft-cap, sinks, bmm2_scale, an empty row (L = 0) and a stale table tail."""
    hq, hkv, d, page_size = 4, 2, 64, 4
    pg = Paged(rng, [23, 0, 9], page_size, hkv, d)
    q = fp16(rng.standard_normal((3, hq, d)) * 3)
    k, v = fp16(pg.k), fp16(pg.v)
    sinks = np.array([-np.inf, 0.0, 3.0, -2.5], np.float32)
    kw = dict(bmm1_scale=0.125, bmm2_scale=1.75, window_left=6, logits_soft_cap=5.0)
    out = np.full(q.shape, np.nan, np.float16)
    lse = np.full(q.shape[:2], np.nan, np.float32)
    pm.batch_decode(q, k, v, pg.page_table, pg.seq_lens, page_size, 1, out, sinks=sinks, lse=lse, **kw)
    ref, ref_lse = ref_attention(q, k, v, pg.page_table, pg.seq_lens, [(0, 1), (1, 1), (2, 1)],
                                 page_size, sinks=sinks, **kw)
    assert_close_ulp(out, ref, "fp16")
    assert_lse(lse, ref_lse)
    assert np.all(out[1] == 0)  # L = 0: no key, output exactly 0, lse = the sink
    np.testing.assert_array_equal(lse[1], sinks)


def test_batch_decode_bf16_bits(rng):
    """bf16 q / cache / out as uint16 bit buffers through view_as."""
    hq, hkv, d, page_size = 4, 4, 64, 8
    pg = Paged(rng, [30, 8], page_size, hkv, d)
    q = bf16_bits(rng.standard_normal((2, hq, d)))
    k, v = bf16_bits(pg.k), bf16_bits(pg.v)
    out = np.full(q.shape, 0x7FC0, np.uint16)  # bf16 NaN
    pm.batch_decode(pm.view_as(q, "bf16"), pm.view_as(k, "bf16"), pm.view_as(v, "bf16"),
                    pg.page_table, pg.seq_lens, page_size, 1, pm.view_as(out, pm.DType.bf16),
                    bmm1_scale=d ** -0.5)
    ref, _ = ref_attention(bf16_value(q), bf16_value(k), bf16_value(v), pg.page_table,
                           pg.seq_lens, [(0, 1), (1, 1)], page_size, bmm1_scale=d ** -0.5)
    assert_close_ulp(bf16_value(out), ref, "bf16")


def test_batch_decode_fp8_cache(rng):
    """fp8 E4M3 cache with non-unit scales: reference on the dequantised cache."""
    hq, hkv, d, page_size = 4, 2, 128, 16
    pg = Paged(rng, [40, 3], page_size, hkv, d)
    k_scale, v_scale = 0.37, 2.5
    kq, vq = fp8_bits(pg.k / k_scale), fp8_bits(pg.v / v_scale)
    q = bf16_bits(rng.standard_normal((2, hq, d)))
    out = np.full(q.shape, 0x7FC0, np.uint16)
    bmm1 = d ** -0.5 * k_scale
    pm.batch_decode(pm.view_as(q, "bf16"), pm.view_as(kq, "fp8_e4m3"), pm.view_as(vq, "fp8_e4m3"),
                    pg.page_table, pg.seq_lens, page_size, 1, pm.view_as(out, "bf16"),
                    bmm1_scale=bmm1, bmm2_scale=v_scale)
    ref, _ = ref_attention(bf16_value(q), fp8_value(kq), fp8_value(vq), pg.page_table,
                           pg.seq_lens, [(0, 1), (1, 1)], page_size, bmm1_scale=bmm1,
                           bmm2_scale=v_scale)
    assert_close_ulp(bf16_value(out), ref, "bf16")


def test_batch_decode_strided_views(rng):
    """q sliced from a fused QKV buffer, out a strided slice, a 4-d HND cache view, a
    page table with a row stride: all read and written in place, no copies."""
    hq, hkv, d, page_size = 4, 2, 64, 4
    pg = Paged(rng, [13, 7], page_size, hkv, d)
    qkv = fp16(rng.standard_normal((2, hq + 2 * hkv, d)))
    q = qkv[:, :hq]
    assert not q.flags.c_contiguous
    # HND storage [num_pages, Hkv, P, D] seen as [num_pages, P, Hkv, D].
    def hnd(x):
        pages = x.reshape(pg.num_pages, page_size, hkv, d).transpose(0, 2, 1, 3).copy()
        return pages.transpose(0, 2, 1, 3)
    k, v = hnd(fp16(pg.k)), hnd(fp16(pg.v))
    assert not k.flags.c_contiguous
    wide = np.full((pg.page_table.shape[0], 2 * pg.cols + 1), -1, np.int32)
    wide[:, : pg.cols] = pg.page_table
    table = wide[:, : pg.cols]  # row stride 2 * cols + 1
    out_buf = np.full((2, 2 * hq, d), np.nan, np.float16)
    out = out_buf[:, ::2]
    pm.batch_decode(q, k, v, table, pg.seq_lens, page_size, 1, out, bmm1_scale=0.2)
    ref, _ = ref_attention(q, fp16(pg.k), fp16(pg.v), pg.page_table, pg.seq_lens, [(0, 1), (1, 1)],
                           page_size, bmm1_scale=0.2)
    assert_close_ulp(out, ref, "fp16")
    assert np.all(np.isnan(out_buf[:, 1::2]))  # the interleaved heads are untouched


# ---------------------------------------------------------------------------------------
# batch_prefill


@pytest.mark.parametrize("causal", [True, False])
def test_batch_prefill_ragged_with_prefix(rng, causal):
    hq, hkv, d, page_size = 6, 2, 64, 5
    q_lens = np.array([7, 1, 0, 12], np.int32)
    prefix = np.array([9, 0, 4, 3], np.int32)
    seq_lens = q_lens + prefix
    pg = Paged(rng, seq_lens, page_size, hkv, d)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = fp16(rng.standard_normal((int(cu[-1]), hq, d)))
    k, v = fp16(pg.k), fp16(pg.v)
    sinks = np.array([0.5, -1.0, 2.0, -np.inf, 0.0, 1.0], np.float32)
    kw = dict(bmm1_scale=d ** -0.5, window_left=8 if causal else -1)
    out = np.full(q.shape, np.nan, np.float16)
    lse = np.full(q.shape[:2], np.nan, np.float32)
    pm.batch_prefill(q, k, v, pg.page_table, pg.seq_lens, cu, page_size, int(q_lens.max()), out,
                     sinks=sinks, causal=causal, lse=lse, **kw)
    rows = [(int(cu[b]), int(q_lens[b])) for b in range(len(q_lens))]
    ref, ref_lse = ref_attention(q, k, v, pg.page_table, pg.seq_lens, rows, page_size,
                                 sinks=sinks, causal=causal, **kw)
    assert_close_ulp(out, ref, "fp16")
    assert_lse(lse, ref_lse)


def test_batch_prefill_queries_before_first_key(rng):
    """n > L: the first n - L queries see no key (out 0, lse -inf)."""
    hq, hkv, d, page_size = 2, 1, 64, 4
    pg = Paged(rng, [3], page_size, hkv, d)
    cu = np.array([0, 5], np.int32)
    q = fp16(rng.standard_normal((5, hq, d)))
    out = np.full(q.shape, np.nan, np.float16)
    lse = np.full(q.shape[:2], np.nan, np.float32)
    pm.batch_prefill(q, fp16(pg.k), fp16(pg.v), pg.page_table, pg.seq_lens, cu, page_size, 5, out,
                     bmm1_scale=1.0, lse=lse)
    ref, ref_lse = ref_attention(q, fp16(pg.k), fp16(pg.v), pg.page_table, pg.seq_lens, [(0, 5)],
                                 page_size)
    assert np.all(out[:2] == 0) and np.all(np.isneginf(lse[:2]))
    assert_close_ulp(out, ref, "fp16")
    assert_lse(lse, ref_lse)


# ---------------------------------------------------------------------------------------
# append_kv


def _slots(rng, num_slots, t):
    return rng.choice(np.arange(1, num_slots), size=t, replace=False).astype(np.int32)


@pytest.mark.parametrize("four_d", [False, True])
def test_append_kv_fp16(rng, four_d):
    page_size, hkv, d, num_pages, t = 4, 2, 64, 6, 9
    k_cache = fp16(rng.standard_normal((num_pages * page_size, hkv, d)))
    v_cache = fp16(rng.standard_normal((num_pages * page_size, hkv, d)))
    k_before, v_before = k_cache.copy(), v_cache.copy()
    k, v = fp16(rng.standard_normal((t, hkv, d))), fp16(rng.standard_normal((t, hkv, d)))
    loc = _slots(rng, num_pages * page_size, t)
    shape4 = (num_pages, page_size, hkv, d)
    kc, vc = (k_cache.reshape(shape4), v_cache.reshape(shape4)) if four_d else (k_cache, v_cache)
    pm.append_kv(k, v, kc, vc, loc, page_size)
    k_before[loc], v_before[loc] = k, v
    np.testing.assert_array_equal(k_cache, k_before)  # named slots written, nothing else
    np.testing.assert_array_equal(v_cache, v_before)


def test_append_kv_bf16_strided_source(rng):
    """k, v as strided slices of a fused buffer, bf16 bits copied exactly."""
    page_size, hkv, d, num_pages, t = 8, 2, 64, 3, 5
    fused = bf16_bits(rng.standard_normal((t, 3 * hkv, d)))
    k, v = fused[:, hkv:2 * hkv], fused[:, 2 * hkv:]
    k_cache = np.zeros((num_pages * page_size, hkv, d), np.uint16)
    v_cache = np.zeros_like(k_cache)
    loc = _slots(rng, num_pages * page_size, t)
    pm.append_kv(pm.view_as(k, "bf16"), pm.view_as(v, "bf16"), pm.view_as(k_cache, "bf16"),
                 pm.view_as(v_cache, "bf16"), loc, page_size)
    want_k, want_v = np.zeros_like(k_cache), np.zeros_like(v_cache)
    want_k[loc], want_v[loc] = k, v
    np.testing.assert_array_equal(k_cache, want_k)
    np.testing.assert_array_equal(v_cache, want_v)


def test_append_kv_fp8_quantises(rng):
    page_size, hkv, d, num_pages, t = 4, 1, 64, 4, 6
    k = fp16(rng.standard_normal((t, hkv, d)) * 50)  # some beyond 448 * scale saturate
    v = fp16(rng.standard_normal((t, hkv, d)))
    k[0, 0, :4] = [1e4, -1e4, 0.0, -0.0]
    k_cache = np.full((num_pages * page_size, hkv, d), 0x11, np.uint8)
    v_cache = np.full_like(k_cache, 0x22)
    loc = _slots(rng, num_pages * page_size, t)
    k_scale, v_scale = 0.5, 0.03
    pm.append_kv(k, v, pm.view_as(k_cache, "fp8_e4m3"), pm.view_as(v_cache, "fp8_e4m3"), loc,
                 page_size, k_scale, v_scale)
    want_k, want_v = np.full_like(k_cache, 0x11), np.full_like(v_cache, 0x22)
    want_k[loc] = fp8_bits(k.astype(np.float64) / k_scale)
    want_v[loc] = fp8_bits(v.astype(np.float64) / v_scale)
    np.testing.assert_array_equal(k_cache, want_k)
    np.testing.assert_array_equal(v_cache, want_v)
    assert list(k_cache[loc[0], 0, :4]) == [0x7E, 0xFE, 0x00, 0x80]  # +-448, +-0


# ---------------------------------------------------------------------------------------
# Metadata helpers


def test_gather_page_table_with_padding(rng):
    max_req, max_pages, page_size = 6, 10, 4
    req_to_page = rng.integers(1, 1000, (max_req + 1, max_pages), dtype=np.int32)
    req_to_page[0] = 0
    idx = np.array([3, 1, 5, 0, 2], np.int32)
    seq_lens = np.array([9, 0, 32, 1, 13], np.int32)  # row 2 fills all cols
    bs, cols = 4, 8
    out = np.full((6, 9), -7, np.int32)
    pm.gather_page_table_with_padding(req_to_page, idx, seq_lens, out, bs, cols, page_size)
    want = np.full_like(out, -7)
    for r in range(bs):
        n = -(-int(seq_lens[r]) // page_size)
        want[r, :cols] = 0
        want[r, :min(n, cols)] = req_to_page[idx[r], :min(n, cols)]
    np.testing.assert_array_equal(out, want)


def test_cumsum_lengths(rng):
    lengths = rng.integers(0, 100, 37, dtype=np.int32)
    out = np.full(38, -1, np.int32)
    pm.cumsum_lengths(lengths, out)
    np.testing.assert_array_equal(out, np.concatenate([[0], np.cumsum(lengths)]))
    empty = np.full(1, -1, np.int32)
    pm.cumsum_lengths(np.zeros(0, np.int32), empty)
    assert empty[0] == 0


def test_clamp_seq_lens_in_place():
    seq_lens = np.array([0, 1, 3, 4, 100], np.int32)
    out = np.full(5, -1, np.int32)
    pm.clamp_seq_lens(seq_lens, 3, out)
    np.testing.assert_array_equal(out, [3, 3, 3, 4, 100])
    pm.clamp_seq_lens(seq_lens, 4, seq_lens)
    np.testing.assert_array_equal(seq_lens, [4, 4, 4, 4, 100])


def _slot(table, r, pos, page_size):
    return int(table[r, pos // page_size]) * page_size + pos % page_size


@pytest.mark.parametrize("n", [1, 3])
def test_decode_write_slots(rng, n):
    page_size = 4
    table = rng.integers(1, 500, (4, 6), dtype=np.int32)
    seq_lens = np.array([5, 0, 17, 2], np.int32)
    out = np.full(4 * n + 2, -1, np.int32)
    pm.decode_write_slots(table, seq_lens, page_size, n, out[: 4 * n])
    want = [_slot(table, r, max(int(seq_lens[r]) - n + j, 0), page_size)
            for r in range(4) for j in range(n)]
    np.testing.assert_array_equal(out[: 4 * n], want)
    assert np.all(out[4 * n:] == -1)


def test_extend_write_slots(rng):
    page_size = 3
    table = rng.integers(1, 500, (3, 8), dtype=np.int32)
    prefix = np.array([4, 0, 7], np.int32)
    q_lens = np.array([5, 0, 9], np.int32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    out = np.full(int(cu[-1]), -1, np.int32)
    pm.extend_write_slots(table, prefix, cu, page_size, out)
    want = [_slot(table, r, int(prefix[r]) + i, page_size)
            for r in range(3) for i in range(int(q_lens[r]))]
    np.testing.assert_array_equal(out, want)


# ---------------------------------------------------------------------------------------
# bmm1_scale=None (the default) is head_dim^-0.5, as in FlashAttention and FlashInfer


def _softmax_attention(q, k, v, scale, visible):
    """Dense softmax(scale * q.k) v in fp64 for one request: q [n, H, D], k / v [L, H, D],
    visible [n, L] bool."""
    s = scale * np.einsum("ihd,jhd->hij", q.astype(np.float64), k.astype(np.float64))
    s = np.where(visible[None], s, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    return np.einsum("hij,jhd->ihd", w, v.astype(np.float64))


@pytest.mark.parametrize("d", [64, 128, 256])
def test_default_bmm1_scale_is_rsqrt_head_dim(rng, d):
    """Called without bmm1_scale, batch_decode and batch_prefill scale the logits by
    d ** -0.5 (not 1): checked against a softmax computed here, on a one-page-per-token
    cache so the keys are read straight from their slots."""
    h, page_size, length, n = 2, 1, 9, 4
    k = fp16(rng.standard_normal((length + 1, h, d)) * 2)  # slot 0: the reserved page
    v = fp16(rng.standard_normal((length + 1, h, d)))
    table = np.arange(1, length + 1, dtype=np.int32)[None]  # token j in page j + 1
    seq_lens = np.array([length], np.int32)
    q = fp16(rng.standard_normal((n, h, d)) * 2)
    scaled = _softmax_attention(q, k[1:], v[1:], d ** -0.5,
                                np.arange(length)[None] <= np.arange(length - n, length)[:, None])
    unscaled = _softmax_attention(q, k[1:], v[1:], 1.0, np.ones((n, length), bool))

    out = np.full(q[-1:].shape, np.nan, np.float16)
    pm.batch_decode(q[-1:], k, v, table, seq_lens, page_size, 1, out)
    close = dict(rtol=1e-3, atol=1e-3)  # fp16 rounding of outputs of magnitude < 4
    np.testing.assert_allclose(out, scaled[-1:], **close)
    assert not np.allclose(scaled[-1:], unscaled[-1:], atol=1e-2)  # the scale matters here

    out = np.full(q.shape, np.nan, np.float16)
    pm.batch_prefill(q, k, v, table, seq_lens, np.array([0, n], np.int32), page_size, n, out)
    np.testing.assert_allclose(out, scaled, **close)

    out = np.full(q.shape, np.nan, np.float16)  # an explicit value is used as given
    pm.batch_prefill(q, k, v, table, seq_lens, np.array([0, n], np.int32), page_size, n, out,
                     bmm1_scale=1.0, causal=False)
    np.testing.assert_allclose(out, unscaled, **close)


def test_decode_workspace_size_cpu():
    assert pm.decode_workspace_size("cpu", 64, 1, 32, 8, 128) == 0
    with pytest.raises(pm.Error, match=r"decode_workspace_size: device: expected .*got \"tpu\""):
        pm.decode_workspace_size("tpu", 1, 1, 1, 1, 64)


# ---------------------------------------------------------------------------------------
# Errors arrive as pagedmha.Error (a ValueError) with the library's message


def test_error_is_value_error():
    assert issubclass(pm.Error, ValueError)


def test_error_messages(rng):
    pg = Paged(rng, [5], 4, 1, 64)
    q = fp16(rng.standard_normal((1, 2, 64)))
    k, v = fp16(pg.k), fp16(pg.v)
    out = np.zeros_like(q)
    with pytest.raises(pm.Error, match=r"^batch_decode: seq_lens: expected dtype int32, got int64$"):
        pm.batch_decode(q, k, v, pg.page_table, pg.seq_lens.astype(np.int64), 4, 1, out)
    with pytest.raises(pm.Error, match=r"^batch_decode: q: expected a dtype pagedmha reads \(bf16, .*; ops.h gives each argument.s\), got float64$"):
        pm.batch_decode(q.astype(np.float64), k, v, pg.page_table, pg.seq_lens, 4, 1, out)
    with pytest.raises(pm.Error, match=r"^batch_decode: .*head dim 64, 128 or 256, got 32$"):
        pm.batch_decode(q[..., :32], k[..., :32], v[..., :32], pg.page_table, pg.seq_lens, 4, 1,
                        out[..., :32])
    with pytest.raises(pm.Error, match=r"^batch_decode: q: expected a contiguous last dim"):
        pm.batch_decode(np.zeros((1, 2, 128), np.float16)[..., ::2], k, v, pg.page_table,
                        pg.seq_lens, 4, 1, out)
    with pytest.raises(pm.Error, match=r"^cumsum_lengths: out: expected shape \[3\], got \[2\]$"):
        pm.cumsum_lengths(np.zeros(2, np.int32), np.zeros(2, np.int32))
    with pytest.raises(pm.Error, match=r"^view_as: array: expected 2-byte elements for bf16"):
        pm.view_as(np.zeros(3, np.float32), "bf16")
    with pytest.raises(pm.Error, match=r"^append_kv: k_cache: expected dtype"):
        pm.append_kv(q, q, np.zeros((8, 2, 64), np.float32), np.zeros((8, 2, 64), np.float32),
                     np.zeros(1, np.int32), 4)


def test_error_bad_slot_on_cpu(rng):
    k_cache = np.zeros((8, 1, 64), np.float16)
    k = fp16(rng.standard_normal((1, 1, 64)))
    with pytest.raises(pm.Error, match=r"append_kv: out_cache_loc"):
        pm.append_kv(k, k, k_cache, k_cache.copy(), np.array([8], np.int32), 4)


def test_non_array_names_the_argument(rng):
    """D14: a list, str or float where an array is expected is a pagedmha.Error
    naming the op, the argument and what was given (not nanobind's signature dump)."""
    with pytest.raises(pm.Error, match=r"^cumsum_lengths: lengths: expected an array .*got list \[1, 2, 3\]$"):
        pm.cumsum_lengths([1, 2, 3], np.zeros(4, np.int32))
    with pytest.raises(pm.Error, match=r"^cumsum_lengths: out: expected an array .*got list"):
        pm.cumsum_lengths(np.array([1, 2], np.int32), [0, 0, 0])
    pg = Paged(rng, [5], 4, 1, 64)
    q = fp16(rng.standard_normal((1, 2, 64)))
    k, v = fp16(pg.k), fp16(pg.v)
    out = np.zeros_like(q)
    with pytest.raises(pm.Error, match=r"^batch_decode: q: expected an array .*got str 'hello'$"):
        pm.batch_decode("hello", k, v, pg.page_table, pg.seq_lens, 4, 1, out)
    with pytest.raises(pm.Error, match=r"^batch_decode: seq_lens: expected an array .*got float 5.0$"):
        pm.batch_decode(q, k, v, pg.page_table, 5.0, 4, 1, out)


def test_read_only_inputs_accepted_outputs_rejected(rng):
    """D14: inputs may be read-only (zero-copy still); outputs and caches must be writable."""
    pg = Paged(rng, [5, 9], 4, 1, 64)
    q = fp16(rng.standard_normal((2, 2, 64)))
    k, v = fp16(pg.k), fp16(pg.v)
    out = np.full_like(q, np.nan)
    pm.batch_decode(q, k, v, pg.page_table, pg.seq_lens, 4, 1, out)
    want = out.copy()
    for a in (q, k, v, pg.page_table, pg.seq_lens):
        a.setflags(write=False)
    out[...] = np.nan
    pm.batch_decode(q, k, v, pg.page_table, pg.seq_lens, 4, 1, out)
    np.testing.assert_array_equal(out, want)
    out.setflags(write=False)
    with pytest.raises(pm.Error, match=r"^batch_decode: out: expected a writable array .*got a read-only array$"):
        pm.batch_decode(q, k, v, pg.page_table, pg.seq_lens, 4, 1, out)
    k_cache = np.zeros((8, 1, 64), np.float16)
    k_cache.setflags(write=False)
    new = fp16(rng.standard_normal((1, 1, 64)))
    new.setflags(write=False)
    with pytest.raises(pm.Error, match=r"^append_kv: k_cache: expected a writable array"):
        pm.append_kv(new, new, k_cache, np.zeros((8, 1, 64), np.float16), np.array([3], np.int32), 4)


def test_read_only_typed_views(rng):
    """view_as takes read-only bit buffers: a read-only bf16 q and cache give the same
    output as writable ones; a read-only out viewed as bf16 is refused by the op, naming
    out, and left unchanged."""
    pg = Paged(rng, [7, 12], 4, 2, 64)
    q = bf16_bits(rng.standard_normal((2, 2, 64)))
    k, v = bf16_bits(pg.k), bf16_bits(pg.v)
    out = np.full(q.shape, 0x7FC0, np.uint16)
    args = (pg.page_table, pg.seq_lens, 4, 1)
    pm.batch_decode(pm.view_as(q, "bf16"), pm.view_as(k, "bf16"), pm.view_as(v, "bf16"), *args,
                    pm.view_as(out, "bf16"))
    want = out.copy()
    assert not np.any(want == 0x7FC0)  # every element written
    for a in (q, k, v):
        a.setflags(write=False)
    out[...] = 0x7FC0
    pm.batch_decode(pm.view_as(q, "bf16"), pm.view_as(k, "bf16"), pm.view_as(pm.view_as(v, "fp16"), "bf16"),
                    *args, pm.view_as(out, "bf16"))
    np.testing.assert_array_equal(out, want)
    frozen = out.copy()
    frozen.setflags(write=False)
    with pytest.raises(pm.Error, match=r"^batch_decode: out: expected a writable array .*got a read-only array$"):
        pm.batch_decode(pm.view_as(q, "bf16"), pm.view_as(k, "bf16"), pm.view_as(v, "bf16"), *args,
                        pm.view_as(frozen, "bf16"))
    np.testing.assert_array_equal(frozen, want)


def test_empty_numpy_arrays_are_no_ops():
    """D5: NumPy gives empty arrays strides 0; T = 0 and batch 0 are no-ops."""
    k_cache = np.zeros((32, 2, 64), np.float16)
    k0 = np.zeros((0, 2, 64), np.float16)
    assert k0.strides == (0, 0, 0)
    pm.append_kv(k0, k0, k_cache, k_cache.copy(), np.zeros(0, np.int32), 4)
    assert not k_cache.any()
    q0 = np.zeros((0, 4, 64), np.float16)
    pm.batch_decode(q0, k_cache, k_cache, np.zeros((0, 4), np.int32), np.zeros(0, np.int32), 4, 1,
                    q0.copy())


def test_debug_validation_toggle():
    assert pm.debug_validation() is False
    pm.set_debug_validation(True)
    try:
        assert pm.debug_validation() is True
    finally:
        pm.set_debug_validation(False)


def test_stream_default_without_torch():
    """stream=None on NumPy inputs: no framework lookup imports anything; explicit ints pass."""
    import sys
    lengths, out = np.arange(4, dtype=np.int32), np.zeros(5, np.int32)
    had_torch = "torch" in sys.modules
    pm.cumsum_lengths(lengths, out)
    pm.cumsum_lengths(lengths, out, stream=0)
    assert ("torch" in sys.modules) == had_torch
    np.testing.assert_array_equal(out, [0, 0, 1, 3, 6])


def test_bench_metrics_count_pairs_like_the_library():
    """bench/metrics.py (stdlib only, for machines without the module) and the library's
    MaskVariant agree on every flop count."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import metrics
    for causal in (True, False):
        for L in (1, 7, 130, 4096):
            for n in (1, 5, L, L + 3):
                for w in (-1, 0, 3, 127):
                    assert metrics.visible_pairs(n, L, w, causal) == pm.visible_pairs(L, n, w, causal), \
                        (causal, L, n, w)
