// CUDA-graph capture of a decode step (write slots, append_kv, batch_decode) replayed
// with changed lengths and page tables == eager, bit for bit; and a pool above 2^31
// elements with page ids above 65,535 (append, decode and prefill through it).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "gpu/ops/harness.h"

namespace gpu_test {
namespace {

TEST(GpuGraph, DecodeStepReplayEqualsEager) {
  REQUIRE_GPU();
  for (int n : {1, 3}) {
    AttnSpec s;
    s.num_q_heads = 8;
    s.num_kv_heads = 2;
    s.page_size = 16;
    s.q_len_per_req = n;
    s.seq_lens = {600, 600, 600, 600, 600, 600, 600, 600};  // capacity; steps use less
    s.seed = 5000 + n;
    AttnCase c = build_case(s);
    const int B = c.batch, Hkv = s.num_kv_heads, D = s.head_dim;
    const std::vector<uint8_t> table0 = c.page_table.host;
    Tensor knew(DType::bf16, {B * n, Hkv, D}), vnew(DType::bf16, {B * n, Hkv, D}), slots(DType::int32, {B * n});
    Rng rng(5100 + n);
    for (int64_t x = 0; x < static_cast<int64_t>(B) * n * Hkv * D; ++x) {
      knew.set(x, rng.normal());
      vnew.set(x, rng.normal());
    }
    for (Tensor* t : {&c.q, &c.k_cache, &c.v_cache, &c.page_table, &c.seq_lens, &knew, &vnew, &slots}) t->upload();
    Tensor out_g = c.out.clone(), lse_g = c.lse.clone(), out_e = c.out.clone(), lse_e = c.lse.clone();
    for (Tensor* t : {&out_g, &lse_g, &out_e, &lse_e}) t->upload();
    const size_t ws_bytes = pagedmha::decode_workspace_size(Device::cuda(0), B, n, s.num_q_heads, Hkv, D);
    Buffer ws(std::max<size_t>(ws_bytes, 16), Device::cuda(0));
    const TensorView wsv = ws_bytes ? ws.bytes_view() : TensorView{};

    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const pagedmha::Stream st{stream};
    auto step = [&](Tensor& out, Tensor& lse) {
      pagedmha::decode_write_slots(c.page_table.gpu(), c.seq_lens.gpu(), s.page_size, n, slots.gpu(), st);
      pagedmha::append_kv(knew.gpu(), vnew.gpu(), c.k_cache.gpu(), c.v_cache.gpu(), slots.gpu(), s.page_size, 1.0f,
                          1.0f, st);
      pagedmha::batch_decode(c.q.gpu(), c.k_cache.gpu(), c.v_cache.gpu(), c.page_table.gpu(), c.seq_lens.gpu(),
                             s.page_size, n, out.gpu(), c.params(true), lse.gpu(), wsv, st);
    };
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    // Global mode: any hidden synchronisation or allocation inside the ops fails capture.
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    step(out_g, lse_g);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

    for (int it = 0; it < 4; ++it) {
      // New live lengths (some padded rows: seq_len 1 on page 0) and permuted tables.
      std::vector<int> perm(B);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng.gen);
      for (int b = 0; b < B; ++b) {
        const bool pad = it > 0 && b == B - 1 - it;
        c.seq_lens.i32(b) = pad ? 1 : rng.uniform(n, 600);
        for (int col = 0; col < c.cols; ++col) {
          int32_t id;
          std::memcpy(&id, table0.data() + (static_cast<size_t>(perm[b]) * c.cols + col) * 4, 4);
          c.page_table.i32(static_cast<int64_t>(b) * c.cols + col) = pad ? 0 : id;
        }
      }
      CUDA_OK(cudaMemcpyAsync(c.seq_lens.dev.data(), c.seq_lens.host.data(), c.seq_lens.host.size(),
                              cudaMemcpyHostToDevice, stream));
      CUDA_OK(cudaMemcpyAsync(c.page_table.dev.data(), c.page_table.host.data(), c.page_table.host.size(),
                              cudaMemcpyHostToDevice, stream));
      step(out_e, lse_e);  // eager first; the replay writes the same tokens to the same slots
      CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      // Bitwise on real rows. A padded row's n tokens all land on slot 0 of the dummy
      // page, where the last writer is unspecified; it must only be finite.
      const std::vector<uint8_t> og = out_g.download(), oe = out_e.download(), lg = lse_g.download(),
                                 le = lse_e.download();
      const size_t out_row = static_cast<size_t>(s.num_q_heads) * D * 2, lse_row = s.num_q_heads * 4;
      for (int b = 0; b < B; ++b) {
        const bool pad = it > 0 && b == B - 1 - it;
        for (int i = 0; i < n; ++i) {
          const size_t r = static_cast<size_t>(b) * n + i;
          if (pad) {
            for (int x = 0; x < s.num_q_heads * D; ++x)
              EXPECT_TRUE(std::isfinite(oracle::load(oracle::Format::bf16, og.data() + r * out_row + x * 2)));
            continue;
          }
          EXPECT_EQ(0, std::memcmp(og.data() + r * out_row, oe.data() + r * out_row, out_row))
              << "n=" << n << " step " << it << " row " << r << ": out differs from eager";
          EXPECT_EQ(0, std::memcmp(lg.data() + r * lse_row, le.data() + r * lse_row, lse_row))
              << "n=" << n << " step " << it << " row " << r << ": lse differs from eager";
        }
      }
      // And the replayed result is right (oracle on the updated cache and metadata).
      if (it == 3) {
        c.k_cache.host = c.k_cache.download();
        c.v_cache.host = c.v_cache.download();
        for (int b = 0; b < B; ++b) c.spec.seq_lens[b] = c.seq_lens.i32(b);
        Result r{out_g.clone(), lse_g.clone()};
        r.out.host = out_g.download();
        r.lse.host = lse_g.download();
        expect_matches(c, r, oracle_reference(c), "graph replay vs oracle");
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
// The CPU path is skipped here (it would need the 8.6 GB pool on the host).
TEST(GpuLargePool, PageIdsAbove65535) {
  REQUIRE_GPU();
  const int P = 16, Hkv = 1, D = 128, Hq = 4;
  const int64_t num_pages = (int64_t{1} << 20) + 64;
  const int64_t elems = num_pages * P * Hkv * D;
  ASSERT_GT(elems, int64_t{1} << 31);
  const std::vector<int32_t> ids = {static_cast<int32_t>(num_pages - 1), 70000, 65536, 65535, 3,
                                    static_cast<int32_t>(num_pages - 30)};
  const int L = static_cast<int>(ids.size()) * P - 5;
  Buffer kbuf(elems * 2, Device::cuda(0)), vbuf(elems * 2, Device::cuda(0));
  pagedmha::fill_bytes(kbuf.data(), Device::cuda(0), 0xFF, elems * 2);
  pagedmha::fill_bytes(vbuf.data(), Device::cuda(0), 0xFF, elems * 2);
  const TensorView kc(kbuf.data(), DType::bf16, Device::cuda(0), {num_pages * P, Hkv, D});
  const TensorView vc(vbuf.data(), DType::bf16, Device::cuda(0), {num_pages * P, Hkv, D});

  // Write the request through append_kv: K random, V = the page's constant.
  Rng rng(6000);
  Tensor k(DType::bf16, {L, Hkv, D}), v(DType::bf16, {L, Hkv, D});
  std::vector<int32_t> slots;
  for (int p = 0; p < L; ++p) {
    slots.push_back(ids[p / P] * P + p % P);
    for (int d = 0; d < D; ++d) {
      k.set(k.offset({p, 0, d}), rng.normal());
      v.set(v.offset({p, 0, d}), 1.0 + (p / P) * 0.25 + d * 0.0078125);  // exact in bf16
    }
  }
  Tensor loc = int32_tensor(slots);
  for (Tensor* t : {&k, &v, &loc}) t->upload();
  pagedmha::append_kv(k.gpu(), v.gpu(), kc, vc, loc.gpu(), P);

  // The last page read back byte for byte.
  std::vector<uint8_t> last(static_cast<size_t>(P) * D * 2);
  pagedmha::copy_bytes(last.data(), Device::cpu(), static_cast<uint8_t*>(vbuf.data()) + (num_pages - 1) * P * D * 2,
                       Device::cuda(0), last.size());
  EXPECT_EQ(0, std::memcmp(last.data(), v.host.data(), last.size())) << "last page V";

  Tensor table(DType::int32, {1, static_cast<int64_t>(ids.size()) + 2});
  for (size_t x = 0; x < ids.size(); ++x) table.i32(x) = ids[x];
  Tensor lens = int32_tensor({L});
  const int n = 7;
  Tensor q(DType::bf16, {n, Hq, D}), cu = int32_tensor({0, n});
  for (int64_t x = 0; x < int64_t{n} * Hq * D; ++x) q.set(x, rng.normal());
  for (Tensor* t : {&table, &lens, &q, &cu}) t->upload();

  // Oracle over the dense request.
  std::vector<double> qd(static_cast<size_t>(n) * Hq * D), kd(static_cast<size_t>(L) * D), vd(kd.size());
  for (size_t x = 0; x < qd.size(); ++x) qd[x] = q.get(x);
  for (size_t x = 0; x < kd.size(); ++x) {
    kd[x] = k.get(x);
    vd[x] = v.get(x);
  }
  oracle::AttentionSpec os;
  os.num_q_heads = Hq;
  os.num_kv_heads = Hkv;
  os.head_dim = D;
  os.bmm1_scale = 1.0 / std::sqrt(128.0);
  std::vector<double> o(qd.size()), l(static_cast<size_t>(n) * Hq);
  oracle::attention(os, n, L, qd.data(), kd.data(), vd.data(), o.data(), l.data());

  pagedmha::AttentionParams params;
  params.bmm1_scale = static_cast<float>(os.bmm1_scale);
  for (int mode = 0; mode < 2; ++mode) {
    Tensor out(DType::bf16, {n, Hq, D});
    out.upload();
    if (mode == 0) {
      pagedmha::batch_prefill(q.gpu(), kc, vc, table.gpu(), lens.gpu(), cu.gpu(), P, n, out.gpu(), params);
    } else {
      // Decode: the 7 queries as a verify step of one request.
      const size_t bytes = pagedmha::decode_workspace_size(Device::cuda(0), 1, n, Hq, Hkv, D);
      Buffer ws(std::max<size_t>(bytes, 16), Device::cuda(0));
      pagedmha::batch_decode(q.gpu(), kc, vc, table.gpu(), lens.gpu(), P, n, out.gpu(), params, {},
                             bytes ? ws.bytes_view() : TensorView{});
    }
    pagedmha::synchronize();
    out.host = out.download();
    double err = 0, ref = 0;
    for (size_t x = 0; x < o.size(); ++x) {
      const double g = out.get(x);
      ASSERT_TRUE(std::isfinite(g)) << (mode ? "decode" : "prefill") << " element " << x;
      err += (g - o[x]) * (g - o[x]);
      ref += o[x] * o[x];
    }
    EXPECT_LE(std::sqrt(err / ref), 1e-2) << (mode ? "decode" : "prefill");
  }
}

}  // namespace
}  // namespace gpu_test
