// CUDA-graph capture of a decode step (write slots, append_kv, batch_decode) replayed
// with changed lengths and page tables == eager, bit for bit; and a pool above 2^31
// elements with page ids above 65,535 (append, decode and prefill through it).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "gpu/ops/harness.h"

namespace gpu_test {
namespace {

TEST(GpuGraph, DecodeStepReplayEqualsEager) {
  REQUIRE_GPU();
  for (int n : {1, 3}) {
    AttnCase c = gpu_case();
    c.q_len_per_req = n;
    c.kv_lens.assign(8, 600);  // capacity; steps use less
    c.seed = 5000 + n;
    AttnProblem p = build(c);
    const int B = p.batch, Hkv = c.Hkv, D = c.D;
    const std::vector<int32_t> table0 = int_values(p.page_table);
    std::mt19937_64 rng(5100 + n);
    std::normal_distribution<double> normal(0.0, 1.0);
    const HostTensor knew = make_tensor(DType::bf16, {B * n, Hkv, D}), vnew = make_tensor(DType::bf16, {B * n, Hkv, D});
    for (int t = 0; t < B * n; ++t)
      for (int h = 0; h < Hkv; ++h)
        for (int d = 0; d < D; ++d) knew.set({t, h, d}, normal(rng)), vnew.set({t, h, d}, normal(rng));
    const HostTensor slots = make_tensor(DType::int32, {B * n});
    const AttnProblem graph_run = with_new_outputs(p), eager_run = with_new_outputs(p);
    DeviceMirror dev;
    const Buffer ws = poisoned_workspace(p);

    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const pagedmha::Stream st{stream};
    auto step = [&](const AttnProblem& r) {
      AttnViews v = dev.views(r);
      v.workspace = ws.data() ? ws.bytes_view() : TensorView{};
      pagedmha::decode_write_slots(v.page_table, v.seq_lens, c.page_size, n, dev.view(slots), st);
      pagedmha::append_kv(dev.view(knew), dev.view(vnew), v.k_cache, v.v_cache, dev.view(slots), c.page_size, 1.0f,
                          1.0f, st);
      run_attention(r, v, 0, st);
    };
    // Every device twin exists before capture (copies are not captured work).
    for (const AttnProblem* r : {&graph_run, &eager_run}) dev.views(*r);
    for (const HostTensor* t : {&knew, &vnew, &slots}) dev.base_of(*t);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    // Global mode: any hidden synchronisation or allocation inside the ops fails capture.
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    step(graph_run);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

    for (int it = 0; it < 4; ++it) {
      // New live lengths (some padded rows: seq_len 1 on page 0) and permuted tables.
      std::vector<int> perm(B), lens(B);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      int32_t* table = p.page_table.typed<int32_t>();
      for (int b = 0; b < B; ++b) {
        const bool pad = it > 0 && b == B - 1 - it;
        lens[b] = pad ? 1 : n + static_cast<int>(rng() % (601 - n));
        for (int col = 0; col < p.cols; ++col) table[b * p.cols + col] = pad ? 0 : table0[perm[b] * p.cols + col];
        p.seq_lens.typed<int32_t>()[b] = lens[b];
      }
      dev.upload(p.seq_lens, stream);
      dev.upload(p.page_table, stream);
      step(eager_run);  // eager first; the replay writes the same tokens to the same slots
      CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      for (const AttnProblem* r : {&graph_run, &eager_run}) {
        dev.download(r->out);
        dev.download(r->lse);
      }
      // Bitwise on real rows. A padded row's n tokens all land on slot 0 of the dummy
      // page, where the last writer is unspecified; it must only be finite.
      for (int b = 0; b < B; ++b) {
        const int row = b * n;
        if (it > 0 && b == B - 1 - it) {
          for (int i = 0; i < n; ++i)
            for (int h = 0; h < c.Hq; ++h)
              for (int d = 0; d < D; ++d) ASSERT_TRUE(std::isfinite(graph_run.out.get({row + i, h, d})));
          continue;
        }
        EXPECT_TRUE(same_bits(graph_run.out, row, eager_run.out, row, n)) << "n=" << n << " step " << it;
        EXPECT_EQ(0, std::memcmp(graph_run.lse.at({row, 0}), eager_run.lse.at({row, 0}), size_t{4} * n * c.Hq))
            << "n=" << n << " step " << it << " request " << b << ": lse differs from eager";
      }
      // And the replayed result is right (oracle on the updated cache and metadata).
      if (it == 3) {
        dev.download(p.kv.k);
        dev.download(p.kv.v);
        AttnProblem r = graph_run;  // shares p's table and cache
        follow_table(r, lens);
        EXPECT_TRUE(check_attention(r, r.reference(/*from_cache=*/true))) << "graph replay vs oracle";
      }
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// Pool of (2^20 + 64) pages x 16 tokens x 1 head x 128 = 2.15e9 elements per K and V
// (4.3 GB each); the request's pages include ids above 65,535 and the last page. Each
// page's V is one distinct constant, so a wrapped 32-bit offset reads a wrong constant.
// Too big for the host: the pool lives on the device only.
TEST(GpuLargePool, PageIdsAbove65535) {
  REQUIRE_GPU();
  const int P = 16, Hkv = 1, D = 128, Hq = 4;
  const int64_t num_pages = (int64_t{1} << 20) + 64;
  const int64_t elems = num_pages * P * Hkv * D;
  ASSERT_GT(elems, int64_t{1} << 31);
  const std::vector<int32_t> ids = {static_cast<int32_t>(num_pages - 1), 70000, 65536, 65535, 3,
                                    static_cast<int32_t>(num_pages - 30)};
  const int L = static_cast<int>(ids.size()) * P - 5;
  Buffer kbuf(elems * 2, gpu()), vbuf(elems * 2, gpu());
  pagedmha::fill_bytes(kbuf.data(), gpu(), 0xFF, elems * 2);
  pagedmha::fill_bytes(vbuf.data(), gpu(), 0xFF, elems * 2);
  const TensorView kc(kbuf.data(), DType::bf16, gpu(), {num_pages * P, Hkv, D});
  const TensorView vc(vbuf.data(), DType::bf16, gpu(), {num_pages * P, Hkv, D});

  // Write the request through append_kv: K random, V = the page's constant.
  std::mt19937_64 rng(6000);
  std::normal_distribution<double> normal(0.0, 1.0);
  const HostTensor k = make_tensor(DType::bf16, {L, Hkv, D}), v = make_tensor(DType::bf16, {L, Hkv, D});
  std::vector<int32_t> slots;
  for (int p = 0; p < L; ++p) {
    slots.push_back(ids[p / P] * P + p % P);
    for (int d = 0; d < D; ++d) {
      k.set({p, 0, d}, normal(rng));
      v.set({p, 0, d}, 1.0 + (p / P) * 0.25 + d * 0.0078125);  // exact in bf16
    }
  }
  DeviceMirror dev;
  pagedmha::append_kv(dev.view(k), dev.view(v), kc, vc, dev.view(make_int32(slots)), P);

  // The last page read back byte for byte.
  std::vector<uint8_t> last(static_cast<size_t>(P) * D * 2);
  pagedmha::copy_bytes(last.data(), Device::cpu(), static_cast<uint8_t*>(vbuf.data()) + (num_pages - 1) * P * D * 2,
                       gpu(), last.size());
  pagedmha::synchronize();
  EXPECT_EQ(0, std::memcmp(last.data(), v.data(), last.size())) << "last page V";

  // Oracle over the dense request (7 queries, causal, bottom-right aligned).
  const int n = 7;
  const HostTensor q = make_tensor(DType::bf16, {n, Hq, D});
  std::vector<double> qd, kd, vd;
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < Hq; ++h)
      for (int d = 0; d < D; ++d) q.set({i, h, d}, normal(rng)), qd.push_back(q.get({i, h, d}));
  for (int p = 0; p < L; ++p)
    for (int d = 0; d < D; ++d) kd.push_back(k.get({p, 0, d})), vd.push_back(v.get({p, 0, d}));
  oracle::AttentionSpec os;
  os.num_q_heads = Hq, os.num_kv_heads = Hkv, os.head_dim = D;
  os.bmm1_scale = static_cast<float>(1.0 / std::sqrt(128.0));
  std::vector<double> o(qd.size()), l(static_cast<size_t>(n) * Hq);
  oracle::attention(os, n, L, qd.data(), kd.data(), vd.data(), o.data(), l.data());

  HostTensor table = make_tensor(DType::int32, {1, static_cast<int64_t>(ids.size()) + 2});
  std::copy(ids.begin(), ids.end(), table.typed<int32_t>());
  pagedmha::AttentionParams params;
  params.bmm1_scale = static_cast<float>(os.bmm1_scale);
  const TensorView tv = dev.view(table), lens = dev.view(make_int32({L}));
  for (bool decode : {false, true}) {
    const HostTensor out = make_tensor(DType::bf16, {n, Hq, D});
    if (!decode) {
      const Buffer ws(pagedmha::prefill_workspace_size(gpu(), 1, n), gpu());
      pagedmha::batch_prefill(dev.view(q), kc, vc, tv, lens, dev.view(make_int32({0, n})), P, n, dev.view(out), params,
                              {}, ws.bytes_view());
    } else {  // the 7 queries as a verify step of one request
      const size_t bytes = pagedmha::decode_workspace_size(gpu(), 1, n, Hq, Hkv, D);
      const Buffer ws(std::max<size_t>(bytes, 16), gpu());
      pagedmha::batch_decode(dev.view(q), kc, vc, tv, lens, P, n, dev.view(out), params, {},
                             bytes ? ws.bytes_view() : TensorView{});
    }
    dev.download(out);
    double err = 0, ref = 0;
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < Hq; ++h)
        for (int d = 0; d < D; ++d) {
          const double g = out.get({i, h, d}), want = o[(static_cast<size_t>(i) * Hq + h) * D + d];
          ASSERT_TRUE(std::isfinite(g)) << (decode ? "decode" : "prefill") << " row " << i << " head " << h;
          err += (g - want) * (g - want);
          ref += want * want;
        }
    EXPECT_LE(std::sqrt(err / ref), 1e-2) << (decode ? "decode" : "prefill");
  }
}

}  // namespace
}  // namespace gpu_test
