"""pagedmha.MhaBackend on NumPy inputs (CPU): an extend step then a decode step of an
engine-shaped batch (req_to_page, req_pool_indices, out_cache_loc), checked against the
fp64 attention reference over the cache the backend wrote."""

import numpy as np
import pytest

import pagedmha as pm
from test_ops_numpy import assert_close_ulp, fp16, ref_attention

HQ, HKV, D, P, CONTEXT, MAX_BS = 4, 2, 64, 4, 64, 4


def _engine(rng, num_pages=40):
    """req_to_page with 8 distinct pages per request row (row 0: padding), an empty pool."""
    pages = rng.permutation(np.arange(1, num_pages))
    req_to_page = np.zeros((MAX_BS + 1, CONTEXT // P), np.int32)
    for r in range(1, MAX_BS + 1):
        req_to_page[r, :8] = pages[(r - 1) * 8: r * 8]
    k_cache = np.zeros((num_pages * P, HKV, D), np.float16)
    return req_to_page, k_cache, np.zeros_like(k_cache)


def _slots(req_to_page, rows, positions):
    return np.array([req_to_page[r, p // P] * P + p % P for r, p in zip(rows, positions)], np.int32)


def test_backend_registry():
    assert {"pagedmha", "trtllm"} <= set(pm.registered_backends())
    with pytest.raises(pm.Error, match=r"^create_backend: name: expected one of .*got 'flashinfer'"):
        pm.create_backend("flashinfer", page_size=P, context_len=CONTEXT)


@pytest.mark.parametrize("scaling", [{"scaling": D ** -0.5}, {}], ids=["given", "default"])
def test_backend_extend_then_decode(rng, scaling):
    """LayerSpec's scaling left out (None) is D ** -0.5, the reference's scale."""
    req_to_page, k_cache, v_cache = _engine(rng)
    backend = pm.create_backend("trtllm", page_size=P, context_len=CONTEXT, kv_cache_dtype="fp16",
                                out_dtype="fp16", max_bs=MAX_BS, num_q_heads=HQ,
                                num_kv_heads=HKV, head_dim=D)
    layer = pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D,
                         window_left=-1, **scaling)
    req_pool_indices = np.array([2, 4, 1], np.int32)
    bs = 3

    # Extend: prompts of 6, 1, 9 tokens, no cached prefix.
    ext = np.array([6, 1, 9], np.int32)
    seq_lens = ext.copy()
    rows = np.repeat(req_pool_indices, ext)
    positions = np.concatenate([np.arange(n) for n in ext])
    loc = _slots(req_to_page, rows, positions)
    t = int(ext.sum())
    q = fp16(rng.standard_normal((t, HQ * D)))
    k = fp16(rng.standard_normal((t, HKV * D)))
    v = fp16(rng.standard_normal((t, HKV * D)))
    out = np.full((t, HQ * D), np.nan, np.float16)
    batch = pm.ForwardBatch(forward_mode=pm.ForwardMode.extend, batch_size=bs,
                            req_pool_indices=req_pool_indices, seq_lens=seq_lens,
                            req_to_page=req_to_page, out_cache_loc=loc, seq_lens_cpu=seq_lens,
                            extend_seq_lens_cpu=ext)
    backend.init_forward_metadata(batch)
    result = backend.forward_extend(q, k, v, layer, k_cache, v_cache, loc, bs, out)
    assert result is out
    np.testing.assert_array_equal(k_cache[loc], k.reshape(t, HKV, D))  # K/V written first
    table = req_to_page[req_pool_indices]
    cu = np.concatenate([[0], np.cumsum(ext)])
    ref, _ = ref_attention(q.reshape(t, HQ, D), k_cache, v_cache, table, seq_lens,
                           [(int(cu[b]), int(ext[b])) for b in range(bs)], P, bmm1_scale=D ** -0.5)
    assert_close_ulp(out.reshape(t, HQ, D), ref, "fp16")

    # Decode: one token per request; a [bs, Hq, D] out comes back as [bs, Hq * D].
    seq_lens = seq_lens + 1
    loc = _slots(req_to_page, req_pool_indices, seq_lens - 1)
    q = fp16(rng.standard_normal((bs, HQ, D)))
    k = fp16(rng.standard_normal((bs, HKV, D)))
    v = fp16(rng.standard_normal((bs, HKV, D)))
    out = np.full((bs, HQ, D), np.nan, np.float16)
    batch = pm.ForwardBatch(forward_mode=pm.ForwardMode.decode, batch_size=bs,
                            req_pool_indices=req_pool_indices, seq_lens=seq_lens,
                            req_to_page=req_to_page, out_cache_loc=loc)
    backend.init_forward_metadata(batch)
    result = backend.forward_decode(q, k, v, layer, k_cache, v_cache, loc, bs, out)
    assert result.shape == (bs, HQ * D) and np.shares_memory(result, out)
    ref, _ = ref_attention(q, k_cache, v_cache, table, seq_lens, [(b, 1) for b in range(bs)], P,
                           bmm1_scale=D ** -0.5)
    assert_close_ulp(out, ref, "fp16")
    assert backend.select_out_cache_loc(layer, pm.ForwardMode.decode, loc) is loc


def test_backend_read_only_inputs_accepted_outputs_rejected(rng):
    """The backend writes only out and the caches: read-only metadata, q, k, v and sinks
    give the same step; a read-only out or cache is an error naming it."""
    req_to_page, k_cache, v_cache = _engine(rng)
    backend = pm.create_backend("trtllm", page_size=P, context_len=CONTEXT, kv_cache_dtype="fp16",
                                out_dtype="fp16", max_bs=MAX_BS, num_q_heads=HQ,
                                num_kv_heads=HKV, head_dim=D)
    sinks = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    layer = pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, window_left=-1,
                         sinks=sinks)
    rpi = np.array([2, 1], np.int32)
    seq_lens = np.array([3, 5], np.int32)
    loc = _slots(req_to_page, rpi, seq_lens - 1)
    q = fp16(rng.standard_normal((2, HQ * D)))
    k = fp16(rng.standard_normal((2, HKV * D)))
    v = fp16(rng.standard_normal((2, HKV * D)))

    def step(out):
        batch = pm.ForwardBatch(forward_mode=pm.ForwardMode.decode, batch_size=2, req_pool_indices=rpi,
                                seq_lens=seq_lens, req_to_page=req_to_page, out_cache_loc=loc)
        backend.init_forward_metadata(batch)
        return backend.forward_decode(q, k, v, layer, k_cache, v_cache, loc, 2, out)

    want = step(np.full((2, HQ * D), np.nan, np.float16)).copy()
    for a in (rpi, seq_lens, req_to_page, loc, q, k, v, sinks):
        a.setflags(write=False)
    np.testing.assert_array_equal(step(np.full((2, HQ * D), np.nan, np.float16)), want)
    out = np.zeros((2, HQ * D), np.float16)
    out.setflags(write=False)
    with pytest.raises(pm.Error, match=r"^MhaBackend.forward_decode: out: expected a writable array"):
        step(out)
    k_cache.setflags(write=False)
    with pytest.raises(pm.Error, match=r"^MhaBackend.forward_decode: k_cache: expected a writable array"):
        step(np.zeros((2, HQ * D), np.float16))


def test_backend_bad_batch_size(rng):
    req_to_page, _, _ = _engine(rng)
    backend = pm.create_backend(page_size=P, context_len=CONTEXT, kv_cache_dtype="fp16",
                                out_dtype="fp16", max_bs=2, num_q_heads=HQ, num_kv_heads=HKV,
                                head_dim=D)
    seq_lens = np.ones(3, np.int32)
    batch = pm.ForwardBatch(forward_mode=pm.ForwardMode.decode, batch_size=3,
                            req_pool_indices=np.arange(3, dtype=np.int32), seq_lens=seq_lens,
                            req_to_page=req_to_page)
    with pytest.raises(pm.Error, match=r"batch_size: expected 0\.\.2 \(max_bs\), got 3$"):
        backend.init_forward_metadata(batch)


def test_backend_register_layers_validates_geometry():
    backend = pm.create_backend("pagedmha", page_size=P, context_len=CONTEXT, max_bs=MAX_BS)
    ok = pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, scaling=1.0)
    bad = pm.LayerSpec(layer_id=1, num_q_heads=HQ, num_kv_heads=HKV, head_dim=96, scaling=1.0)
    backend.register_layers([ok])
    with pytest.raises(pm.Error, match=r"head_dim: .*96"):
        backend.register_layers([ok, bad])
    with pytest.raises(pm.Error, match=r"num_q_heads: expected a positive multiple of num_kv_heads 2, got 3"):
        pm.create_backend("pagedmha", page_size=P, context_len=CONTEXT, num_q_heads=3,
                          num_kv_heads=2, head_dim=D)
