"""pagedmha.torch on CPU tensors (skipped without torch): the functional forms
(batch_decode_with_kvcache, batch_prefill_with_kvcache) against the fp64 NumPy reference,
the default softmax scale, wrong argument types as pagedmha.Error naming the call, tracing
through torch.compile, and the backend fed torch tensors."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pagedmha as pm  # noqa: E402
import pagedmha.torch as pmt  # noqa: E402
from test_ops_numpy import ref_attention  # noqa: E402


def f64(t):
    return t.detach().to(torch.float64).numpy()


class Paged:
    """Random distinct pages per request (page 0 reserved) and a random bf16 cache."""

    def __init__(self, seq_lens, page_size, hkv, d, seed, dtype=torch.bfloat16):
        g = torch.Generator().manual_seed(seed)
        self.page_size = page_size
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
        need = [-(-n // page_size) for n in seq_lens]
        self.cols = max(need) + 1
        self.num_pages = 1 + sum(need) + 2
        ids = torch.randperm(self.num_pages - 1, generator=g) + 1
        self.page_table = torch.zeros((len(seq_lens), self.cols), dtype=torch.int32)
        at = 0
        for b, n in enumerate(need):
            self.page_table[b, :n] = ids[at:at + n].to(torch.int32)
            at += n
        shape = (self.num_pages * page_size, hkv, d)
        self.k = torch.randn(shape, generator=g).to(dtype)
        self.v = torch.randn(shape, generator=g).to(dtype)

    def reference(self, q, rows, **kw):
        return ref_attention(f64(q), f64(self.k), f64(self.v), self.page_table.numpy(),
                             self.seq_lens.numpy(), rows, self.page_size, **kw)


def assert_close(got, ref, tol=2e-2):
    got = f64(got)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def assert_lse(got, ref):
    got = f64(got)
    finite = np.isfinite(ref)
    assert np.array_equal(np.isneginf(got), np.isneginf(ref))
    np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------
# Functional forms


@pytest.mark.parametrize("n", [1, 3])
def test_batch_decode_with_kvcache(n):
    hq, hkv, d, page_size = 8, 2, 128, 16
    pg = Paged([40, 5, 17], page_size, hkv, d, seed=1 + n)
    q = torch.randn((3 * n, hq, d), generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
    rows = [(b * n, n) for b in range(3)]
    ref, ref_lse = pg.reference(q, rows, bmm1_scale=d ** -0.5, window_left=20)

    out = pmt.batch_decode_with_kvcache(q, pg.k, pg.v, pg.page_table, pg.seq_lens, page_size, n,
                                        window_left=20)
    assert isinstance(out, torch.Tensor) and out.dtype == q.dtype and out.shape == q.shape
    assert out.data_ptr() != q.data_ptr()
    assert_close(out, ref)

    out2, lse = pmt.batch_decode_with_kvcache(q, pg.k, pg.v, pg.page_table, pg.seq_lens, page_size,
                                              n, window_left=20, return_lse=True)
    assert torch.equal(out2, out)
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:2]
    assert_lse(lse, ref_lse)


@pytest.mark.parametrize("causal", [True, False])
def test_batch_prefill_with_kvcache(causal):
    hq, hkv, d, page_size = 4, 4, 64, 8
    q_lens = [9, 1, 0, 20]
    prefix = [3, 0, 5, 30]
    pg = Paged([a + b for a, b in zip(q_lens, prefix)], page_size, hkv, d, seed=7)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=torch.int32)
    q = torch.randn((int(cu[-1]), hq, d), generator=torch.Generator().manual_seed(8)).to(torch.float16)
    k, v = pg.k.to(torch.float16), pg.v.to(torch.float16)
    pg.k, pg.v = k, v
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    out, lse = pmt.batch_prefill_with_kvcache(q, k, v, pg.page_table, pg.seq_lens, cu, page_size,
                                              max(q_lens), sinks=sinks, causal=causal,
                                              bmm1_scale=0.1, return_lse=True)
    assert out.dtype == torch.float16 and lse.shape == (q.shape[0], hq)
    rows = [(int(cu[b]), q_lens[b]) for b in range(4)]
    ref, ref_lse = pg.reference(q, rows, bmm1_scale=0.1, sinks=sinks.numpy(), causal=causal)
    assert_close(out, ref, tol=2e-3)
    assert_lse(lse, ref_lse)
    only_out = pmt.batch_prefill_with_kvcache(q, k, v, pg.page_table, pg.seq_lens, cu, page_size,
                                              max(q_lens), sinks=sinks, causal=causal,
                                              bmm1_scale=0.1)
    assert torch.equal(only_out, out)


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="torch without float8_e4m3fn")
def test_functional_fp8_query_returns_bf16():
    hq, hkv, d, page_size = 4, 2, 64, 16
    pg = Paged([33], page_size, hkv, d, seed=11)
    k8, v8 = pg.k.to(torch.float8_e4m3fn), pg.v.to(torch.float8_e4m3fn)
    q8 = torch.randn((1, hq, d), generator=torch.Generator().manual_seed(12)).to(torch.float8_e4m3fn)
    out = pmt.batch_decode_with_kvcache(q8, k8, v8, pg.page_table, pg.seq_lens, page_size)
    assert out.dtype == torch.bfloat16
    pg.k, pg.v = k8.float(), v8.float()
    ref, _ = pg.reference(q8.float(), [(0, 1)], bmm1_scale=d ** -0.5)
    assert_close(out, ref)


# ---------------------------------------------------------------------------------------
# bmm1_scale=None (the default): head_dim ** -0.5 in the in-place ops too


@pytest.mark.parametrize("d", [64, 256])
def test_default_scale_in_place(d):
    hq, hkv, page_size = 2, 1, 4
    pg = Paged([13], page_size, hkv, d, seed=d)
    q = torch.randn((1, hq, d), generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    ref, _ = pg.reference(q, [(0, 1)], bmm1_scale=d ** -0.5)
    unscaled, _ = pg.reference(q, [(0, 1)], bmm1_scale=1.0)
    assert not np.allclose(ref, unscaled, atol=0.1)
    out = torch.full_like(q, float("nan"))
    pmt.batch_decode(q, pg.k, pg.v, pg.page_table, pg.seq_lens, page_size, 1, out)
    assert_close(out, ref)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    pmt.batch_prefill(q, pg.k, pg.v, pg.page_table, pg.seq_lens, cu, page_size, 1, out)
    assert_close(out, ref)
    out = torch.full_like(q, float("nan"))
    pmt.batch_decode(q, pg.k, pg.v, pg.page_table, pg.seq_lens, page_size, 1, out, bmm1_scale=1.0)
    assert_close(out, unscaled)


# ---------------------------------------------------------------------------------------
# Errors name the function called and the argument


def test_wrong_argument_types_name_the_call():
    pg = Paged([5], 4, 1, 64, seed=20)
    q = torch.zeros((1, 2, 64), dtype=torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    args = (pg.k, pg.v, pg.page_table, pg.seq_lens)
    with pytest.raises(pm.Error, match=r"^batch_decode: page_size: expected an int, got float 4.0$"):
        pmt.batch_decode(q, *args, 4.0, 1, out)
    with pytest.raises(pm.Error, match=r"^batch_decode: q: expected a torch.Tensor, got NoneType None$"):
        pmt.batch_decode(None, *args, 4, 1, out)
    with pytest.raises(pm.Error, match=r"^batch_decode: out: required argument missing$"):
        pmt.batch_decode(q, *args, 4, 1)
    assert torch.isnan(out).all()
    with pytest.raises(pm.Error, match=r"^batch_decode_with_kvcache: page_size: expected an int, got str '4'$"):
        pmt.batch_decode_with_kvcache(q, *args, "4")
    with pytest.raises(pm.Error, match=r"^batch_decode_with_kvcache: q: expected a torch.Tensor, got ndarray"):
        pmt.batch_decode_with_kvcache(q.float().numpy(), *args, 4)
    with pytest.raises(pm.Error, match=r"^batch_decode_with_kvcache: bmm1_scale: expected a float or None, got str '0.1'$"):
        pmt.batch_decode_with_kvcache(q, *args, 4, bmm1_scale="0.1")
    with pytest.raises(pm.Error, match=r"^batch_prefill_with_kvcache: max_q_len: required argument missing$"):
        pmt.batch_prefill_with_kvcache(q, *args, torch.tensor([0, 1], dtype=torch.int32), 4)
    with pytest.raises(pm.Error, match=r"^append_kv: page_size: expected an int, got float 16.0$"):
        k = torch.zeros((1, 1, 64), dtype=torch.bfloat16)
        pmt.append_kv(k, k, pg.k, pg.v, torch.zeros(1, dtype=torch.int32), 16.0)
    with pytest.raises(pm.Error, match=r"^decode_write_slots: q_len_per_req: expected an int, got NoneType None$"):
        pmt.decode_write_slots(pg.page_table, pg.seq_lens, 4, None, torch.zeros(1, dtype=torch.int32))


def test_return_lse_is_a_bool_and_cuda_devices_are_the_librarys_to_judge():
    pg = Paged([5], 4, 1, 64, seed=22)
    q = torch.zeros((1, 2, 64), dtype=torch.bfloat16)
    with pytest.raises(pm.Error, match=r"^batch_decode_with_kvcache: return_lse: expected a bool, got str 'no'$"):
        pmt.batch_decode_with_kvcache(q, pg.k, pg.v, pg.page_table, pg.seq_lens, 4, return_lse="no")
    # With torch imported, a CUDA device torch cannot use (no driver here, an index past the
    # device count there) is reported by the library, naming the call and the argument,
    # not by torch.
    with pytest.raises(pm.Error, match=r"^create_backend: (config\.)?device: "):
        pm.create_backend(page_size=16, context_len=64, num_q_heads=4, num_kv_heads=2, head_dim=64,
                          device="cuda:63")


def test_library_errors_name_the_functional_call():
    pg = Paged([5], 4, 1, 64, seed=21)
    q = torch.zeros((1, 2, 96), dtype=torch.bfloat16)
    with pytest.raises(pm.Error, match=r"^batch_decode_with_kvcache: .*96"):
        pmt.batch_decode_with_kvcache(q, pg.k[..., :32].repeat(1, 1, 3), pg.v[..., :32].repeat(1, 1, 3),
                                      pg.page_table, pg.seq_lens, 4)
    q = torch.zeros((1, 2, 64), dtype=torch.bfloat16)
    with pytest.raises(pm.Error, match=r"^batch_prefill_with_kvcache: seq_lens: expected dtype int32, got int64$"):
        pmt.batch_prefill_with_kvcache(q, pg.k, pg.v, pg.page_table, pg.seq_lens.long(),
                                       torch.tensor([0, 1], dtype=torch.int32), 4, 1)


# ---------------------------------------------------------------------------------------
# torch.compile traces through the checked wrappers and the functional forms


def test_torch_compile_traces_functional_forms():
    hq, hkv, d, page_size = 4, 2, 64, 8
    pg = Paged([19, 4], page_size, hkv, d, seed=30)
    q = torch.randn((2, hq, d), generator=torch.Generator().manual_seed(31)).to(torch.bfloat16)

    def attend(q, k_cache, v_cache, page_table, seq_lens):
        out, lse = pmt.batch_decode_with_kvcache(q, k_cache, v_cache, page_table, seq_lens,
                                                 page_size, return_lse=True)
        return out.float() * 2, lse

    torch._dynamo.reset()
    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)
    got, lse = compiled(q, pg.k, pg.v, pg.page_table, pg.seq_lens)
    want, want_lse = attend(q, pg.k, pg.v, pg.page_table, pg.seq_lens)
    assert torch.equal(got, want) and torch.equal(lse, want_lse)


# ---------------------------------------------------------------------------------------
# The backend with torch CPU tensors (ForwardBatch / LayerSpec hold them)


def test_backend_decode_with_torch_tensors():
    hq, hkv, d, page_size, bs = 4, 2, 64, 4, 2
    req_to_page = torch.zeros((bs + 1, 8), dtype=torch.int32)
    req_to_page[1, :4] = torch.tensor([5, 2, 7, 1])
    req_to_page[2, :4] = torch.tensor([3, 8, 4, 6])
    g = torch.Generator().manual_seed(40)
    k_cache = torch.randn((9 * page_size, hkv, d), generator=g).to(torch.bfloat16)
    v_cache = torch.randn((9 * page_size, hkv, d), generator=g).to(torch.bfloat16)
    backend = pm.create_backend("trtllm", page_size=page_size, context_len=32, max_bs=bs,
                                num_q_heads=hq, num_kv_heads=hkv, head_dim=d)
    layer = pm.LayerSpec(layer_id=0, num_q_heads=hq, num_kv_heads=hkv, head_dim=d)
    rpi = torch.tensor([2, 1], dtype=torch.int32)
    seq_lens = torch.tensor([11, 6], dtype=torch.int32)
    loc = torch.tensor([int(req_to_page[r, (n - 1) // page_size]) * page_size + (n - 1) % page_size
                        for r, n in zip(rpi.tolist(), seq_lens.tolist())], dtype=torch.int32)
    backend.init_forward_metadata(pm.ForwardBatch(
        forward_mode=pm.ForwardMode.decode, batch_size=bs, req_pool_indices=rpi,
        seq_lens=seq_lens, req_to_page=req_to_page, out_cache_loc=loc))
    q = torch.randn((bs, hq * d), generator=g).to(torch.bfloat16)
    k = torch.randn((bs, hkv * d), generator=g).to(torch.bfloat16)
    v = torch.randn((bs, hkv * d), generator=g).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    got = backend.forward_decode(q, k, v, layer, k_cache, v_cache, loc, bs, out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(k_cache[loc.long()], k.view(bs, hkv, d))
    ref, _ = ref_attention(f64(q.view(bs, hq, d)), f64(k_cache), f64(v_cache),
                           req_to_page[rpi.long()].numpy(), seq_lens.numpy(),
                           [(0, 1), (1, 1)], page_size, bmm1_scale=d ** -0.5)
    assert_close(out.view(bs, hq, d), ref)
