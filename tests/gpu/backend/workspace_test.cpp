// MhaBackend's decode workspace on the device: sized up front from the config geometry or
// register_layers for every batch a step can bring (decode, verify, block draft), an
// engine workspace too small and an unsized backend are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "common/error_text.h"
#include "pagedmha/pagedmha.h"

namespace {

using namespace pagedmha;

constexpr int Hq = 8, Hkv = 2, D = 128, P = 16, C = 256, kMaxBs = 64, kCols = C / P;
constexpr std::size_t kMaxRowElems = 32 * 256, kMaxKvElems = 4 * 256;  // largest layers below

LayerSpec layer_spec(int hq = Hq, int hkv = Hkv, int d = D) {
  LayerSpec l;
  l.num_q_heads = hq, l.num_kv_heads = hkv, l.head_dim = d, l.scaling = 1.0f / std::sqrt(float(d));
  return l;
}

BackendConfig base_config(int N, bool block_draft) {
  BackendConfig c;
  c.page_size = P, c.context_len = C, c.max_bs = kMaxBs, c.device = Device::cuda(0);
  c.spec_num_tokens = N, c.is_draft = block_draft, c.draft_block_decode = block_draft;
  return c;
}

using testutil::error_of;

// One eager decode-mode step of bs requests (lengths 1..C, every page the zeroed page 0).
struct Step {
  Buffer cache, seq, rpi, r2p, q, out;
  Step()
      : cache(P * kMaxKvElems * 2, Device::cuda(0)),
        seq(kMaxBs * 4, Device::cuda(0)),
        rpi(kMaxBs * 4, Device::cuda(0)),
        r2p(std::size_t{kMaxBs + 1} * kCols * 4, Device::cuda(0)),
        q(std::size_t{kMaxBs} * 4 * kMaxRowElems * 2, Device::cuda(0)),
        out(q.bytes(), Device::cuda(0)) {
    fill_bytes(cache.data(), cache.device(), 0, cache.bytes(), {});
    fill_bytes(rpi.data(), rpi.device(), 0, rpi.bytes(), {});
    fill_bytes(r2p.data(), r2p.device(), 0, r2p.bytes(), {});
    fill_bytes(q.data(), q.device(), 0, q.bytes(), {});
    std::vector<int32_t> lens(kMaxBs);
    for (int i = 0; i < kMaxBs; ++i) lens[i] = 1 + (i * 37) % C;
    copy_bytes(seq.data(), seq.device(), lens.data(), Device::cpu(), lens.size() * 4, {});
    synchronize({});
  }
  void run(MhaBackend& be, int bs, const LayerSpec& layer) {
    const Device dev = Device::cuda(0);
    const int N = be.config().spec_num_tokens;
    ForwardBatch fb;
    fb.forward_mode = N > 1 && !be.config().is_draft ? ForwardMode::target_verify : ForwardMode::decode;
    fb.batch_size = bs;
    fb.seq_lens = TensorView(seq.data(), DType::int32, dev, {kMaxBs});
    fb.req_pool_indices = TensorView(rpi.data(), DType::int32, dev, {kMaxBs});
    fb.req_to_page = TensorView(r2p.data(), DType::int32, dev, {kMaxBs + 1, kCols});
    be.init_forward_metadata(fb);
    const int64_t rows = int64_t{bs} * N;
    const int64_t row = int64_t{layer.num_q_heads} * layer.head_dim;
    const KvCacheView kv{TensorView(cache.data(), DType::bf16, dev, {P, layer.num_kv_heads, layer.head_dim}),
                         TensorView(cache.data(), DType::bf16, dev, {P, layer.num_kv_heads, layer.head_dim})};
    be.forward_decode(TensorView(q.data(), DType::bf16, dev, {rows, row}), {}, {}, layer, kv, {}, bs,
                      TensorView(out.data(), DType::bf16, dev, {rows, row}));
    synchronize({});
  }
};

class BackendWorkspace : public ::testing::TestWithParam<int> {};  // 0 decode, 1 verify, 2 block draft

// Every batch size up to max_bs runs on the workspace sized once at construction (no
// allocation afterwards), and on one sized by register_layers without a config geometry.
TEST_P(BackendWorkspace, SizedUpFrontForEveryBatch) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int kind = GetParam();
  const int N = kind == 0 ? 1 : 4;
  Step step;
  BackendConfig c = base_config(N, kind == 2);
  c.num_q_heads = Hq, c.num_kv_heads = Hkv, c.head_dim = D;
  MhaBackend from_config(c);
  for (int bs = 1; bs <= kMaxBs; ++bs) ASSERT_NO_THROW(step.run(from_config, bs, layer_spec())) << "bs " << bs;

  MhaBackend registered(base_config(N, kind == 2));
  const LayerSpec small = layer_spec(4, 4, 64), large = layer_spec(16, 2, 256);
  registered.register_layers({small, large});
  for (int bs : {1, 2, 3, 7, 31, 64}) {
    ASSERT_NO_THROW(step.run(registered, bs, small)) << "bs " << bs;
    ASSERT_NO_THROW(step.run(registered, bs, large)) << "bs " << bs;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, BackendWorkspace, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == 0 ? "decode" : info.param == 1 ? "verify" : "block_draft");
                         });

TEST(BackendWorkspaceErrors, EngineWorkspaceTooSmallAndUnsizedBackend) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  BackendConfig c = base_config(1, false);
  c.num_q_heads = Hq, c.num_kv_heads = Hkv, c.head_dim = D;
  c.workspace_bytes = 16;
  const std::size_t need = decode_workspace_size(Device::cuda(0), 1, 1, Hq, Hkv, D);
  ASSERT_GT(need, 16u);  // a one-request decode needs workspace on the GPU
  std::string m = error_of([&] { MhaBackend be(c); });
  EXPECT_NE(m.find("config.workspace_bytes: expected >= "), std::string::npos) << m;
  EXPECT_NE(m.find("got 16"), std::string::npos) << m;

  // Engine workspace without a geometry: checked per call.
  c.num_q_heads = c.num_kv_heads = c.head_dim = 0;
  MhaBackend engine_ws(c);
  Step step;
  m = error_of([&] { step.run(engine_ws, 1, layer_spec()); });
  EXPECT_NE(m.find("config.workspace_bytes: expected >= " + std::to_string(need)), std::string::npos) << m;
  m = error_of([&] { engine_ws.register_layers({layer_spec()}); });
  EXPECT_NE(m.find("config.workspace_bytes"), std::string::npos) << m;

  // Neither geometry nor registered layers: the first decode names the fix.
  MhaBackend unsized(base_config(1, false));
  m = error_of([&] { step.run(unsized, 1, layer_spec()); });
  EXPECT_NE(m.find("register_layers"), std::string::npos) << m;
  // A layer larger than the registered ones, at a batch whose need exceeds the workspace
  // (one request of it fits in what 64 requests of the small layer were given).
  unsized.register_layers({layer_spec(4, 4, 64)});
  ASSERT_GT(decode_workspace_size(Device::cuda(0), kMaxBs, 1, 32, 2, 256),
            decode_workspace_size(Device::cuda(0), kMaxBs, 1, 4, 4, 64));
  m = error_of([&] { step.run(unsized, kMaxBs, layer_spec(32, 2, 256)); });
  EXPECT_NE(m.find("Hq 32, Hkv 2, D 256"), std::string::npos) << m;
}

}  // namespace
