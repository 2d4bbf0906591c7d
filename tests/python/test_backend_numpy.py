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


def _draft_backend(**kw):
    return pm.create_backend("pagedmha", page_size=P, context_len=CONTEXT, kv_cache_dtype="fp16",
                             out_dtype="fp16", max_bs=MAX_BS, num_q_heads=HQ, num_kv_heads=HKV,
                             head_dim=D, spec_num_tokens=3, is_draft=True, **kw)


def test_drafter_seq_lens_grow_in_place_past_a_page(rng):
    """The decode slot aliases seq_lens and a drafter advances them in place between its
    steps (docs/semantics.md section 3): a step whose new token opens a page must read that
    page, not the dummy page 0 past the lengths the metadata was built with."""
    req_to_page, k_cache, v_cache = _engine(rng)
    backend = _draft_backend()
    layer = pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    rpi = np.array([3], np.int32)
    ext = np.array([P], np.int32)  # the prompt fills exactly one page
    seq_lens = ext.copy()
    loc = _slots(req_to_page, np.repeat(rpi, P), np.arange(P))
    q, k, v = (fp16(rng.standard_normal((P, h * D))) for h in (HQ, HKV, HKV))
    batch = pm.ForwardBatch(forward_mode=pm.ForwardMode.draft_extend, batch_size=1, req_pool_indices=rpi,
                            seq_lens=seq_lens, req_to_page=req_to_page, out_cache_loc=loc,
                            seq_lens_cpu=seq_lens, extend_seq_lens_cpu=ext)
    backend.init_forward_metadata(batch)
    backend.forward_extend(q, k, v, layer, k_cache, v_cache, loc, 1, np.zeros((P, HQ * D), np.float16))
    table = req_to_page[rpi]
    for step in range(2):  # positions P and P + 1: the second page
        seq_lens += 1  # in place: no init_forward_metadata between draft steps
        loc = _slots(req_to_page, rpi, seq_lens - 1)
        q, k, v = (fp16(rng.standard_normal((1, h * D))) for h in (HQ, HKV, HKV))
        v *= 8  # the new token's V dominates a read that misses it
        out = np.full((1, HQ * D), np.nan, np.float16)
        backend.forward_decode(q, k, v, layer, k_cache, v_cache, loc, 1, out)
        ref, _ = ref_attention(q.reshape(1, HQ, D), k_cache, v_cache, table, seq_lens, [(0, 1)], P,
                               bmm1_scale=D ** -0.5)
        assert_close_ulp(out.reshape(1, HQ, D), ref, "fp16")


def test_rejected_init_leaves_no_metadata(rng):
    """init_forward_metadata that fails after building part of the step (here the draft's
    decode write slots, past its one-column group table) leaves no metadata: the next
    forward call is an error and writes nothing, instead of running on the half-built step."""
    _, k_cache, v_cache = _engine(rng)
    backend = _draft_backend()
    layer = pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    ext = np.array([P, 0], np.int32)
    seq_lens = np.array([P, 2 * P], np.int32)  # request 1's next token needs a second column
    batch = pm.ForwardBatch(forward_mode=pm.ForwardMode.draft_extend, batch_size=2,
                            req_pool_indices=np.array([1, 2], np.int32), seq_lens=seq_lens,
                            seq_lens_cpu=seq_lens, extend_seq_lens_cpu=ext,
                            group_tables={"full_attention": np.array([[5], [6]], np.int32)})
    with pytest.raises(pm.Error, match=r"^MhaBackend.init_forward_metadata: "):
        backend.init_forward_metadata(batch)
    q, k = fp16(rng.standard_normal((P, HQ * D))), fp16(rng.standard_normal((P, HKV * D)))
    before = k_cache.tobytes(), v_cache.tobytes()
    with pytest.raises(pm.Error, match=r"^MhaBackend.forward_extend: metadata: expected init_forward_metadata"):
        backend.forward_extend(q, k, k, layer, k_cache, v_cache, None, 2, np.zeros((P, HQ * D), np.float16))
    assert (k_cache.tobytes(), v_cache.tobytes()) == before


@pytest.mark.parametrize("config_dtype", ["fp8_e4m3", "bf16"])
def test_cache_dtype_must_be_the_configured_one(rng, config_dtype):
    """k_scale / v_scale follow config.kv_cache_dtype: an fp16 cache under an fp8 config
    came out scaled by v_scale, with no error. Any other dtype than the configured one is
    rejected, naming both, before anything is written."""
    req_to_page, k_cache, v_cache = _engine(rng)
    backend = pm.create_backend("pagedmha", page_size=P, context_len=CONTEXT, kv_cache_dtype=config_dtype,
                                out_dtype="fp16", max_bs=MAX_BS, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    layer = pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, k_scale=1.0, v_scale=2.0)
    rpi, seq_lens = np.array([1], np.int32), np.array([3], np.int32)
    loc = _slots(req_to_page, rpi, seq_lens - 1)
    batch = pm.ForwardBatch(forward_mode=pm.ForwardMode.decode, batch_size=1, req_pool_indices=rpi,
                            seq_lens=seq_lens, req_to_page=req_to_page, out_cache_loc=loc)
    backend.init_forward_metadata(batch)
    q, k = fp16(rng.standard_normal((1, HQ * D))), fp16(rng.standard_normal((1, HKV * D)))
    out = np.zeros((1, HQ * D), np.float16)
    before = k_cache.tobytes(), out.tobytes()
    want = config_dtype if config_dtype == "bf16" else "fp8_e4m3"
    with pytest.raises(pm.Error, match=rf"^MhaBackend.forward_decode: k_cache: expected {want} "
                                       r"\(config.kv_cache_dtype\), got fp16 "):
        backend.forward_decode(q, k, k, layer, k_cache, v_cache, loc, 1, out)
    assert (k_cache.tobytes(), out.tobytes()) == before


def test_drafter_group_slots_follow_seq_lens_in_place(rng):
    """A drafter with a cache group and no slots of its own: each draft step's K/V goes to
    pos = seq_len - 1 of the lengths it advances in place (section 6), not to the first
    step's slot again (which overwrote K/V the next steps read)."""
    _, k_cache, v_cache = _engine(rng)
    backend = _draft_backend()
    layer = pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, group_id="full_attention")
    table = np.array([[7, 9, -1, -1] + [-1] * (CONTEXT // P - 4)], np.int32)
    seq_lens = np.array([5], np.int32)
    batch = pm.ForwardBatch(forward_mode=pm.ForwardMode.decode, batch_size=1,
                            req_pool_indices=np.array([1], np.int32), seq_lens=seq_lens,
                            group_tables={"full_attention": table})
    backend.init_forward_metadata(batch)
    for step in range(3):  # positions 4, 5, 6
        pos = int(seq_lens[0]) - 1
        q, k, v = (fp16(rng.standard_normal((1, h * D))) for h in (HQ, HKV, HKV))
        if step == 1:  # the prewrite path; the other steps' forward alone finds the slot
            slot = backend.select_out_cache_loc(layer, pm.ForwardMode.decode, None)
            np.testing.assert_array_equal(slot, [table[0, pos // P] * P + pos % P])
        out = np.full((1, HQ * D), np.nan, np.float16)
        backend.forward_decode(q, k, v, layer, k_cache, v_cache, None, 1, out)
        np.testing.assert_array_equal(k_cache[table[0, pos // P] * P + pos % P], k.reshape(HKV, D))
        ref, _ = ref_attention(q.reshape(1, HQ, D), k_cache, v_cache, table, seq_lens, [(0, 1)], P,
                               bmm1_scale=D ** -0.5)
        assert_close_ulp(out.reshape(1, HQ, D), ref, "fp16")
        seq_lens += 1


def test_block_drafter_runs_its_extend_step(rng):
    """A block-diffusion drafter's own extend step: forward_extend's bs is the step's
    batch_size (it was compared with the drafter's decode rows / N)."""
    req_to_page, k_cache, v_cache = _engine(rng)
    backend = _draft_backend(draft_block_decode=True)
    layer = pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    rpi, ext = np.array([2], np.int32), np.array([5], np.int32)
    seq_lens = ext.copy()
    loc = _slots(req_to_page, np.repeat(rpi, 5), np.arange(5))
    q, k, v = (fp16(rng.standard_normal((5, h * D))) for h in (HQ, HKV, HKV))
    batch = pm.ForwardBatch(forward_mode=pm.ForwardMode.draft_extend, batch_size=1, req_pool_indices=rpi,
                            seq_lens=seq_lens, req_to_page=req_to_page, out_cache_loc=loc,
                            extend_seq_lens_cpu=ext)
    backend.init_forward_metadata(batch)
    out = np.full((5, HQ * D), np.nan, np.float16)
    backend.forward_extend(q, k, v, layer, k_cache, v_cache, loc, 1, out)
    ref, _ = ref_attention(q.reshape(5, HQ, D), k_cache, v_cache, req_to_page[rpi], seq_lens, [(0, 5)], P,
                           bmm1_scale=D ** -0.5)
    assert_close_ulp(out.reshape(5, HQ, D), ref, "fp16")


def _group_extend(backend, n, table, rng):
    """An extend step of one request with n new tokens over the group table `table`."""
    ext = np.array([n], np.int32)
    backend.init_forward_metadata(pm.ForwardBatch(
        forward_mode=pm.ForwardMode.extend, batch_size=1, req_pool_indices=np.array([1], np.int32),
        seq_lens=ext.copy(), seq_lens_cpu=ext.copy(), extend_seq_lens_cpu=ext,
        group_tables={"g": table}))


def test_select_out_cache_loc_numpy_array_stays_readable(rng):
    """With NumPy inputs the group slots come back as an int32 NumPy array (it was a
    one-use DLPack capsule), readable again, and still valid memory after a later step
    outgrew the buffer behind it (it then keeps its own step's slots)."""
    backend = pm.create_backend("pagedmha", page_size=P, context_len=CONTEXT, kv_cache_dtype="fp16",
                                out_dtype="fp16", max_bs=MAX_BS, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    layer = pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, group_id="g")
    table = np.arange(1, CONTEXT // P + 1, dtype=np.int32)[None, :]
    _group_extend(backend, 2, table, rng)
    slots = backend.select_out_cache_loc(layer, pm.ForwardMode.extend, None)
    want = [table[0, 0] * P, table[0, 0] * P + 1]
    assert isinstance(slots, np.ndarray) and slots.dtype == np.int32
    np.testing.assert_array_equal(slots, want)
    np.testing.assert_array_equal(np.asarray(slots), want)  # a second read
    _group_extend(backend, 40, table, rng)  # 40 slots: the group's extend buffer grows
    np.testing.assert_array_equal(slots, want)
    np.testing.assert_array_equal(backend.select_out_cache_loc(layer, pm.ForwardMode.extend, None),
                                  [table[0, p // P] * P + p % P for p in range(40)])


def test_select_out_cache_loc_rejects_a_mode_without_metadata(rng):
    """A forward_mode whose slot this step has no metadata for, or a grouped layer before
    any metadata, is an error: the caller's single-table slots came back for a grouped
    layer, unchecked."""
    backend = pm.create_backend("pagedmha", page_size=P, context_len=CONTEXT, kv_cache_dtype="fp16",
                                out_dtype="fp16", max_bs=MAX_BS, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    grouped = pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, group_id="g")
    plain = pm.LayerSpec(layer_id=1, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    loc = np.array([4], np.int32)
    with pytest.raises(pm.Error, match=r"^MhaBackend.select_out_cache_loc: metadata: expected "
                                       r"init_forward_metadata for this step first"):
        backend.select_out_cache_loc(grouped, pm.ForwardMode.decode, loc)
    assert backend.select_out_cache_loc(plain, pm.ForwardMode.decode, loc) is loc
    table = np.arange(1, CONTEXT // P + 1, dtype=np.int32)[None, :]
    backend.init_forward_metadata(pm.ForwardBatch(
        forward_mode=pm.ForwardMode.decode, batch_size=1, req_pool_indices=np.array([1], np.int32),
        seq_lens=np.array([3], np.int32), group_tables={"g": table}))
    with pytest.raises(pm.Error, match=r"^MhaBackend.select_out_cache_loc: forward_mode: expected the mode of "
                                       r"this step's metadata \(decode\), got extend$"):
        backend.select_out_cache_loc(grouped, pm.ForwardMode.extend, loc)
    np.testing.assert_array_equal(backend.select_out_cache_loc(grouped, pm.ForwardMode.decode, loc),
                                  [table[0, 0] * P + 2])


@pytest.mark.parametrize("grouped", [False, True], ids=["one-table", "group"])
def test_drafter_graph_replay_reads_the_pages_seq_lens_reach(rng, grouped):
    """Graph replay (its CPU form) of a drafter whose seq_lens_buf advances in place after
    the replay's refresh: the graph's table rows are copied whole, so a step whose token
    opens a page reads and (with a group) writes that page, not page 0."""
    req_to_page, k_cache, v_cache = _engine(rng)
    backend = _draft_backend()
    ids = ["g"] if grouped else []
    layer = pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, group_id="g" if grouped else "")
    seq_buf = np.zeros(MAX_BS, np.int32)
    backend.init_cuda_graph_state(MAX_BS, seq_buf, ids)
    backend.init_forward_metadata_capture_cuda_graph(1, pm.ForwardMode.decode, ids)
    rpi = np.array([2], np.int32)
    table = req_to_page[rpi]  # 8 pages, then 0
    seq_buf[0] = P  # the next token opens the request's second page
    extra = {"group_tables": {"g": table}} if grouped else {"req_to_page": req_to_page}
    backend.init_forward_metadata_replay_cuda_graph(pm.ForwardBatch(
        forward_mode=pm.ForwardMode.decode, batch_size=1, req_pool_indices=rpi, seq_lens=seq_buf, **extra))
    for step in range(2):
        seq_buf[0] += 1  # in place, no refresh between the drafter's steps
        pos = int(seq_buf[0]) - 1
        loc = None if grouped else _slots(req_to_page, rpi, [pos])
        q, k, v = (fp16(rng.standard_normal((1, h * D))) for h in (HQ, HKV, HKV))
        out = np.full((1, HQ * D), np.nan, np.float16)
        backend.forward_decode(q, k, v, layer, k_cache, v_cache, loc, 1, out)
        np.testing.assert_array_equal(k_cache[table[0, pos // P] * P + pos % P], k.reshape(HKV, D))
        ref, _ = ref_attention(q.reshape(1, HQ, D), k_cache, v_cache, table, seq_buf[:1], [(0, 1)], P,
                               bmm1_scale=D ** -0.5)
        assert_close_ulp(out.reshape(1, HQ, D), ref, "fp16")


def test_select_out_cache_loc_stream_reaches_the_backend(rng):
    """select_out_cache_loc(stream=) sets the backend's stream (a drafter's group slots are
    computed on it), as every other backend call's stream= does."""
    backend = pm.create_backend("pagedmha", page_size=P, context_len=CONTEXT, kv_cache_dtype="fp16",
                                out_dtype="fp16", max_bs=MAX_BS, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    layer = pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    backend.set_stream(0)
    assert backend.stream == 0
    loc = np.array([4], np.int32)
    assert backend.select_out_cache_loc(layer, pm.ForwardMode.decode, loc, stream=0x1234) is loc
    assert backend.stream == 0x1234
    backend.set_stream(7)
    assert backend.stream == 7
