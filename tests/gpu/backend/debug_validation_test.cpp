// Debug validation on CUDA: the backend's range checks (q and the keys read, a slot the
// step writes read from its new row) run before the step's K / V are written, so a
// rejected step leaves the pools and the output as they were, and a new row no query
// reads is not judged (the CPU twin: tests/cpu/backend/reject_unchanged_test.cpp,
// RejectUnchangedDebug).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/error_text.h"
#include "pagedmha/pagedmha.h"

namespace {

using namespace pagedmha;

constexpr int Hq = 4, Hkv = 2, D = 64, P = 4, C = 32, kMaxBs = 4, kCols = C / P, kPages = 1 + kMaxBs * kCols;
constexpr int64_t kRow = int64_t{Hkv} * D;  // elements per cache slot
constexpr uint16_t kNanBf16 = 0x7fc0, kInfBf16 = 0x7f80;

// A device copy of a host vector, downloadable for comparison.
template <class T>
struct Mirror {
  std::vector<T> host;
  Buffer dev;
  explicit Mirror(std::vector<T> h) : host(std::move(h)), dev(host.size() * sizeof(T), Device::cuda(0)) { upload(); }
  void upload() {
    copy_bytes(dev.data(), dev.device(), host.data(), Device::cpu(), host.size() * sizeof(T), {});
    synchronize({});
  }
  std::vector<T> download() {
    std::vector<T> out(host.size());
    copy_bytes(out.data(), Device::cpu(), dev.data(), dev.device(), host.size() * sizeof(T), {});
    synchronize({});
    return out;
  }
  TensorView view(DType t, std::initializer_list<int64_t> shape) { return TensorView(dev.data(), t, Device::cuda(0), shape); }
};

std::vector<uint16_t> random_bf16(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(nd(rng));
  return v;
}

TEST(BackendDebugValidation, RangeChecksRunBeforeTheWrite) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  struct DebugOn {
    DebugOn() { set_debug_validation(true); }
    ~DebugOn() { set_debug_validation(false); }
  } debug;
  std::mt19937 rng(12);
  std::vector<uint16_t> pool = random_bf16(std::size_t{kPages} * P * kRow, rng);
  std::fill(pool.begin(), pool.begin() + P * kRow, 0);  // page 0
  Mirror<uint16_t> kc(pool), vc(random_bf16(pool.size(), rng));
  std::vector<int32_t> table(std::size_t{kMaxBs + 1} * kCols, 0);
  for (int i = 1; i <= kMaxBs; ++i)
    for (int c = 0; c < kCols; ++c) table[std::size_t(i) * kCols + c] = 1 + (i - 1) * kCols + c;
  Mirror<int32_t> r2p(table), seq({5, 6}), rpi({1, 2});
  // The new tokens' slots: position 4 of request 1 (page 2), position 5 of request 2 (page 10).
  Mirror<int32_t> loc({2 * P + 0, 10 * P + 1});
  Mirror<uint16_t> q(random_bf16(2 * Hq * D, rng)), k(random_bf16(2 * kRow, rng)), v(random_bf16(2 * kRow, rng)),
      out(random_bf16(2 * Hq * D, rng));

  BackendConfig cfg;
  cfg.page_size = P, cfg.context_len = C, cfg.max_bs = kMaxBs, cfg.device = Device::cuda(0);
  cfg.num_q_heads = Hq, cfg.num_kv_heads = Hkv, cfg.head_dim = D;
  MhaBackend be(cfg);
  ForwardBatch fb;
  fb.forward_mode = ForwardMode::decode;
  fb.batch_size = 2;
  fb.seq_lens = seq.view(DType::int32, {2});
  fb.req_pool_indices = rpi.view(DType::int32, {2});
  fb.req_to_page = r2p.view(DType::int32, {kMaxBs + 1, kCols});
  be.init_forward_metadata(fb);
  LayerSpec layer;
  layer.num_q_heads = Hq, layer.num_kv_heads = Hkv, layer.head_dim = D, layer.scaling = 0.125f;
  const KvCacheView kv{kc.view(DType::bf16, {int64_t{kPages} * P, Hkv, D}),
                       vc.view(DType::bf16, {int64_t{kPages} * P, Hkv, D})};
  const auto step = [&] {
    return testutil::error_of([&] {
      be.forward_decode(q.view(DType::bf16, {2, Hq * D}), k.view(DType::bf16, {2, kRow}), v.view(DType::bf16, {2, kRow}),
                        layer, kv, loc.view(DType::int32, {2}), 2, out.view(DType::bf16, {2, Hq * D}));
      synchronize({});
    });
  };
  struct Poison {
    const char* name;
    Mirror<uint16_t>* t;
    int64_t at;
    uint16_t x;
    const char* what;
  } cases[] = {
      {"NaN in q", &q, Hq * D + 5, kNanBf16, ": q: expected finite values"},
      {"inf in the new k read by request 2", &k, kRow + 3, kInfBf16, ": k: expected finite values"},
      {"NaN in a cache row read (request 1, key 1: slot 5)", &kc, 5 * kRow + 7, kNanBf16,
       ": k_cache: expected finite values"},
  };
  for (const Poison& c : cases) {
    const uint16_t kept = c.t->host[c.at];
    c.t->host[c.at] = c.x;
    c.t->upload();
    const std::vector<uint16_t> k0 = kc.download(), v0 = vc.download(), o0 = out.download();
    const std::string msg = step();
    EXPECT_NE(msg.find(c.what), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find("2^56"), std::string::npos) << c.name << ": " << msg;
    EXPECT_EQ(kc.download(), k0) << c.name << ": K pool changed";
    EXPECT_EQ(vc.download(), v0) << c.name << ": V pool changed";
    EXPECT_EQ(out.download(), o0) << c.name << ": out changed";
    c.t->host[c.at] = kept;
    c.t->upload();
  }
  // A bad value in a slot this step overwrites is not read: the step runs and writes it.
  kc.host[2 * P * kRow + 1] = kNanBf16;
  kc.upload();
  EXPECT_EQ(step(), "");
  EXPECT_EQ(kc.download()[2 * P * kRow + 1], k.host[1]);
  // A new row no query reads (request 1's token aimed at slot 31, past its length: a
  // padding row) is not judged either.
  loc.host = {31, 10 * P + 1};
  loc.upload();
  k.host[7] = kNanBf16;
  k.upload();
  EXPECT_EQ(step(), "");
}

}  // namespace
