"""pagedmha.torch custom ops on CUDA tensors against plain-torch references (fp64 math),
a decode step captured in a torch.cuda.CUDAGraph and replayed with changed lengths and
page tables, and torch.compile over a small attention module. Skipped without torch CUDA
or a CUDA build of pagedmha."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

import pagedmha as pm  # noqa: E402

if not pm.cuda_available():
    pytest.skip("pagedmha built without CUDA", allow_module_level=True)

import pagedmha.torch as pmt  # noqa: E402

DEV = torch.device("cuda", torch.cuda.current_device())


def gen(seed):
    return torch.Generator(device=DEV).manual_seed(seed)


def randn(shape, seed, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(shape, generator=gen(seed), device=DEV) * scale).to(dtype)


class Paged:
    """Random distinct pages per request (page 0 reserved), NaN-poisoned unused slots."""

    def __init__(self, seq_lens, page_size, hkv, d, dtype=torch.bfloat16, seed=0, extra_pages=4):
        self.page_size = page_size
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEV)
        need = [-(-n // page_size) for n in seq_lens]
        self.cols = max(max(need), 1) + 2
        self.num_pages = 1 + sum(need) + extra_pages
        ids = torch.randperm(self.num_pages - 1, generator=torch.Generator().manual_seed(seed)) + 1
        table = torch.full((len(seq_lens), self.cols), -1, dtype=torch.int32)
        at = 0
        for b, n in enumerate(need):
            table[b, :n] = ids[at:at + n].to(torch.int32)
            at += n
        self.page_table = table.to(DEV)
        self.k = randn((self.num_pages * page_size, hkv, d), seed + 1, dtype)
        self.v = randn((self.num_pages * page_size, hkv, d), seed + 2, dtype)


def ref_attention(q, k_slots, v_slots, page_table, seq_lens, rows, page_size, *, bmm1_scale=1.0,
                  bmm2_scale=1.0, window_left=-1, logits_soft_cap=0.0, sinks=None, causal=True):
    """docs/semantics.md section 1 in fp64 with plain torch; rows: per request (first_row, n)."""
    q = q.double()
    hq, hkv = q.shape[1], k_slots.shape[1]
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:2], -math.inf, dtype=torch.float64, device=q.device)
    sink = (torch.full((hq,), -math.inf, dtype=torch.float64, device=q.device) if sinks is None
            else sinks.double())
    for b, (first, n) in enumerate(rows):
        length = int(seq_lens[b])
        pos = torch.arange(length, device=q.device)
        slots = page_table[b, pos // page_size].long() * page_size + pos % page_size
        k = k_slots[slots].double().repeat_interleave(hq // hkv, dim=1)
        v = v_slots[slots].double().repeat_interleave(hq // hkv, dim=1)
        for i in range(n):
            p = length - n + i
            s = bmm1_scale * torch.einsum("jhd,hd->hj", k, q[first + i])
            if logits_soft_cap > 0:
                s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
            visible = torch.ones(length, dtype=torch.bool, device=q.device)
            if causal:
                visible &= pos <= p
            if window_left >= 0:
                visible &= pos >= p - window_left
            s = s.masked_fill(~visible, -math.inf)
            m = torch.maximum(s.amax(dim=1) if length else sink.new_full((hq,), -math.inf), sink)
            m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
            w = torch.exp(s - m_safe[:, None])
            z = w.sum(dim=1) + torch.exp(sink - m_safe)
            ok = z > 0
            out[first + i] = torch.where(
                ok[:, None], bmm2_scale * torch.einsum("hj,jhd->hd", w, v) / z.clamp_min(1e-300)[:, None],
                torch.zeros_like(out[first + i]))
            lse[first + i] = torch.where(ok, m_safe + torch.log(z.clamp_min(1e-300)),
                                         torch.full_like(m, -math.inf))
    return out, lse


def assert_close(out, ref, rel_l2=1e-2):
    out = out.double()
    assert torch.isfinite(out).all(), "non-finite output"
    err = (out - ref).norm() / ref.norm().clamp_min(1e-30)
    assert err < rel_l2, f"relative L2 error {err:.3e}"
    assert (out - ref).abs().max() < 0.05 * ref.abs().max().clamp_min(1.0)


def assert_lse(lse, ref):
    assert not torch.isnan(lse).any()
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref))
    fin = torch.isfinite(ref)
    torch.testing.assert_close(lse[fin].double(), ref[fin], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------
# Ops against the torch reference


@pytest.mark.parametrize("n", [1, 3])
def test_batch_decode(n):
    hq, hkv, d, page_size = 8, 2, 128, 16
    seq_lens = [max(s, n) for s in (1, 37, 300, 16)]
    pg = Paged(seq_lens, page_size, hkv, d, seed=n)
    bs = len(seq_lens)
    q = randn((bs * n, hq, d), 10 + n)
    sinks = torch.tensor([0.0, 2.0, -1.0, -math.inf] * 2, device=DEV)
    out = torch.full_like(q, math.nan)
    lse = torch.full(q.shape[:2], math.nan, device=DEV)
    ws = torch.empty(pm.decode_workspace_size(DEV, bs, n, hq, hkv, d), dtype=torch.uint8, device=DEV)
    kw = dict(bmm1_scale=d ** -0.5, window_left=100, logits_soft_cap=30.0)
    pmt.batch_decode(q, pg.k, pg.v, pg.page_table, pg.seq_lens, page_size, n, out, sinks=sinks,
                     lse=lse, workspace=ws, **kw)
    torch.cuda.synchronize()
    ref, ref_lse = ref_attention(q, pg.k, pg.v, pg.page_table, pg.seq_lens,
                                 [(b * n, n) for b in range(bs)], page_size, sinks=sinks, **kw)
    assert_close(out, ref)
    assert_lse(lse, ref_lse)


def test_batch_decode_fp8_cache():
    hq, hkv, d, page_size = 8, 1, 128, 32
    pg = Paged([70, 5], page_size, hkv, d, seed=3)
    k_scale, v_scale = 0.37, 2.5
    kq = (pg.k.float() / k_scale).to(torch.float8_e4m3fn)
    vq = (pg.v.float() / v_scale).to(torch.float8_e4m3fn)
    q = randn((2, hq, d), 4)
    out = torch.full_like(q, math.nan)
    ws = torch.empty(pm.decode_workspace_size(DEV, 2, 1, hq, hkv, d), dtype=torch.uint8, device=DEV)
    pmt.batch_decode(q, kq, vq, pg.page_table, pg.seq_lens, page_size, 1, out,
                     bmm1_scale=d ** -0.5 * k_scale, bmm2_scale=v_scale, workspace=ws)
    ref, _ = ref_attention(q, kq.float(), vq.float(), pg.page_table, pg.seq_lens, [(0, 1), (1, 1)],
                           page_size, bmm1_scale=d ** -0.5 * k_scale, bmm2_scale=v_scale)
    assert_close(out, ref)
    # sm_margin reaches the op and only sizes the grid: the same bits with 131 SMs left free.
    again = pmt.batch_decode_with_kvcache(q, kq, vq, pg.page_table, pg.seq_lens, page_size, 1,
                                          bmm1_scale=d ** -0.5 * k_scale, bmm2_scale=v_scale,
                                          workspace=ws, sm_margin=131)
    assert torch.equal(again, out)


@pytest.mark.parametrize("causal,with_lse", [(True, True), (False, True), (True, False)])
def test_batch_prefill(causal, with_lse):
    hq, hkv, d, page_size = 4, 4, 64, 16
    q_lens, prefix = [33, 1, 0, 70], [10, 0, 5, 64]
    seq_lens = [a + b for a, b in zip(q_lens, prefix)]
    pg = Paged(seq_lens, page_size, hkv, d, dtype=torch.float16, seed=7)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device=DEV)
    q = randn((int(cu[-1]), hq, d), 8, torch.float16)
    out = torch.full_like(q, math.nan)
    # Omitting lse (a mutated optional output) must reach the op (pytorch#176078).
    lse = torch.full(q.shape[:2], math.nan, device=DEV) if with_lse else None
    pmt.batch_prefill(q, pg.k, pg.v, pg.page_table, pg.seq_lens, cu, page_size, max(q_lens), out,
                      bmm1_scale=d ** -0.5, causal=causal, lse=lse, sm_margin=0 if causal else 120)
    rows = [(int(cu[b]), q_lens[b]) for b in range(len(q_lens))]
    ref, ref_lse = ref_attention(q, pg.k, pg.v, pg.page_table, pg.seq_lens, rows, page_size,
                                 bmm1_scale=d ** -0.5, causal=causal)
    assert_close(out, ref)
    if with_lse:
        assert_lse(lse, ref_lse)


def test_append_kv_and_metadata_ops():
    page_size, hkv, d, num_pages, t = 16, 2, 128, 8, 11
    k_cache = randn((num_pages * page_size, hkv, d), 20)
    v_cache = randn((num_pages * page_size, hkv, d), 21)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    k, v = randn((t, hkv, d), 22), randn((t, hkv, d), 23)
    loc = (torch.randperm(num_pages * page_size - page_size, generator=torch.Generator().manual_seed(1))[:t]
           + page_size).to(torch.int32).to(DEV)
    pmt.append_kv(k, v, k_cache, v_cache, loc, page_size)
    want_k[loc.long()], want_v[loc.long()] = k, v
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)

    lengths = torch.tensor([3, 0, 7, 1], dtype=torch.int32, device=DEV)
    cu = torch.full((5,), -1, dtype=torch.int32, device=DEV)
    pmt.cumsum_lengths(lengths, cu)
    assert cu.tolist() == [0, 3, 3, 10, 11]
    clamped = torch.empty_like(lengths)
    pmt.clamp_seq_lens(lengths, 2, clamped)
    assert clamped.tolist() == [3, 2, 7, 2]

    req_to_page = torch.randint(1, 1000, (5, 6), dtype=torch.int32, device=DEV)
    req_to_page[0] = 0
    idx = torch.tensor([2, 4, 0], dtype=torch.int32, device=DEV)
    sl = torch.tensor([17, 0, 1], dtype=torch.int32, device=DEV)
    table = torch.full((3, 6), -7, dtype=torch.int32, device=DEV)
    pmt.gather_page_table_with_padding(req_to_page, idx, sl, table, 3, 5, 16)
    want = torch.full_like(table, -7)
    want[:, :5] = 0
    want[0, :2] = req_to_page[2, :2]
    want[2, :1] = req_to_page[0, :1]
    assert torch.equal(table, want)

    slots = torch.full((3,), -1, dtype=torch.int32, device=DEV)
    pmt.decode_write_slots(table, sl, 16, 1, slots)
    want_slots = [int(table[r, max(int(sl[r]) - 1, 0) // 16]) * 16 + max(int(sl[r]) - 1, 0) % 16
                  for r in range(3)]
    assert slots.tolist() == want_slots
    prefix = torch.tensor([4, 0, 0], dtype=torch.int32, device=DEV)
    cu_q = torch.tensor([0, 2, 2, 3], dtype=torch.int32, device=DEV)
    ext = torch.full((3,), -1, dtype=torch.int32, device=DEV)
    pmt.extend_write_slots(table, prefix, cu_q, 16, ext)
    assert ext.tolist() == [int(table[0, 0]) * 16 + 4, int(table[0, 0]) * 16 + 5, int(table[2, 0]) * 16]


def test_error_from_cuda_op():
    """The library's error arrives through the custom op, lse and workspace omitted."""
    q = randn((2, 4, 96), 30)
    with pytest.raises(pm.Error, match=r"^batch_decode: .*96"):
        pmt.batch_decode(q, q, q, torch.zeros((2, 1), dtype=torch.int32, device=DEV),
                         torch.ones(2, dtype=torch.int32, device=DEV), 1, 1, torch.empty_like(q))


def test_runs_on_current_stream():
    """The op is ordered on the current (side) stream: launched right after a long kernel
    that writes q on that stream, it must see the written values."""
    hq, hkv, d, page_size = 4, 4, 128, 16
    pg = Paged([64], page_size, hkv, d, seed=40)
    q = torch.zeros((1, hq, d), dtype=torch.bfloat16, device=DEV)
    out = torch.full_like(q, math.nan)
    ws = torch.empty(pm.decode_workspace_size(DEV, 1, 1, hq, hkv, d), dtype=torch.uint8, device=DEV)
    side = torch.cuda.Stream()
    src = randn((1, hq, d), 41)
    big = torch.randn((4096, 4096), device=DEV)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(4):
            big = big @ big / 64  # keep the stream busy
        q.copy_(src)
        pmt.batch_decode(q, pg.k, pg.v, pg.page_table, pg.seq_lens, page_size, 1, out,
                         bmm1_scale=d ** -0.5, workspace=ws)
    side.synchronize()
    ref, _ = ref_attention(src, pg.k, pg.v, pg.page_table, pg.seq_lens, [(0, 1)], page_size,
                           bmm1_scale=d ** -0.5)
    assert_close(out, ref)


# ---------------------------------------------------------------------------------------
# CUDA graph: capture one decode step (append_kv + write slots + decode), replay with
# changed lengths and tables, compare with eager runs bit for bit.


def test_cuda_graph_decode_replay():
    hq, hkv, d, page_size, bs, cols = 8, 2, 128, 16, 4, 16
    num_pages = 1 + bs * cols
    k_cache = randn((num_pages * page_size, hkv, d), 50)
    v_cache = randn((num_pages * page_size, hkv, d), 51)
    page_table = torch.zeros((bs, cols), dtype=torch.int32, device=DEV)
    seq_lens = torch.ones(bs, dtype=torch.int32, device=DEV)
    q = torch.zeros((bs, hq, d), dtype=torch.bfloat16, device=DEV)
    k = torch.zeros((bs, hkv, d), dtype=torch.bfloat16, device=DEV)
    v = torch.zeros_like(k)
    slots = torch.zeros(bs, dtype=torch.int32, device=DEV)
    out = torch.zeros_like(q)
    ws = torch.empty(pm.decode_workspace_size(DEV, bs, 1, hq, hkv, d), dtype=torch.uint8, device=DEV)

    def step():
        pmt.decode_write_slots(page_table, seq_lens, page_size, 1, slots)
        pmt.append_kv(k, v, k_cache, v_cache, slots, page_size)
        pmt.batch_decode(q, k_cache, v_cache, page_table, seq_lens, page_size, 1, out,
                         bmm1_scale=d ** -0.5, workspace=ws)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    for it, lens in enumerate(([5, 1, 200, 17], [1, 255, 16, 33], [64, 2, 3, 100])):
        pages = torch.randperm(num_pages - 1, generator=torch.Generator().manual_seed(it))[: bs * cols] + 1
        page_table.copy_(pages.view(bs, cols).to(torch.int32))
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        q.copy_(randn((bs, hq, d), 60 + it))
        k.copy_(randn((bs, hkv, d), 70 + it))
        v.copy_(randn((bs, hkv, d), 80 + it))
        cache_before = (k_cache.clone(), v_cache.clone())
        graph.replay()
        torch.cuda.synchronize()
        got, cache_graph = out.clone(), (k_cache.clone(), v_cache.clone())
        # Eager on the same inputs from the pre-step cache.
        k_cache.copy_(cache_before[0])
        v_cache.copy_(cache_before[1])
        out.zero_()
        step()
        torch.cuda.synchronize()
        assert torch.equal(got, out), f"replay {it}: graph and eager outputs differ"
        assert torch.equal(cache_graph[0], k_cache) and torch.equal(cache_graph[1], v_cache)
        ref, _ = ref_attention(q, k_cache, v_cache, page_table, seq_lens,
                               [(b, 1) for b in range(bs)], page_size, bmm1_scale=d ** -0.5)
        assert_close(got, ref)


# ---------------------------------------------------------------------------------------
# torch.compile over a module calling the custom ops


class PagedDecodeAttention(torch.nn.Module):
    def __init__(self, hq, hkv, d, page_size):
        super().__init__()
        self.hq, self.hkv, self.d, self.page_size = hq, hkv, d, page_size
        self.proj = torch.nn.Linear(hq * d, hq * d, bias=False, dtype=torch.bfloat16, device=DEV)

    def forward(self, qkv, k_cache, v_cache, page_table, seq_lens, slots, workspace):
        t = qkv.shape[0]
        q, k, v = qkv.split([self.hq * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q = q.view(t, self.hq, self.d)
        pmt.append_kv(k.reshape(t, self.hkv, self.d), v.reshape(t, self.hkv, self.d), k_cache,
                      v_cache, slots, self.page_size)
        out = torch.empty_like(q)
        pmt.batch_decode(q, k_cache, v_cache, page_table, seq_lens, self.page_size, 1, out,
                         bmm1_scale=self.d ** -0.5, workspace=workspace)
        return self.proj(out.view(t, -1))


def test_torch_compile_module():
    hq, hkv, d, page_size = 4, 2, 128, 16
    pg = Paged([40, 3, 17], page_size, hkv, d, seed=90)
    bs = 3
    slots = torch.empty(bs, dtype=torch.int32, device=DEV)
    pm.decode_write_slots(pg.page_table, pg.seq_lens, page_size, 1, slots)
    torch.cuda.synchronize()
    qkv = randn((bs, (hq + 2 * hkv) * d), 91)
    ws = torch.empty(pm.decode_workspace_size(DEV, bs, 1, hq, hkv, d), dtype=torch.uint8, device=DEV)
    module = PagedDecodeAttention(hq, hkv, d, page_size)
    k_eager, v_eager = pg.k.clone(), pg.v.clone()
    with torch.no_grad():
        want = module(qkv, k_eager, v_eager, pg.page_table, pg.seq_lens, slots, ws)
        compiled = torch.compile(module, fullgraph=True)
        k_comp, v_comp = pg.k.clone(), pg.v.clone()
        got = compiled(qkv, k_comp, v_comp, pg.page_table, pg.seq_lens, slots, ws)
    torch.cuda.synchronize()
    assert torch.equal(k_comp, k_eager) and torch.equal(v_comp, v_eager)  # mutation kept
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    assert torch.isfinite(got).all()


def test_opcheck_decode():
    """torch.library.opcheck: schema, fake impl and functionalization agree with the op."""
    hq, hkv, d, page_size = 4, 2, 64, 16
    pg = Paged([20, 5], page_size, hkv, d, seed=95)
    q = randn((2, hq, d), 96)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], device=DEV)
    ws = torch.empty(pm.decode_workspace_size(DEV, 2, 1, hq, hkv, d), dtype=torch.uint8, device=DEV)
    op = torch.ops.pagedmha.batch_decode.default  # the registered op under pmt.batch_decode
    torch.library.opcheck(op, (q, pg.k, pg.v, pg.page_table, pg.seq_lens, page_size, 1, out),
                          dict(bmm1_scale=0.1, lse=lse, workspace=ws),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_merge_attention_states():
    """pmt.merge_attention_states on CUDA against the merge formula in fp64: an empty part
    holding NaN, sinks, in place into a part, and opcheck of the registered op."""
    k, t, h, d = 3, 37, 8, 128
    o = randn((k, t, h, d), 200)
    lse = torch.rand((k, t, h), generator=gen(201), device=DEV) * 20 - 10
    lse[1, :5] = -math.inf
    o[1, :5] = math.nan  # an empty part is never read
    sinks = torch.tensor([0.0, -math.inf, 1.0, 12.0] * 2, device=DEV)
    m = torch.maximum(lse.double().amax(0), sinks.double())
    w = torch.exp(lse.double() - m)
    z = w.sum(0) + torch.exp(sinks.double() - m)
    ref = (w[..., None] * torch.nan_to_num(o.double())).sum(0) / z[..., None]
    ref_lse = m + torch.log(z)
    out = torch.full((t, h, d), math.nan, dtype=torch.bfloat16, device=DEV)
    out_lse = torch.full((t, h), math.nan, device=DEV)
    pmt.merge_attention_states(o, lse, out, out_lse, sinks)
    torch.cuda.synchronize()
    assert_close(out, ref)
    assert_lse(out_lse, ref_lse)
    pmt.merge_attention_states(o, lse, o[2], lse[2], sinks)  # in place
    torch.cuda.synchronize()
    assert_close(o[2], ref)
    assert_lse(lse[2], ref_lse)
    clean = randn((k, t, h, d), 202)
    op = torch.ops.pagedmha.merge_attention_states.default
    torch.library.opcheck(op, (clean, lse, out, out_lse), dict(sinks=sinks),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
