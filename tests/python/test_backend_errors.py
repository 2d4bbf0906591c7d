"""Backend errors name the call the user made and the keyword they passed (issue 12):
``create_backend(head_dim=96)`` used to report ``decode_workspace_size: head_dim``, and
``device="cuda"`` without a driver leaked a CUDA runtime call with its source path."""

import numpy as np
import pytest

import pagedmha as pm

P, CONTEXT = 4, 64


def test_create_backend_names_itself_and_the_keyword():
    with pytest.raises(pm.Error, match=r"^create_backend: head_dim: expected 64, 128 or 256, got 96$"):
        pm.create_backend("trtllm", page_size=P, context_len=CONTEXT, num_q_heads=8, num_kv_heads=8,
                          head_dim=96)
    with pytest.raises(pm.Error, match=r"^create_backend: page_size: expected >= 1, got 0$"):
        pm.create_backend("pagedmha", page_size=0, context_len=CONTEXT)
    with pytest.raises(pm.Error, match=r"^create_backend: sm_margin: expected >= 0, got -3$"):
        pm.create_backend("pagedmha", page_size=P, context_len=CONTEXT, sm_margin=-3)
    with pytest.raises(pm.Error, match=r"^MhaBackend: head_dim: expected 64, 128 or 256, got 96$"):
        pm.MhaBackend(page_size=P, context_len=CONTEXT, num_q_heads=8, num_kv_heads=8, head_dim=96)


def test_device_string_errors_name_create_backend():
    with pytest.raises(pm.Error, match=r'^create_backend: device: expected device "cpu", "cuda" or '
                                       r'"cuda:N", got "tpu"$'):
        pm.create_backend("pagedmha", page_size=P, context_len=CONTEXT, device="tpu")
    # The whole string: an embedded NUL is not the end of it.
    with pytest.raises(pm.Error, match=r"^MhaBackend: device: expected device .*, got 'cpu\\x00junk'$"):
        pm.MhaBackend(page_size=P, context_len=CONTEXT, device="cpu\x00junk")


def test_second_init_of_a_constructed_object_is_refused():
    # nanobind would warn and raise a TypeError listing the signature, as if the arguments
    # were wrong; the object stays as it was.
    backend = pm.create_backend("pagedmha", page_size=P, context_len=CONTEXT)
    direct = pm.MhaBackend(page_size=8, context_len=CONTEXT)
    layer = pm.LayerSpec(layer_id=0, num_q_heads=8, num_kv_heads=2, head_dim=64)
    batch = pm.ForwardBatch(forward_mode=pm.ForwardMode.decode, batch_size=1)
    again = {"page_size": 16, "context_len": 128}
    for obj, op, kwargs in ((backend, "MhaBackend", again), (direct, "MhaBackend", again),
                            (layer, "LayerSpec", {"layer_id": 1, "num_q_heads": 4, "num_kv_heads": 4,
                                                  "head_dim": 128}),
                            (batch, "ForwardBatch", {"forward_mode": pm.ForwardMode.extend, "batch_size": 2})):
        with pytest.raises(pm.Error, match=rf"^{op}: self: expected a new object, got one already constructed"):
            obj.__init__(**kwargs)
    assert (backend.page_size, direct.page_size) == (P, 8)
    assert (layer.layer_id, layer.head_dim) == (0, 64)
    assert (batch.forward_mode, batch.batch_size) == (pm.ForwardMode.decode, 1)


@pytest.mark.skipif(pm.cuda_available(), reason="needs a machine without a usable CUDA device")
def test_cuda_without_device_or_support_is_one_sentence():
    with pytest.raises(pm.Error) as info:
        pm.create_backend("trtllm", page_size=P, context_len=CONTEXT, device="cuda")
    m = str(info.value)
    if pm.built_with_cuda():
        assert m.startswith("create_backend: device: expected a usable CUDA device, got cuda:0 (no CUDA"), m
    else:
        assert m == ("create_backend: device: expected cpu (this build has no CUDA support), "
                     "got cuda:0"), m
    for leak in ("/", ".cu", "cudaGetDevice", "CUDA error", "\n"):
        assert leak not in m, m


def test_register_layers_and_forward_name_the_layer():
    backend = pm.create_backend("pagedmha", page_size=P, context_len=CONTEXT, max_bs=2)
    bad = pm.LayerSpec(layer_id=3, num_q_heads=4, num_kv_heads=2, head_dim=96, scaling=1.0)
    with pytest.raises(pm.Error, match=r"^MhaBackend\.register_layers: layers\[0\]\.head_dim: "
                                       r"expected 64, 128 or 256, got 96$"):
        backend.register_layers([bad])
    req_to_page = np.arange(2 * (CONTEXT // P), dtype=np.int32).reshape(2, CONTEXT // P)
    seq_lens = np.array([3], np.int32)
    backend.init_forward_metadata(pm.ForwardBatch(
        forward_mode=pm.ForwardMode.decode, batch_size=1, req_pool_indices=np.array([1], np.int32),
        seq_lens=seq_lens, req_to_page=req_to_page))
    q = np.zeros((1, 4 * 96), np.float16)
    with pytest.raises(pm.Error, match=r"^MhaBackend\.forward_decode: layer\.head_dim: "
                                       r"expected 64, 128 or 256, got 96$"):
        backend.forward_decode(q, None, None, bad, np.zeros((64, 2, 96), np.float16),
                               np.zeros((64, 2, 96), np.float16), None, 1, np.zeros_like(q))


def test_init_forward_metadata_names_the_batch_field():
    backend = pm.create_backend("pagedmha", page_size=P, context_len=CONTEXT, max_bs=2)
    req_to_page = np.zeros((3, CONTEXT // P), np.int32)
    batch = pm.ForwardBatch(forward_mode=pm.ForwardMode.decode, batch_size=1,
                            req_pool_indices=np.array([7], np.int32), seq_lens=np.array([3], np.int32),
                            req_to_page=req_to_page)
    with pytest.raises(pm.Error) as info:
        backend.init_forward_metadata(batch)
    m = str(info.value)
    assert m.startswith("MhaBackend.init_forward_metadata: batch.req_pool_indices: "), m
    assert "gather_page_table_with_padding" not in m, m


def test_binding_argument_errors_name_the_method():
    backend = pm.create_backend("pagedmha", page_size=P, context_len=CONTEXT, max_bs=2)
    layer = pm.LayerSpec(layer_id=0, num_q_heads=4, num_kv_heads=2, head_dim=64, scaling=1.0)
    cache = np.zeros((64, 2, 64), np.float16)
    with pytest.raises(pm.Error, match=r"^MhaBackend\.forward_decode: q: expected an array"):
        backend.forward_decode([[1.0]], None, None, layer, cache, cache, None, 1, np.zeros((1, 256), np.float16))


def test_config_and_batch_consistency():
    """Repeated state cache groups; a seq_lens_cpu that is not a copy of seq_lens; a zero
    k_scale on a 16-bit cache (ignored there, but never meant)."""
    with pytest.raises(pm.Error, match=r"^create_backend: state_cache_groups: expected distinct cache group "
                                       r"ids, got 'mamba' twice$"):
        pm.create_backend("trtllm", page_size=P, context_len=CONTEXT, state_cache_groups=["mamba", "mamba"])
    backend = pm.create_backend("pagedmha", page_size=P, context_len=CONTEXT, max_bs=2,
                                kv_cache_dtype="fp16", out_dtype="fp16")
    req_to_page = np.arange(2 * (CONTEXT // P), dtype=np.int32).reshape(2, CONTEXT // P)
    batch = dict(forward_mode=pm.ForwardMode.decode, batch_size=1, req_pool_indices=np.array([1], np.int32),
                 seq_lens=np.array([3], np.int32), req_to_page=req_to_page)
    with pytest.raises(pm.Error, match=r"^MhaBackend\.init_forward_metadata: batch\.seq_lens_cpu: expected a "
                                       r"host copy of batch\.seq_lens \(3 at 0\), got 4 at 0$"):
        backend.init_forward_metadata(pm.ForwardBatch(**batch, seq_lens_cpu=np.array([4], np.int32)))
    backend.init_forward_metadata(pm.ForwardBatch(**batch, seq_lens_cpu=np.array([3], np.int32)))
    layer = pm.LayerSpec(layer_id=0, num_q_heads=4, num_kv_heads=2, head_dim=64, k_scale=0.0)
    q = np.zeros((1, 4 * 64), np.float16)
    out = np.full_like(q, np.nan)
    cache = np.zeros((CONTEXT * 2, 2, 64), np.float16)
    with pytest.raises(pm.Error, match=r"^MhaBackend\.forward_decode: layer\.k_scale: expected a finite "
                                       r"value > 0, got 0$"):
        backend.forward_decode(q, None, None, layer, cache, cache, None, 1, out)
    assert np.all(np.isnan(out))


def test_default_stream_from_cupy_is_the_devices_own(monkeypatch):
    """Without torch, a CUDA device's default stream is CuPy's current stream of that
    device (CuPy keeps one per device); a device CuPy cannot enter, or a malformed name,
    leaves the choice to the library (None) instead of raising CuPy's error."""
    import sys
    import types

    current = {"device": 0}

    class Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            if self.index > 1:
                raise RuntimeError("cudaErrorInvalidDevice")
            self.outer, current["device"] = current["device"], self.index

        def __exit__(self, *exc):
            current["device"] = self.outer

    cuda = types.SimpleNamespace(Device=Device,
                                 get_current_stream=lambda: types.SimpleNamespace(ptr=1000 + current["device"]))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert pm._device_stream("cuda:1") == 1001
    assert pm._device_stream("cuda") == 1000
    assert pm._device_stream("cuda:7") is None
    assert pm._device_stream("cuda:x") is None
    assert pm._device_stream("cpu") is None


def test_page_table_that_cannot_be_allocated_names_max_bs():
    """A page table past the memory there is (max_bs x pages int32) names config.max_bs, not
    the internal Buffer. Run in a child process whose address space is capped at 4 GiB, so
    the 4 GiB table cannot be allocated on any machine."""
    import os
    import subprocess
    import sys

    code = ("import resource, pagedmha as pm\n"
            "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
            "try:\n"
            "    pm.create_backend('pagedmha', page_size=16, context_len=1 << 18, max_bs=1 << 16)\n"
            "except pm.Error as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    message = out.stdout.strip()
    assert message.startswith("create_backend: max_bs: expected a page table that fits in memory"), message
    assert message.endswith("got 65536 x 16384") and "Buffer" not in message, message
