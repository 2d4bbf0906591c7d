// Mixed steps on CUDA run the extend rows' batch_prefill on the backend's stream and the
// trailing decode rows' batch_decode beside it on a side stream (fork after the K/V
// write, join before returning). Checked bitwise against the same ops issued one after
// the other on one stream, layer after layer with no host synchronisation in between (a
// missing fork would read unwritten K/V, a missing join would copy unfinished rows), in
// eager mode and replayed from a graph captured in cudaStreamCaptureModeGlobal; a few
// rows also against the fp64 oracle. A backend whose config leaves 100 SMs free
// (config.sm_margin, passed to both kernels) gives the same bits.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "oracle/oracle.h"
#include "pagedmha/pagedmha.h"

namespace {

using namespace pagedmha;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << cudaGetErrorString(x)

constexpr int Hq = 16, Hkv = 2, D = 128, P = 16, C = 2048, kCols = C / P, kLayers = 3;

// Deterministic bf16 bits of a value in about [-2, 2] (cheap enough for a 100 MB pool).
uint16_t bf16_of_index(uint64_t i, uint64_t salt) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ salt;
  x ^= x >> 29, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 32;
  const double v = (static_cast<double>(x % 4001) - 2000.0) / 1000.0;
  uint16_t b;
  oracle::store(oracle::Format::bf16, v, &b);
  return b;
}

struct DevBuf {
  Buffer buf;
  explicit DevBuf(std::size_t bytes) : buf(std::max<std::size_t>(bytes, 4), Device::cuda(0)) {}
  template <class T>
  void put(const std::vector<T>& h, Stream s) {
    copy_bytes(buf.data(), buf.device(), h.data(), Device::cpu(), h.size() * sizeof(T), s);
  }
  template <class T>
  std::vector<T> get(std::size_t n, Stream s) const {
    std::vector<T> h(n);
    copy_bytes(h.data(), Device::cpu(), buf.data(), buf.device(), n * sizeof(T), s);
    synchronize(s);
    return h;
  }
};

TEST(BackendMixedStreams, PrefillBesideDecodeEqualsSequentialOpsEagerAndCaptured) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t cs;
  CUDA_OK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  const Stream s{cs};
  const Device dev = Device::cuda(0);

  // 3 extend rows (after prefixes, one of none) then 120 decode rows of 1..2047 keys.
  std::mt19937 rng(4242);
  std::vector<int32_t> ext = {700, 300, 129}, prefix = {500, 0, 1000};
  for (int i = 0; i < 120; ++i) {
    ext.push_back(1);
    prefix.push_back(static_cast<int32_t>(rng() % (C - 1)));
  }
  const int bs = static_cast<int>(ext.size()), n_pre = 3, n_dec = bs - n_pre;
  std::vector<int32_t> seq(bs), cu(bs + 1, 0), rpi(bs);
  for (int r = 0; r < bs; ++r) seq[r] = prefix[r] + ext[r], cu[r + 1] = cu[r] + ext[r], rpi[r] = r + 1;
  const int T = cu[bs], t_pre = cu[n_pre];

  // Request r + 1 owns pages [1 + r * kCols, 1 + (r + 1) * kCols) in a scrambled order.
  const int pages = 1 + bs * kCols;
  std::vector<int32_t> r2p(static_cast<std::size_t>(bs + 1) * kCols, 0), slots;
  for (int r = 0; r < bs; ++r)
    for (int c = 0; c < kCols; ++c)
      r2p[static_cast<std::size_t>(r + 1) * kCols + c] = 1 + r * kCols + (c * 37) % kCols;
  for (int r = 0; r < bs; ++r)
    for (int p = prefix[r]; p < seq[r]; ++p)
      slots.push_back(static_cast<int32_t>(oracle::slot_of(&r2p[static_cast<std::size_t>(r + 1) * kCols], p, P)));

  const std::size_t pool = static_cast<std::size_t>(pages) * P * Hkv * D;
  std::vector<uint16_t> kh(pool), vh(pool);
  for (std::size_t i = 0; i < pool; ++i) kh[i] = bf16_of_index(i, 1), vh[i] = bf16_of_index(i, 2);
  std::fill(kh.begin(), kh.begin() + P * Hkv * D, 0), std::fill(vh.begin(), vh.begin() + P * Hkv * D, 0);
  // Pools: the backend's (eager), the sequential ops', and the graph's.
  DevBuf kb(pool * 2), vb(pool * 2), ks(pool * 2), vs(pool * 2), kg(pool * 2), vg(pool * 2), km(pool * 2),
      vm(pool * 2);
  for (DevBuf* b : {&kb, &ks, &kg, &km}) b->put(kh, s);
  for (DevBuf* b : {&vb, &vs, &vg, &vm}) b->put(vh, s);
  auto kv_of = [&](DevBuf& k, DevBuf& v) {
    return KvCacheView{TensorView(k.buf.data(), DType::bf16, dev, {int64_t{pages} * P, Hkv, D}),
                       TensorView(v.buf.data(), DType::bf16, dev, {int64_t{pages} * P, Hkv, D})};
  };

  DevBuf seq_d(bs * 4), rpi_d(bs * 4), r2p_d(r2p.size() * 4), slots_d(T * 4), cu_d((bs + 1) * 4), tab_d(bs * kCols * 4);
  seq_d.put(seq, s), rpi_d.put(rpi, s), r2p_d.put(r2p, s), slots_d.put(slots, s), cu_d.put(cu, s);
  tab_d.put(std::vector<int32_t>(r2p.begin() + kCols, r2p.end()), s);
  const std::size_t qn = static_cast<std::size_t>(T) * Hq * D, kn = static_cast<std::size_t>(T) * Hkv * D;
  std::vector<DevBuf> q, k, v;  // per layer
  for (int l = 0; l < kLayers; ++l) {
    q.emplace_back(qn * 2), k.emplace_back(kn * 2), v.emplace_back(kn * 2);
    std::vector<uint16_t> h(qn);
    for (std::size_t i = 0; i < qn; ++i) h[i] = bf16_of_index(i, 10 + l);
    q.back().put(h, s);
    h.resize(kn);
    for (std::size_t i = 0; i < kn; ++i) h[i] = bf16_of_index(i, 20 + l);
    k.back().put(h, s);
    for (std::size_t i = 0; i < kn; ++i) h[i] = bf16_of_index(i, 30 + l);
    v.back().put(h, s);
  }
  DevBuf out_b(qn * 2 * kLayers), out_s(qn * 2 * kLayers), out_g(qn * 2 * kLayers), out_m(qn * 2 * kLayers);
  auto view3 = [&](const DevBuf& b, int64_t rows, int H, std::size_t offset_elems = 0) {
    return TensorView(static_cast<uint16_t*>(b.buf.data()) + offset_elems, DType::bf16, dev, {rows, H, D});
  };
  auto i32 = [&](const DevBuf& b, int64_t n, int64_t off = 0) {
    return TensorView(static_cast<int32_t*>(b.buf.data()) + off, DType::int32, dev, {n});
  };

  LayerSpec layer;
  layer.num_q_heads = Hq, layer.num_kv_heads = Hkv, layer.head_dim = D;
  layer.scaling = 1.0f / std::sqrt(float(D));
  std::vector<float> sinks_h(Hq);
  for (int h = 0; h < Hq; ++h) sinks_h[h] = 0.25f * static_cast<float>(h % 5) - 0.5f;
  DevBuf sinks_d(Hq * 4);
  sinks_d.put(sinks_h, s);
  layer.sinks = TensorView(sinks_d.buf.data(), DType::fp32, dev, {Hq});

  BackendConfig cfg;
  cfg.page_size = P, cfg.context_len = C, cfg.max_bs = bs, cfg.device = dev, cfg.stream = s;
  cfg.num_q_heads = Hq, cfg.num_kv_heads = Hkv, cfg.head_dim = D;
  MhaBackend be(cfg);
  ForwardBatch fb;
  fb.forward_mode = ForwardMode::mixed;
  fb.batch_size = bs;
  fb.seq_lens = i32(seq_d, bs);
  fb.req_pool_indices = i32(rpi_d, bs);
  fb.extend_seq_lens_cpu = TensorView(ext.data(), DType::int32, Device::cpu(), {bs});
  fb.extend_prefix_lens_cpu = TensorView(prefix.data(), DType::int32, Device::cpu(), {bs});
  fb.out_cache_loc = i32(slots_d, T);
  fb.req_to_page = TensorView(r2p_d.buf.data(), DType::int32, dev, {bs + 1, kCols});
  be.init_forward_metadata(fb);
  ASSERT_EQ(be.prefill_metadata()->decode_rows, n_dec);

  // Backend, eager: the layers back to back, one copy-out at the end.
  const KvCacheView kv_b = kv_of(kb, vb), kv_s = kv_of(ks, vs), kv_g = kv_of(kg, vg);
  for (int l = 0; l < kLayers; ++l)
    be.forward_extend(view3(q[l], T, Hq), view3(k[l], T, Hkv), view3(v[l], T, Hkv), layer, kv_b, fb.out_cache_loc, bs,
                      view3(out_b, T, Hq, qn * l));

  // The same with 100 SMs left free by every kernel (config.sm_margin).
  BackendConfig cfg_m = cfg;
  cfg_m.sm_margin = 100;
  MhaBackend be_m(cfg_m);
  be_m.init_forward_metadata(fb);
  const KvCacheView kv_m = kv_of(km, vm);
  for (int l = 0; l < kLayers; ++l)
    be_m.forward_extend(view3(q[l], T, Hq), view3(k[l], T, Hkv), view3(v[l], T, Hkv), layer, kv_m, fb.out_cache_loc,
                        bs, view3(out_m, T, Hq, qn * l));

  // The same ops one after the other on the one stream.
  AttentionParams params;
  params.bmm1_scale = layer.scaling;
  params.sinks = layer.sinks;
  const TensorView table(tab_d.buf.data(), DType::int32, dev, {bs, kCols});
  Buffer ws(decode_workspace_size(dev, n_dec, 1, Hq, Hkv, D), dev);
  Buffer plan(prefill_workspace_size(dev, n_pre, t_pre), dev);
  for (int l = 0; l < kLayers; ++l) {
    append_kv(view3(k[l], T, Hkv), view3(v[l], T, Hkv), kv_s.k_cache, kv_s.v_cache, i32(slots_d, T), P, 1.0f, 1.0f, s);
    const TensorView o = view3(out_s, T, Hq, qn * l);
    batch_prefill(view3(q[l], T, Hq).slice(0, 0, t_pre), kv_s.k_cache, kv_s.v_cache, table.slice(0, 0, n_pre),
                  i32(seq_d, n_pre), i32(cu_d, n_pre + 1), P, 700, o.slice(0, 0, t_pre), params, {}, plan.bytes_view(),
                  s);
    batch_decode(view3(q[l], T, Hq).slice(0, t_pre, n_dec), kv_s.k_cache, kv_s.v_cache, table.slice(0, n_pre, n_dec),
                 i32(seq_d, n_dec, n_pre), P, 1, o.slice(0, t_pre, n_dec), params, {}, ws.bytes_view(), s);
  }

  // Backend, captured once (all layers) and replayed twice.
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
  for (int l = 0; l < kLayers; ++l)
    be.forward_extend(view3(q[l], T, Hq), view3(k[l], T, Hkv), view3(v[l], T, Hkv), layer, kv_g, fb.out_cache_loc, bs,
                      view3(out_g, T, Hq, qn * l));
  CUDA_OK(cudaStreamEndCapture(cs, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 2; ++rep) CUDA_OK(cudaGraphLaunch(exec, cs));

  const auto ob = out_b.get<uint16_t>(qn * kLayers, s), os = out_s.get<uint16_t>(qn * kLayers, s),
             og = out_g.get<uint16_t>(qn * kLayers, s), om = out_m.get<uint16_t>(qn * kLayers, s);
  int64_t diff_eager = 0, diff_graph = 0, diff_margin = 0;
  for (std::size_t i = 0; i < ob.size(); ++i)
    diff_eager += ob[i] != os[i], diff_graph += og[i] != os[i], diff_margin += om[i] != os[i];
  EXPECT_EQ(diff_eager, 0) << "elements differing from the sequential ops (eager)";
  EXPECT_EQ(diff_graph, 0) << "elements differing from the sequential ops (graph replay)";
  EXPECT_EQ(diff_margin, 0) << "elements differing from the sequential ops (config.sm_margin 100)";
  EXPECT_TRUE(kb.get<uint16_t>(pool, s) == ks.get<uint16_t>(pool, s)) << "K pools differ";
  EXPECT_TRUE(vb.get<uint16_t>(pool, s) == vs.get<uint16_t>(pool, s)) << "V pools differ";

  // fp64 oracle on the last layer: each extend row's last query and a few decode rows.
  const auto kpool = kb.get<uint16_t>(pool, s), vpool = vb.get<uint16_t>(pool, s);
  const auto qh = q[kLayers - 1].get<uint16_t>(qn, s);
  std::vector<double> sinks64(sinks_h.begin(), sinks_h.end());
  for (int r : {0, 1, 2, 3, 50, bs - 1}) {
    const int L = seq[r], qi = cu[r + 1] - 1;
    const int32_t* row = &r2p[static_cast<std::size_t>(r + 1) * kCols];
    std::vector<double> kk(static_cast<std::size_t>(L) * Hkv * D), vv(kk.size()), qq(Hq * D), o(Hq * D), lse(Hq);
    for (int j = 0; j < L; ++j)
      for (int e = 0; e < Hkv * D; ++e) {
        const int64_t slot = oracle::slot_of(row, j, P);
        kk[static_cast<std::size_t>(j) * Hkv * D + e] = oracle::load(oracle::Format::bf16, &kpool[slot * Hkv * D + e]);
        vv[static_cast<std::size_t>(j) * Hkv * D + e] = oracle::load(oracle::Format::bf16, &vpool[slot * Hkv * D + e]);
      }
    for (int e = 0; e < Hq * D; ++e) qq[e] = oracle::load(oracle::Format::bf16, &qh[static_cast<std::size_t>(qi) * Hq * D + e]);
    oracle::AttentionSpec spec;
    spec.num_q_heads = Hq, spec.num_kv_heads = Hkv, spec.head_dim = D;
    spec.bmm1_scale = layer.scaling;
    spec.sinks = &sinks64;
    // The query is the last of an n = 1 block at position L - 1.
    oracle::attention(spec, 1, L, qq.data(), kk.data(), vv.data(), o.data(), lse.data());
    double num = 0, den = 0;
    for (int e = 0; e < Hq * D; ++e) {
      const double got = oracle::load(oracle::Format::bf16, &ob[qn * (kLayers - 1) + static_cast<std::size_t>(qi) * Hq * D + e]);
      num += (got - o[e]) * (got - o[e]), den += o[e] * o[e];
    }
    EXPECT_LT(std::sqrt(num / den), 1e-2) << "row " << r << " (L " << L << ")";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(cs);
}

}  // namespace
