"""Arguments of the wrong type (None for a required array, a float page size, a str for
an int, a missing or unknown argument) arrive as pagedmha.Error naming the call and the
argument, never as nanobind's TypeError with a signature dump, and before anything is
written."""

import numpy as np
import pytest

import pagedmha as pm
from pagedmha import _arguments

HQ, HKV, D, P = 2, 1, 64, 4


@pytest.fixture
def decode_args():
    """A valid batch_decode call: q, k_cache, v_cache, page_table, seq_lens, page_size,
    q_len_per_req, out (out NaN-filled so a write shows)."""
    q = np.ones((1, HQ, D), np.float16)
    cache = np.ones((4 * P, HKV, D), np.float16)
    return [q, cache, cache.copy(), np.array([[1, 2]], np.int32), np.array([5], np.int32), P, 1,
            np.full_like(q, np.nan)]


def call_decode(args, **kwargs):
    pm.batch_decode(*args, **kwargs)


@pytest.mark.parametrize("index,value,message", [
    (0, None, r"^batch_decode: q: expected an array .*, got NoneType None$"),
    (4, None, r"^batch_decode: seq_lens: expected an array .*, got NoneType None$"),
    (7, None, r"^batch_decode: out: expected an array .*, got NoneType None$"),
    (5, 4.0, r"^batch_decode: page_size: expected an int, got float 4.0$"),
    (5, "4", r"^batch_decode: page_size: expected an int, got str '4'$"),
    (5, None, r"^batch_decode: page_size: expected an int, got NoneType None$"),
    (6, 1.5, r"^batch_decode: q_len_per_req: expected an int, got float 1.5$"),
    (5, 2**40, r"^batch_decode: page_size: expected an int in \[-2147483648, 2147483647\], got 1099511627776$"),
])
def test_batch_decode_positional(decode_args, index, value, message):
    out = decode_args[7]
    decode_args[index] = value
    with pytest.raises(pm.Error, match=message):
        call_decode(decode_args)
    if index != 7:
        assert np.all(np.isnan(out))  # nothing written


@pytest.mark.parametrize("kwargs,message", [
    (dict(bmm1_scale="0.1"), r"^batch_decode: bmm1_scale: expected a float or None, got str '0.1'$"),
    (dict(window_left=2.0), r"^batch_decode: window_left: expected an int, got float 2.0$"),
    (dict(stream="s"), r"^batch_decode: stream: expected a cudaStream_t as an int or None, got str 's'$"),
    (dict(stream=-1), r"^batch_decode: stream: expected an int in \[0, 2\^64\), got -1$"),
    (dict(stream=2**64), r"^batch_decode: stream: expected an int in \[0, 2\^64\), got 18446744073709551616$"),
    (dict(window_left=np.array([-1])), r"^batch_decode: window_left: expected an int, got ndarray"),
    (dict(sm_margin=-1), r"^batch_decode: sm_margin: expected >= 0, got -1$"),
    (dict(sm_margin=1.5), r"^batch_decode: sm_margin: expected an int, got float 1.5$"),
    (dict(bmm_scale=0.1), r"^batch_decode: bmm_scale: unexpected keyword argument \(expected one of q, .*bmm1_scale"),
])
def test_batch_decode_keywords(decode_args, kwargs, message):
    with pytest.raises(pm.Error, match=message):
        call_decode(decode_args, **kwargs)
    assert np.all(np.isnan(decode_args[7]))


@pytest.mark.parametrize("value", [np.array([P]), np.array(P, np.float32)])
def test_int_arguments_take_no_arrays(decode_args, value):
    """A 1-element array is not an int (nanobind refuses it; the diagnosis must not itself
    fail on it)."""
    decode_args[5] = value
    with pytest.raises(pm.Error, match=r"^batch_decode: page_size: expected an int, got "):
        call_decode(decode_args)
    assert np.all(np.isnan(decode_args[7]))


def test_missing_and_surplus_arguments(decode_args):
    with pytest.raises(pm.Error, match=r"^batch_decode: out: required argument missing$"):
        pm.batch_decode(*decode_args[:7])
    with pytest.raises(pm.Error, match=r"^batch_decode: arguments: expected at most 8 positional arguments \(q, .*out\), got 9$"):
        pm.batch_decode(*decode_args, 0.1)
    with pytest.raises(pm.Error, match=r"^batch_decode: out: given twice"):
        pm.batch_decode(*decode_args, out=decode_args[7])


def test_other_ops():
    lengths = np.array([1, 2], np.int32)
    with pytest.raises(pm.Error, match=r"^cumsum_lengths: out: expected an array .*got NoneType None$"):
        pm.cumsum_lengths(lengths, None)
    with pytest.raises(pm.Error, match=r"^clamp_seq_lens: min_len: expected an int, got float 1.0$"):
        pm.clamp_seq_lens(lengths, 1.0, lengths)
    with pytest.raises(pm.Error, match=r"^append_kv: page_size: expected an int, got float 16.0$"):
        k = np.zeros((1, 1, 64), np.float16)
        pm.append_kv(k, k, np.zeros((16, 1, 64), np.float16), np.zeros((16, 1, 64), np.float16),
                     np.zeros(1, np.int32), 16.0)
    with pytest.raises(pm.Error, match=r"^batch_prefill: max_q_len: expected an int, got str 'x'$"):
        q = np.zeros((1, 2, 64), np.float16)
        pm.batch_prefill(q, q, q, np.zeros((1, 1), np.int32), np.ones(1, np.int32),
                         np.array([0, 1], np.int32), 4, "x", q)
    with pytest.raises(pm.Error, match=r"^decode_workspace_size: batch: expected an int, got float 1.0$"):
        pm.decode_workspace_size("cpu", 1.0, 1, 2, 1, 64)
    with pytest.raises(pm.Error, match=r"^prefill_workspace_size: total_q: expected an int, got NoneType None$"):
        pm.prefill_workspace_size("cpu", 1, None)
    with pytest.raises(pm.Error, match=r"^visible_pairs: causal: expected a bool, got str 'yes'$"):
        pm.visible_pairs(4, 4, -1, "yes")
    with pytest.raises(pm.Error, match=r"^view_as: dtype: expected one of bf16, .*got 'bfloat16'$"):
        pm.view_as(np.zeros(2, np.uint16), "bfloat16")
    with pytest.raises(pm.Error, match=r"^view_as: dtype: expected a pagedmha.DType .*got float 1.0$"):
        pm.view_as(np.zeros(2, np.uint16), 1.0)
    with pytest.raises(pm.Error, match=r"^view_as: .*: expected an array .*got NoneType None$"):
        pm.view_as(None, "bf16")
    with pytest.raises(pm.Error, match=r"^decode_workspace_size: device: expected a device .*got NoneType None$"):
        pm.decode_workspace_size(None, 1, 1, 2, 1, 64)


def backend():
    return pm.create_backend("trtllm", page_size=P, context_len=64, kv_cache_dtype="fp16",
                             out_dtype="fp16", max_bs=2, num_q_heads=HQ, num_kv_heads=HKV,
                             head_dim=D)


def test_backend_config():
    with pytest.raises(pm.Error, match=r"^create_backend: page_size: expected an int, got float 16.0$"):
        pm.create_backend("trtllm", page_size=16.0, context_len=64)
    with pytest.raises(pm.Error, match=r"^create_backend: context_len: required argument missing$"):
        pm.create_backend("trtllm", page_size=16)
    with pytest.raises(pm.Error, match=r"^create_backend: kv_cache_dtype: expected one of bf16, .*got 'bfloat16'$"):
        pm.create_backend("trtllm", page_size=16, context_len=64, kv_cache_dtype="bfloat16")
    with pytest.raises(pm.Error, match=r"^create_backend: state_cache_groups: expected a list of str, got str 'mamba'$"):
        pm.create_backend(page_size=16, context_len=64, state_cache_groups="mamba")
    with pytest.raises(pm.Error, match=r"^create_backend: max_bs: expected an int, got str '8'$"):
        pm.create_backend(page_size=16, context_len=64, max_bs="8")
    with pytest.raises(pm.Error, match=r"^create_backend: workspace_bytes: expected an int in \[0, 2\^64\)"):
        pm.create_backend(page_size=16, context_len=64, workspace_bytes=2**64)
    with pytest.raises(pm.Error, match=r"^create_backend: config: expected keyword arguments .*got 2 positional"):
        pm.create_backend("trtllm", 16, 64)
    with pytest.raises(pm.Error, match=r"^create_backend: device: expected a device .*got NoneType None$"):
        pm.create_backend(page_size=16, context_len=64, device=None)


def test_backend_classes_and_methods():
    with pytest.raises(pm.Error, match=r"^LayerSpec: head_dim: expected an int, got float 64.0$"):
        pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=64.0)
    with pytest.raises(pm.Error, match=r"^LayerSpec: layer_id: required argument missing$"):
        pm.LayerSpec(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    with pytest.raises(pm.Error, match=r"^ForwardBatch: forward_mode: expected a pagedmha.ForwardMode, got str 'decode'$"):
        pm.ForwardBatch(forward_mode="decode", batch_size=1)
    with pytest.raises(pm.Error, match=r"^ForwardBatch: group_tables: expected a dict of str to arrays, got list"):
        pm.ForwardBatch(forward_mode=pm.ForwardMode.decode, batch_size=1, group_tables=[])
    b = backend()
    layer = pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    q = np.zeros((1, HQ * D), np.float16)
    cache = np.zeros((16 * P, HKV, D), np.float16)
    with pytest.raises(pm.Error, match=r"^init_forward_metadata: forward_batch: expected a pagedmha.ForwardBatch, got dict"):
        b.init_forward_metadata({"forward_mode": "decode"})
    with pytest.raises(pm.Error, match=r"^forward_decode: bs: expected an int, got float 1.0$"):
        b.forward_decode(q, None, None, layer, cache, cache, None, 1.0, q.copy())
    with pytest.raises(pm.Error, match=r"^forward_extend: layer: expected a pagedmha.LayerSpec, got int 0$"):
        b.forward_extend(q, None, None, 0, cache, cache, None, 1, q.copy())
    with pytest.raises(pm.Error, match=r"^forward_decode: out: required argument missing$"):
        b.forward_decode(q, None, None, layer, cache, cache, None, 1)
    with pytest.raises(pm.Error, match=r"^forward_decode: q: expected an array .*got NoneType None$"):
        b.forward_decode(None, None, None, layer, cache, cache, None, 1, q.copy())
    with pytest.raises(pm.Error, match=r"^init_cuda_graph_state: max_bs: expected an int, got float 2.0$"):
        b.init_cuda_graph_state(2.0, np.ones(2, np.int32))
    with pytest.raises(pm.Error, match=r"^register_layers: layers: expected a list of pagedmha.LayerSpec, got LayerSpec"):
        b.register_layers(layer)
    with pytest.raises(pm.Error, match=r"^select_out_cache_loc: forward_mode: expected a pagedmha.ForwardMode, got str"):
        b.select_out_cache_loc(layer, "decode", None)


@pytest.mark.parametrize("index,kwargs,message", [
    (5, {}, r"^batch_decode: page_size: expected an int, got bool True$"),
    (6, {}, r"^batch_decode: q_len_per_req: expected an int, got bool True$"),
    (None, dict(bmm1_scale=True), r"^batch_decode: bmm1_scale: expected a float or None, got bool True$"),
    (None, dict(window_left=False), r"^batch_decode: window_left: expected an int, got bool False$"),
    (None, dict(bmm2_scale=np.True_), r"^batch_decode: bmm2_scale: expected a float, got bool (np\.)?True_?$"),
])
def test_bools_are_not_numbers(decode_args, index, kwargs, message):
    """nanobind converts a bool to 1 / 1.0 / 0: refused before anything is written."""
    if index is not None:
        decode_args[index] = True
    with pytest.raises(pm.Error, match=message):
        call_decode(decode_args, **kwargs)
    assert np.all(np.isnan(decode_args[7]))


@pytest.mark.parametrize("kwargs,message", [
    (dict(bmm2_scale=1e-50), r"^batch_decode: bmm2_scale: expected a value float32 holds .*got 1e-50$"),
    (dict(bmm1_scale=-1e-300), r"^batch_decode: bmm1_scale: expected a value float32 holds .*got -1e-300$"),
    (dict(logits_soft_cap=1e39), r"^batch_decode: logits_soft_cap: expected a value float32 holds .*got 1e\+39$"),
    (dict(bmm2_scale=3.4028236e38), r"^batch_decode: bmm2_scale: expected a value float32 holds .*got 3.4028236e\+38$"),
    (dict(bmm2_scale=10**400), r"^batch_decode: bmm2_scale: expected a value float32 holds, got int 1000"),
])
def test_scalars_float32_cannot_hold_are_refused(decode_args, kwargs, message):
    """The scales are float32 in the library: a finite value that would round to 0 or
    overflow to infinity is an error naming it, not a silently zeroed output."""
    with pytest.raises(pm.Error, match=message):
        call_decode(decode_args, **kwargs)
    assert np.all(np.isnan(decode_args[7]))


def test_scalars_float32_holds_are_taken(decode_args):
    """The edges float32 does hold are no errors: FLT_MAX itself, a subnormal."""
    call_decode(decode_args, bmm2_scale=float(np.finfo(np.float32).max))
    call_decode(decode_args, bmm2_scale=1e-40)
    assert not np.any(np.isnan(decode_args[7]))


def test_layer_and_append_scales_float32_cannot_hold_are_refused():
    with pytest.raises(pm.Error, match=r"^LayerSpec: v_scale: expected a value float32 holds .*got 1e-60$"):
        pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, v_scale=1e-60)
    k = np.zeros((1, HKV, D), np.float16)
    k_cache, v_cache = np.zeros((8, HKV, D), np.uint8), np.zeros((8, HKV, D), np.uint8)
    with pytest.raises(pm.Error, match=r"^append_kv: k_scale: expected a value float32 holds .*got 1e-46$"):
        pm.append_kv(k, k, k_cache, v_cache, np.zeros(1, np.int32), 4, k_scale=1e-46)
    assert not k_cache.any() and not v_cache.any()


def test_bools_are_not_numbers_in_backend_calls():
    with pytest.raises(pm.Error, match=r"^create_backend: page_size: expected an int, got bool True$"):
        pm.create_backend("trtllm", page_size=True, context_len=64)
    with pytest.raises(pm.Error, match=r"^LayerSpec: k_scale: expected a float, got bool True$"):
        pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, k_scale=True)
    with pytest.raises(pm.Error, match=r"^LayerSpec: window_left: expected an int, got bool False$"):
        pm.LayerSpec(layer_id=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, window_left=False)
    b = backend()
    with pytest.raises(pm.Error, match=r"^init_cuda_graph_state: max_bs: expected an int, got bool True$"):
        b.init_cuda_graph_state(True, np.ones(2, np.int32))
    # Where the signature says bool, a bool is still taken.
    pm.create_backend("trtllm", page_size=P, context_len=64, is_draft=False)


def test_backend_constructed_directly_is_checked_as_create_backend():
    """pagedmha.MhaBackend(...) (not through create_backend) refuses wrong types and bools
    with the same errors, takes dtypes by name, and both give the same class."""
    with pytest.raises(pm.Error, match=r"^MhaBackend: page_size: expected an int, got bool True$"):
        pm.MhaBackend(page_size=True, context_len=64)
    with pytest.raises(pm.Error, match=r"^MhaBackend: context_len: expected an int, got str '64'$"):
        pm.MhaBackend(page_size=P, context_len="64")
    with pytest.raises(pm.Error, match=r"^MhaBackend: page_size: required argument missing$"):
        pm.MhaBackend(context_len=64)
    b = pm.MhaBackend(page_size=P, context_len=64, kv_cache_dtype="fp8_e4m3")
    assert type(b) is pm.MhaBackend and b.max_num_pages == 64 // P
    made = pm.create_backend("trtllm", page_size=P, context_len=64)
    assert type(made) is pm.MhaBackend and made.page_size == P
    with pytest.raises(pm.Error, match=r"^_adopt: cls: expected a subclass of MhaBackend$"):
        pm._pagedmha._adopt(int, made)
    # The object _adopt moved out of is an error to use, not a null backend.
    raw = pm._pagedmha.create_backend("trtllm", page_size=P, context_len=64)
    assert pm._pagedmha._adopt(pm.MhaBackend, raw).page_size == P
    for use in (lambda: raw.page_size, lambda: raw.register_layers([]), lambda: raw.set_stream(0)):
        with pytest.raises(pm.Error, match=r"^MhaBackend: expected a backend, got one moved into another"):
            use()


def test_dtype_arguments_take_no_ints():
    """nanobind would take 0 as DType.bf16: refused like any other non-DType."""
    with pytest.raises(pm.Error, match=r"^MhaBackend: kv_cache_dtype: expected a pagedmha\.DType or one of "
                                       r"the names .*, got int 0$"):
        pm.MhaBackend(page_size=P, context_len=64, kv_cache_dtype=0)
    with pytest.raises(pm.Error, match=r"^create_backend: out_dtype: expected a pagedmha\.DType .*, got int 1$"):
        pm.create_backend("trtllm", page_size=P, context_len=64, out_dtype=1)
    assert pm.MhaBackend(page_size=P, context_len=64, kv_cache_dtype=pm.DType.fp16).page_size == P


def test_numpy_bools_where_a_bool_is_expected_are_named():
    """nanobind takes only Python bools for bool arguments: NumPy's are named, not a raw
    TypeError."""
    with pytest.raises(pm.Error, match=r"^MhaBackend: is_draft: expected a bool, got bool np\.True_$"):
        pm.MhaBackend(page_size=P, context_len=64, is_draft=np.True_)
    with pytest.raises(pm.Error, match=r"^visible_pairs: causal: expected a bool, got bool np\.False_$"):
        pm.visible_pairs(4, 4, -1, np.False_)
    assert pm.visible_pairs(4, 4, -1, True) == 10  # causal 4 x 4: 1 + 2 + 3 + 4


def test_accepted_conversions_still_work(decode_args):
    """NumPy scalars convert as before: no false alarm."""
    decode_args[5] = np.int64(P)
    pm.batch_decode(*decode_args, bmm1_scale=np.float32(0.125), window_left=np.int32(-1))
    assert np.all(np.isfinite(decode_args[7]))


def test_unexplained_type_error_propagates():
    """A TypeError whose arguments all fit the signature is not relabelled."""
    def raising(*args, **kwargs):
        raise TypeError("from inside")

    wrapped = _arguments.checked("cumsum_lengths", pm._pagedmha.cumsum_lengths, raising)
    with pytest.raises(TypeError, match="^from inside$"):
        wrapped(np.zeros(2, np.int32), np.zeros(3, np.int32))
    with pytest.raises(pm.Error, match=r"^cumsum_lengths: lengths: expected an array"):
        wrapped(None, np.zeros(3, np.int32))
