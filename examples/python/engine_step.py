"""A serving engine's attention steps through pagedmha's backend, with torch tensors.

The engine side of one model (2 layers, 8 query heads, 2 KV heads, head dim 128, bf16,
page size 16) as an engine written for the upstream "trtllm" backend drives it:

1. extend: three new prompts (37, 5 and 20 tokens) in one step: forward_extend writes
   their K/V into the paged cache and attends causally;
2. decode: one new token per request through forward_decode;
3. CUDA graph: the decode step captured once in a torch.cuda.CUDAGraph at a padded batch
   size of 4, then replayed for two more tokens, with only the metadata call
   (init_forward_metadata_replay_cuda_graph) outside the graph. On the CPU the same
   graph-mode buffers and metadata calls, the step run eagerly instead of replayed.

Every output is checked against PyTorch SDPA (fp32) over the K/V history the engine keeps
itself, so a token written to the wrong slot or a wrong mask fails the run.

    PYTHONPATH=build/default/python python3 examples/python/engine_step.py [--device cpu|cuda]

--device defaults to cuda when a GPU and a CUDA build are there, else cpu. Exit status:
0 all checks passed, 1 a mismatch, 77 torch is not installed.
"""

import argparse
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("engine_step.py: skipped: needs torch (pip install torch)", file=sys.stderr)
    sys.exit(77)

import pagedmha as pm

LAYERS, HQ, HKV, D = 2, 8, 2, 128
PAGE, CONTEXT, NUM_PAGES, MAX_BS = 16, 256, 64, 8
GRAPH_BS = 4  # the padded batch size the graph is captured for
TOLERANCE = 2e-2  # bf16 outputs against an fp32 reference


class Engine:
    """The state an engine keeps: a KV pool per layer, req_to_page, and (for the check) the
    K/V history of every request, per layer, in token order."""

    def __init__(self, device, seed=0):
        self.device = device
        self.gen = torch.Generator().manual_seed(seed)
        self.k_cache = [torch.zeros(NUM_PAGES * PAGE, HKV, D, dtype=torch.bfloat16, device=device)
                        for _ in range(LAYERS)]
        self.v_cache = [torch.zeros_like(c) for c in self.k_cache]
        # Row 0 is the padding row (page 0, the reserved dummy page); each request row gets
        # distinct random pages.
        max_pages = CONTEXT // PAGE
        self.req_to_page = torch.zeros(MAX_BS + 1, max_pages, dtype=torch.int32)
        pages = torch.randperm(NUM_PAGES - 1, generator=self.gen) + 1
        for row in range(1, 4):
            self.req_to_page[row, :max_pages // 2] = pages[(row - 1) * 8: row * 8].to(torch.int32)
        self.req_to_page_dev = self.req_to_page.to(device)
        self.history = {}  # (layer, row) -> (k [L, Hkv, D], v) on the CPU
        self.seq_lens = {}  # row -> tokens in the cache
        self.backend = pm.create_backend(
            "trtllm", page_size=PAGE, context_len=CONTEXT, max_bs=MAX_BS,
            kv_cache_dtype="bf16", out_dtype="bf16", device=device,
            num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
        # scaling left out: head_dim ** -0.5
        self.layers = [pm.LayerSpec(layer_id=i, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
                       for i in range(LAYERS)]

    def randn(self, *shape):
        return torch.randn(*shape, generator=self.gen).to(torch.bfloat16)

    def slots(self, rows, positions):
        """Cache slots of (request row, token position) pairs: the engine's out_cache_loc."""
        return torch.tensor([int(self.req_to_page[r, p // PAGE]) * PAGE + p % PAGE
                             for r, p in zip(rows, positions)], dtype=torch.int32)

    def new_tokens(self, counts):
        """Random q, k, v per layer for `counts` new tokens per request ([T, H * D])."""
        t = sum(counts)
        return [(self.randn(t, HQ * D), self.randn(t, HKV * D), self.randn(t, HKV * D))
                for _ in range(LAYERS)]

    def record(self, layer, rows, counts, k, v):
        at = 0
        for r, n in zip(rows, counts):
            kk, vv = k[at:at + n].view(n, HKV, D).cpu(), v[at:at + n].view(n, HKV, D).cpu()
            if (layer, r) in self.history:
                pk, pv = self.history[(layer, r)]
                kk, vv = torch.cat([pk, kk]), torch.cat([pv, vv])
            self.history[(layer, r)] = (kk, vv)
            at += n

    def reference(self, layer, rows, counts, q):
        """SDPA in fp32: each request's queries at the last positions of its history,
        bottom-right causal, K/V heads repeated for the query-head groups."""
        outs, at = [], 0
        for r, n in zip(rows, counts):
            k, v = self.history[(layer, r)]
            length = k.shape[0]
            qq = q[at:at + n].view(n, HQ, D).cpu().float().transpose(0, 1)  # [Hq, n, D]
            kk = k.float().repeat_interleave(HQ // HKV, dim=1).transpose(0, 1)  # [Hq, L, D]
            vv = v.float().repeat_interleave(HQ // HKV, dim=1).transpose(0, 1)
            visible = torch.arange(length)[None, :] <= torch.arange(length - n, length)[:, None]
            o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=visible, scale=D ** -0.5)
            outs.append(o.transpose(0, 1).reshape(n, HQ * D))
            at += n
        return torch.cat(outs)


def check(label, got, want):
    err = (got.cpu().float() - want).abs().max().item()
    ok = torch.isfinite(got).all().item() and err <= TOLERANCE
    print(f"  {label:<42} max |out - ref| = {err:.4f}  {'ok' if ok else 'MISMATCH'}")
    return ok


def extend_step(engine, rows, counts):
    """New prompts of `counts` tokens for request rows `rows` (no cached prefix)."""
    dev = engine.device
    positions = [p for n in counts for p in range(n)]
    flat_rows = [r for r, n in zip(rows, counts) for _ in range(n)]
    loc = engine.slots(flat_rows, positions).to(dev)
    lens = torch.tensor(counts, dtype=torch.int32)
    batch = pm.ForwardBatch(
        forward_mode=pm.ForwardMode.extend, batch_size=len(rows),
        req_pool_indices=torch.tensor(rows, dtype=torch.int32, device=dev),
        seq_lens=lens.to(dev), seq_lens_cpu=lens, extend_seq_lens_cpu=lens,
        req_to_page=engine.req_to_page_dev, out_cache_loc=loc)
    engine.backend.init_forward_metadata(batch)
    ok = True
    for layer, (q, k, v) in enumerate(engine.new_tokens(counts)):
        q, k, v = q.to(dev), k.to(dev), v.to(dev)
        out = torch.empty_like(q)
        out = engine.backend.forward_extend(q, k, v, engine.layers[layer], engine.k_cache[layer],
                                            engine.v_cache[layer], loc, len(rows), out)
        engine.record(layer, rows, counts, k, v)
        ok &= check(f"extend layer {layer}", out, engine.reference(layer, rows, counts, q))
    for r, n in zip(rows, counts):
        engine.seq_lens[r] = n
    return ok


def decode_step(engine, rows):
    """One new token per request, eager."""
    dev = engine.device
    lens = [engine.seq_lens[r] + 1 for r in rows]
    loc = engine.slots(rows, [n - 1 for n in lens]).to(dev)
    batch = pm.ForwardBatch(
        forward_mode=pm.ForwardMode.decode, batch_size=len(rows),
        req_pool_indices=torch.tensor(rows, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
        req_to_page=engine.req_to_page_dev, out_cache_loc=loc)
    engine.backend.init_forward_metadata(batch)
    ok = True
    for layer, (q, k, v) in enumerate(engine.new_tokens([1] * len(rows))):
        q, k, v = q.to(dev), k.to(dev), v.to(dev)
        out = engine.backend.forward_decode(q, k, v, engine.layers[layer], engine.k_cache[layer],
                                            engine.v_cache[layer], loc, len(rows),
                                            torch.empty_like(q))
        engine.record(layer, rows, [1] * len(rows), k, v)
        ok &= check(f"decode layer {layer}", out, engine.reference(layer, rows, [1] * len(rows), q))
    for r, n in zip(rows, lens):
        engine.seq_lens[r] = n
    return ok


def graph_decode_steps(engine, rows, steps):
    """The decode step captured once at GRAPH_BS rows (real rows first, padded rows reading
    request row 0 with length 1 and writing the dummy slot 0), replayed `steps` times. On
    the CPU there is no graph: the same static buffers and graph-mode metadata, with the
    captured step run eagerly at each "replay"."""
    dev, bs, backend = engine.device, GRAPH_BS, engine.backend
    # Engine-owned static buffers: the graph reads them at replay time.
    seq_lens_buf = torch.ones(MAX_BS, dtype=torch.int32, device=dev)
    rpi_buf = torch.zeros(MAX_BS, dtype=torch.int32, device=dev)
    loc_buf = torch.zeros(bs, dtype=torch.int32, device=dev)
    q_buf = [torch.zeros(bs, HQ * D, dtype=torch.bfloat16, device=dev) for _ in range(LAYERS)]
    k_buf = [torch.zeros(bs, HKV * D, dtype=torch.bfloat16, device=dev) for _ in range(LAYERS)]
    v_buf = [torch.zeros_like(k) for k in k_buf]
    out_buf = [torch.zeros_like(q) for q in q_buf]

    def step():
        for layer in range(LAYERS):
            backend.forward_decode(q_buf[layer], k_buf[layer], v_buf[layer], engine.layers[layer],
                                   engine.k_cache[layer], engine.v_cache[layer], loc_buf, bs,
                                   out_buf[layer])

    backend.init_cuda_graph_state(MAX_BS, seq_lens_buf)
    backend.init_forward_metadata_capture_cuda_graph(bs, pm.ForwardMode.decode)
    if dev == "cpu":
        replay, name = step, "graph-mode decode (eager, CPU)"
    else:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # the backend issues its work on the capture stream
            step()
        replay, name = graph.replay, "CUDA-graph replay"

    ok, real = True, len(rows)
    for i in range(steps):
        lens = [engine.seq_lens[r] + 1 for r in rows]
        seq_lens_buf[:bs] = torch.tensor(lens + [1] * (bs - real), dtype=torch.int32)
        rpi_buf[:bs] = torch.tensor(rows + [0] * (bs - real), dtype=torch.int32)
        loc_buf.copy_(torch.cat([engine.slots(rows, [n - 1 for n in lens]),
                                 torch.zeros(bs - real, dtype=torch.int32)]))
        tokens = engine.new_tokens([1] * real)
        for layer, (q, k, v) in enumerate(tokens):
            q_buf[layer][:real], k_buf[layer][:real], v_buf[layer][:real] = q, k, v
        backend.init_forward_metadata_replay_cuda_graph(pm.ForwardBatch(
            forward_mode=pm.ForwardMode.decode, batch_size=bs, req_pool_indices=rpi_buf,
            seq_lens=seq_lens_buf, req_to_page=engine.req_to_page_dev))
        replay()
        if dev != "cpu":
            torch.cuda.synchronize()
        for layer, (q, k, v) in enumerate(tokens):
            engine.record(layer, rows, [1] * real, k, v)
            ok &= check(f"{name} {i} layer {layer}", out_buf[layer][:real],
                        engine.reference(layer, rows, [1] * real, q))
            ok &= bool(torch.isfinite(out_buf[layer][real:]).all())  # padded rows
        for r, n in zip(rows, lens):
            engine.seq_lens[r] = n
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    gpu = torch.cuda.is_available() and pm.cuda_available()
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if gpu else "cpu")
    args = parser.parse_args()
    if args.device == "cuda" and not gpu:
        print("engine_step.py: --device cuda needs a CUDA device and a CUDA build of pagedmha",
              file=sys.stderr)
        return 1
    device = "cuda:0" if args.device == "cuda" else "cpu"
    engine = Engine(device)
    rows = [1, 2, 3]
    print(f"pagedmha engine step on {device}: {LAYERS} layers, Hq {HQ}, Hkv {HKV}, D {D}, "
          f"page {PAGE}")
    ok = extend_step(engine, rows, [37, 5, 20])
    ok &= decode_step(engine, rows)
    ok &= graph_decode_steps(engine, rows, steps=2)
    if args.device == "cpu":
        print("  (no CUDA graph on the CPU: run with a CUDA device for the captured step)")
    print("all checks passed" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
