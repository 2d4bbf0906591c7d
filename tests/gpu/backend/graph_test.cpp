// CUDA-graph capture of MhaBackend decode, verify and block-draft steps (docs/semantics.md
// section 4): captured in cudaStreamCaptureModeGlobal for padded batch sizes
// {1, 2, 8, 64, 256}, replayed >= 50 times with changing lengths and page tables; real
// rows must be bitwise equal to eager runs (padded and unpadded), padded rows finite.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "oracle/oracle.h"
#include "pagedmha/pagedmha.h"

namespace {

using namespace pagedmha;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << cudaGetErrorString(x)

constexpr int Hq = 8, Hkv = 2, D = 128, P = 16, C = 1024, kMaxBs = 256, kCols = C / P;
constexpr int kPages = 1 + kMaxBs * kCols;

enum class Kind { decode, verify, block_draft };
void PrintTo(Kind k, std::ostream* os) {
  *os << (k == Kind::decode ? "decode" : k == Kind::verify ? "verify" : "block_draft");
}

struct Dev {
  Buffer buf;
  Dev(std::size_t bytes) : buf(bytes, Device::cuda(0)) {}
  template <class T>
  void put(const std::vector<T>& h, cudaStream_t s) {
    copy_bytes(buf.data(), buf.device(), h.data(), Device::cpu(), h.size() * sizeof(T), Stream{s});
  }
  std::vector<uint16_t> get16(std::size_t n, cudaStream_t s) const {
    std::vector<uint16_t> h(n);
    copy_bytes(h.data(), Device::cpu(), buf.data(), buf.device(), n * 2, Stream{s});
    synchronize(Stream{s});
    return h;
  }
};

std::vector<uint16_t> random_bf16(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<uint16_t> h(n);
  for (auto& x : h) oracle::store(oracle::Format::bf16, nd(rng), &x);
  return h;
}

class BackendGraph : public ::testing::TestWithParam<std::tuple<Kind, int>> {};

TEST_P(BackendGraph, ReplaysMatchEagerBitwise) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const auto [kind, bs] = GetParam();
  const int N = kind == Kind::decode ? 1 : 4;
  const int rows_per_req = N;  // q rows per request: verify N queries, block draft N rows
  std::mt19937 rng(1000 + bs * 3 + static_cast<int>(kind));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Pool: random K/V, page 0 zero.
  const std::size_t pool_elems = std::size_t{kPages} * P * Hkv * D;
  Dev k(pool_elems * 2), v(pool_elems * 2);
  {
    auto kh = random_bf16(pool_elems, rng), vh = random_bf16(pool_elems, rng);
    std::fill(kh.begin(), kh.begin() + P * Hkv * D, 0), std::fill(vh.begin(), vh.begin() + P * Hkv * D, 0);
    k.put(kh, stream), v.put(vh, stream);
  }
  const Device dev = Device::cuda(0);
  KvCacheView kv{TensorView(k.buf.data(), DType::bf16, dev, {int64_t{kPages} * P, Hkv, D}),
                 TensorView(v.buf.data(), DType::bf16, dev, {int64_t{kPages} * P, Hkv, D})};
  LayerSpec layer;
  layer.num_q_heads = Hq, layer.num_kv_heads = Hkv, layer.head_dim = D, layer.scaling = 1.0f / std::sqrt(float(D));

  BackendConfig cfg;
  cfg.page_size = P, cfg.context_len = C, cfg.max_bs = kMaxBs, cfg.device = dev, cfg.stream = Stream{stream};
  cfg.spec_num_tokens = N, cfg.num_q_heads = Hq, cfg.num_kv_heads = Hkv, cfg.head_dim = D;
  cfg.is_draft = kind == Kind::block_draft;
  cfg.draft_block_decode = kind == Kind::block_draft;
  MhaBackend graph_be(cfg), eager_be(cfg);
  const ForwardMode mode = kind == Kind::verify ? ForwardMode::target_verify : ForwardMode::decode;

  Dev seq_buf(kMaxBs * 4), rpi_buf(kMaxBs * 4), ends_buf(kMaxBs * 4), r2p(std::size_t{kMaxBs + 1} * kCols * 4);
  Dev eager_seq(kMaxBs * 4), eager_rpi(kMaxBs * 4);
  const int64_t qrows = int64_t{kMaxBs} * rows_per_req;
  Dev q(qrows * Hq * D * 2), out_g(qrows * Hq * D * 2), out_e(qrows * Hq * D * 2), out_u(qrows * Hq * D * 2);
  seq_buf.put(std::vector<int32_t>(kMaxBs, 1), stream);
  rpi_buf.put(std::vector<int32_t>(kMaxBs, 0), stream);
  ends_buf.put(std::vector<int32_t>(kMaxBs, 1), stream);
  r2p.put(std::vector<int32_t>(std::size_t{kMaxBs + 1} * kCols, 0), stream);
  const TensorView seq_view(seq_buf.buf.data(), DType::int32, dev, {kMaxBs});
  graph_be.init_cuda_graph_state(kMaxBs, seq_view);

  auto q_view = [&](const Dev& d, int64_t rows) {
    return TensorView(d.buf.data(), DType::bf16, dev, {rows, int64_t{Hq} * D});
  };
  const TensorView ends_view(ends_buf.buf.data(), DType::int32, dev, {kMaxBs});
  const int64_t rows = int64_t{bs} * rows_per_req;

  // Capture (metadata first, outside the graph).
  graph_be.init_forward_metadata_capture_cuda_graph(bs, mode);
  synchronize(Stream{stream});
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  if (kind == Kind::block_draft) graph_be.fill_block_decode_seq_lens(bs, ends_view);
  graph_be.forward_decode(q_view(q, rows), {}, {}, layer, kv, {}, bs, q_view(out_g, rows));
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  for (int step = 0; step < 50; ++step) {
    // Live batch: real rows first, padded rows (seq 1, request row 0) after.
    const int real = step == 0 ? bs : 1 + static_cast<int>(rng() % bs);
    std::vector<int32_t> seq(kMaxBs, 1), rpi(kMaxBs, 0), ends(kMaxBs, 1);
    std::vector<int32_t> table(std::size_t{kMaxBs + 1} * kCols, 0);
    for (int i = 1; i <= kMaxBs; ++i)  // tables change every step
      for (int c = 0; c < kCols; ++c)
        table[static_cast<std::size_t>(i) * kCols + c] =
            1 + static_cast<int32_t>((static_cast<std::size_t>(i - 1) * kCols + c + step * 131) % (kPages - 1));
    std::vector<int> perm(kMaxBs);
    for (int i = 0; i < kMaxBs; ++i) perm[i] = i + 1;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int r = 0; r < real; ++r) {
      rpi[r] = perm[r];
      seq[r] = 1 + static_cast<int32_t>(rng() % C);
      ends[r] = 1 + static_cast<int32_t>(rng() % (C + 8));  // may exceed C: clamped
    }
    seq_buf.put(seq, stream), rpi_buf.put(rpi, stream), ends_buf.put(ends, stream), r2p.put(table, stream);
    q.put(random_bf16(std::size_t(qrows) * Hq * D, rng), stream);

    ForwardBatch fb;
    fb.forward_mode = mode;
    fb.batch_size = bs;
    fb.seq_lens = seq_view;
    fb.req_pool_indices = TensorView(rpi_buf.buf.data(), DType::int32, dev, {kMaxBs});
    fb.req_to_page = TensorView(r2p.buf.data(), DType::int32, dev, {kMaxBs + 1, kCols});
    graph_be.init_forward_metadata_replay_cuda_graph(fb);
    CUDA_OK(cudaGraphLaunch(exec, stream));

    // Eager, same padded batch; the drafter's block ends arrive as its seq_lens.
    ForwardBatch eb = fb;
    eager_seq.put(kind == Kind::block_draft ? ends : seq, stream);
    eb.seq_lens = TensorView(eager_seq.buf.data(), DType::int32, dev, {kMaxBs});
    eager_be.init_forward_metadata(eb);
    eager_be.forward_decode(q_view(q, rows), {}, {}, layer, kv, {}, bs, q_view(out_e, rows));
    // Eager, unpadded: only the real rows.
    eb.batch_size = real;
    eager_be.init_forward_metadata(eb);
    eager_be.forward_decode(q_view(q, int64_t{real} * rows_per_req), {}, {}, layer, kv, {}, real,
                            q_view(out_u, int64_t{real} * rows_per_req));

    const std::size_t n = std::size_t(rows) * Hq * D, n_real = std::size_t(real) * rows_per_req * Hq * D;
    const auto g = out_g.get16(n, stream), e = out_e.get16(n, stream), u = out_u.get16(n_real, stream);
    ASSERT_EQ(std::memcmp(g.data(), e.data(), n * 2), 0) << "graph != eager (padded), step " << step;
    ASSERT_EQ(std::memcmp(g.data(), u.data(), n_real * 2), 0) << "padded real rows != unpadded, step " << step;
    for (std::size_t i = n_real; i < n; ++i) {
      ASSERT_TRUE(std::isfinite(oracle::load(oracle::Format::bf16, &g[i]))) << "padded row element " << i;
    }
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
}

std::string name(const ::testing::TestParamInfo<std::tuple<Kind, int>>& info) {
  return ::testing::PrintToString(std::get<0>(info.param)) + "_bs" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Steps, BackendGraph,
                         ::testing::Combine(::testing::Values(Kind::decode, Kind::verify, Kind::block_draft),
                                            ::testing::Values(1, 2, 8, 64, 256)),
                         name);

}  // namespace
