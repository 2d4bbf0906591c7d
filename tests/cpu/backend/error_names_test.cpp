// Errors of the backend name the call the user made and the argument they passed, whichever
// inner op rejects the input (issue 12: create_backend(head_dim=96) used to report
// "decode_workspace_size: head_dim"; a missing CUDA device leaked a runtime call and its
// source path). Expected messages are written out by hand.
#include <gtest/gtest.h>

#include <string>

#include "backend_fixture.h"

namespace btest {
namespace {

using V = std::vector<int32_t>;
constexpr int Hq = 4, Hkv = 2, D = 64, P = 4, C = 32, kMaxBs = 4;

// The message of the Error `call` throws ("no error" when it throws none).
template <class F>
std::string message(F&& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// `m` starts with `head` and names none of the inner ops.
::testing::AssertionResult names(const std::string& m, const std::string& head) {
  if (m.compare(0, head.size(), head) != 0) return ::testing::AssertionFailure() << "got: " << m;
  for (const char* inner : {"decode_workspace_size", "gather_page_table_with_padding", "decode_write_slots",
                            "extend_write_slots", "append_kv", "clamp_seq_lens", "Buffer"}) {
    if (m.find(inner) != std::string::npos) return ::testing::AssertionFailure() << "names " << inner << ": " << m;
  }
  return ::testing::AssertionSuccess();
}

BackendConfig config(int N = 1) { return make_config(P, C, kMaxBs, N); }

struct Step {
  std::mt19937 rng{11};
  Layer layer{Hq, Hkv, D, P, 1 + kMaxBs * (C / P), DType::bf16, rng};
  Ints r2p{V(static_cast<size_t>(kMaxBs + 1) * (C / P), 0), kMaxBs + 1, C / P};
  Ints seq{V{5, 6}}, rpi{V{1, 2}};
  Floats q{DType::bf16, {2, Hq * D}}, k{DType::bf16, {2, Hkv * D}}, v{DType::bf16, {2, Hkv * D}},
      out{DType::bf16, {2, Hq * D}};
  Step() {
    for (int i = 1; i <= kMaxBs; ++i)
      for (int c = 0; c < C / P; ++c) r2p.v[static_cast<size_t>(i) * (C / P) + c] = 1 + (i - 1) * (C / P) + c;
  }
  ForwardBatch decode() {
    ForwardBatch fb = decode_batch(seq.view(), rpi.view(), r2p.view());
    return fb;
  }
};

TEST(BackendErrorNames, CreateBackendNamesItselfAndTheConfigField) {
  BackendConfig c = config();
  c.num_q_heads = 8, c.num_kv_heads = 8, c.head_dim = 96;
  EXPECT_TRUE(names(message([&] { create_backend("trtllm", c); }),
                    "create_backend: config.head_dim: expected 64, 128 or 256, got 96"));
  EXPECT_TRUE(names(message([&] { MhaBackend{c}; }), "MhaBackend: config.head_dim: expected 64, 128 or 256, got 96"));
  c.head_dim = 128, c.num_kv_heads = 0;
  EXPECT_TRUE(names(message([&] { create_backend("pagedmha", c); }), "create_backend: config.num_kv_heads: expected >= 1, got 0"));
  c = config();
  c.page_size = 0;
  EXPECT_TRUE(names(message([&] { create_backend("pagedmha", c); }), "create_backend: config.page_size: expected >= 1, got 0"));
  c = config();
  c.sm_margin = -1;
  EXPECT_TRUE(names(message([&] { create_backend("pagedmha", c); }), "create_backend: config.sm_margin: expected >= 0, got -1"));
}

// A state cache group listed twice is a config mistake (the engine's groups are distinct).
TEST(BackendErrorNames, DuplicateStateCacheGroupsAreRejected) {
  BackendConfig c = config();
  c.state_cache_groups = {"mamba", "conv", "mamba"};
  EXPECT_TRUE(names(message([&] { create_backend("trtllm", c); }),
                    "create_backend: config.state_cache_groups: expected distinct cache group ids, got 'mamba' twice"));
  EXPECT_TRUE(names(message([&] { MhaBackend{c}; }),
                    "MhaBackend: config.state_cache_groups: expected distinct cache group ids, got 'mamba' twice"));
  c.state_cache_groups = {"mamba", "conv"};
  EXPECT_EQ(message([&] { MhaBackend{c}; }), "no error");
}

// A factory's own error still says which call the user made.
TEST(BackendErrorNames, CreateBackendPrefixesAFactoryError) {
  register_backend("error_names_test", [](const BackendConfig&) -> std::unique_ptr<MhaBackend> {
    throw Error("MyBackend: config.page_size: expected 64, got 16");
  });
  EXPECT_EQ(message([] { create_backend("error_names_test", config()); }),
            "create_backend: MyBackend: config.page_size: expected 64, got 16");
}

// No CUDA device, driver or support: one sentence naming create_backend and config.device,
// without a CUDA runtime call or a source path.
TEST(BackendErrorNames, UnusableCudaDeviceIsOneSentence) {
  BackendConfig c = config();
  c.device = Device::cuda(cuda_available() ? 4096 : 0);
  const std::string m = message([&] { create_backend("trtllm", c); });
  const std::string expected = !built_with_cuda() ? "create_backend: config.device: expected cpu (this build has no "
                                                    "CUDA support), got cuda:0"
                                                  : "create_backend: config.device: expected a usable CUDA device, got cuda:";
  EXPECT_TRUE(names(m, expected));
  for (const char* leak : {"/", ".cu", "cudaGetDevice", "CUDA error", "\n"}) {
    EXPECT_EQ(m.find(leak), std::string::npos) << leak << " in: " << m;
  }
  if (built_with_cuda() && !cuda_available()) {
    EXPECT_NE(m.find("no CUDA"), std::string::npos) << m;  // says why
  }
}

TEST(BackendErrorNames, RegisterLayersNamesTheLayer) {
  MhaBackend be(config());
  LayerSpec ok, bad;
  ok.num_q_heads = 8, ok.num_kv_heads = 2, ok.head_dim = 128;
  bad.num_q_heads = 8, bad.num_kv_heads = 2, bad.head_dim = 96;
  EXPECT_TRUE(names(message([&] { be.register_layers({ok, bad}); }),
                    "MhaBackend.register_layers: layers[1].head_dim: expected 64, 128 or 256, got 96"));
}

TEST(BackendErrorNames, InitForwardMetadataNamesTheBatchField) {
  Step st;
  MhaBackend be(config());
  Ints far({1, 9});  // req_to_page has 5 rows
  ForwardBatch fb = st.decode();
  fb.req_pool_indices = far.view();
  EXPECT_TRUE(names(message([&] { be.init_forward_metadata(fb); }),
                    "MhaBackend.init_forward_metadata: batch.req_pool_indices: "));
  fb = st.decode();
  fb.batch_size = 5;
  EXPECT_TRUE(names(message([&] { be.init_forward_metadata(fb); }),
                    "MhaBackend.init_forward_metadata: batch.batch_size: expected 0..4 (max_bs), got 5"));
  // A cache-group table too narrow for the request's write position (decode_write_slots').
  Ints narrow(V{1, 2}, 2, 1);
  fb = st.decode();
  fb.group_tables = {{"full_attention", narrow.view()}};
  EXPECT_TRUE(names(message([&] { be.init_forward_metadata(fb); }),
                    "MhaBackend.init_forward_metadata: batch.seq_lens: expected positions inside the page table"));
  Ints one_row(V{1, 2, 3, 4}, 1, 4);  // one row for two requests
  fb.group_tables = {{"full_attention", one_row.view()}};
  EXPECT_TRUE(names(message([&] { be.init_forward_metadata(fb); }),
                    "MhaBackend.init_forward_metadata: batch.group_tables['full_attention']: expected at least 2 rows"));
}

TEST(BackendErrorNames, ForwardNamesTheLayerAndTheSlots) {
  Step st;
  MhaBackend be(config());
  be.init_forward_metadata(st.decode());
  LayerSpec spec = st.layer.spec;
  spec.head_dim = 96;
  Ints slots({20, 24});
  EXPECT_TRUE(names(message([&] {
                      be.forward_decode(st.q.view(), st.k.view(), st.v.view(), spec, st.layer.kv(), slots.view(), 2,
                                        st.out.view());
                    }),
                    "MhaBackend.forward_decode: layer.head_dim: expected 64, 128 or 256, got 96"));
  std::vector<int64_t> wide = {20, 24};
  const TensorView slots64(wide.data(), DType::int64, Device::cpu(), {2});
  EXPECT_TRUE(names(message([&] {
                      be.forward_decode(st.q.view(), st.k.view(), st.v.view(), st.layer.spec, st.layer.kv(), slots64,
                                        2, st.out.view());
                    }),
                    "MhaBackend.forward_decode: out_cache_loc: expected dtype int32, got int64"));
  // The step's table points past this layer's cache (known only here): named by the batch field.
  Floats small_k(DType::bf16, {8 * P, Hkv, D}), small_v(DType::bf16, {8 * P, Hkv, D});
  EXPECT_TRUE(names(message([&] {
                      be.forward_decode(st.q.view(), {}, {}, st.layer.spec, {small_k.view(), small_v.view()}, {}, 2,
                                        st.out.view());
                    }),
                    "MhaBackend.forward_decode: batch.req_to_page (this step's page-table rows): expected page ids in "
                    "[0, 8)"));
  Ints outside({20, 1 << 20});  // past the pool's slots
  EXPECT_TRUE(names(message([&] {
                      be.forward_decode(st.q.view(), st.k.view(), st.v.view(), st.layer.spec, st.layer.kv(),
                                        outside.view(), 2, st.out.view());
                    }),
                    "MhaBackend.forward_decode: out_cache_loc: "));
}

// A decode step's metadata with q of 2 rows per request (bs 1) used to read "no
// metadata": the rows chose the extend slot, which this step does not have. Likewise
// forward_extend after a decode step's metadata.
TEST(BackendErrorNames, RowsOrCallNotMatchingTheStepsMetadataSaySo) {
  Step st;
  MhaBackend be(config());
  ForwardBatch fb = st.decode();
  fb.batch_size = 1;
  fb.seq_lens = fb.seq_lens.slice(0, 0, 1);
  fb.req_pool_indices = fb.req_pool_indices.slice(0, 0, 1);
  be.init_forward_metadata(fb);
  EXPECT_TRUE(names(message([&] {
                      be.forward_decode(st.q.view(), st.k.view(), st.v.view(), st.layer.spec, st.layer.kv(), {}, 1,
                                        st.out.view(), false);
                    }),
                    "MhaBackend.forward_decode: q: expected 1 rows (this step's query rows), got 2 rows for bs 1"));
  EXPECT_TRUE(names(message([&] {
                      be.forward_extend(st.q.view(), st.k.view(), st.v.view(), st.layer.spec, st.layer.kv(), {}, 1,
                                        st.out.view(), false);
                    }),
                    "MhaBackend.forward_extend: metadata: expected an extend step's"));
}

TEST(BackendErrorNames, GraphCallsNameThemselves) {
  Step st;
  BackendConfig c = config(/*N=*/2);
  c.draft_block_decode = true, c.is_draft = true;
  MhaBackend be(c);
  Ints seq_buf({4, 4, 4, 4});
  EXPECT_TRUE(names(message([&] { be.init_cuda_graph_state(9, seq_buf.view()); }),
                    "MhaBackend.init_cuda_graph_state: max_bs: expected 1..4 (config.max_bs), got 9"));
  be.init_cuda_graph_state(4, seq_buf.view());
  be.init_forward_metadata_capture_cuda_graph(2, ForwardMode::decode);
  std::vector<int64_t> ends = {8, 8};
  const TensorView ends64(ends.data(), DType::int64, Device::cpu(), {2});
  EXPECT_TRUE(names(message([&] { be.fill_block_decode_seq_lens(2, ends64); }),
                    "MhaBackend.fill_block_decode_seq_lens: block_ends: expected int32 [>= 2] on cpu, got int64 [2] on cpu"));
  Ints negative({-3, 8});
  EXPECT_TRUE(names(message([&] { be.fill_block_decode_seq_lens(2, negative.view()); }),
                    "MhaBackend.fill_block_decode_seq_lens: block_ends: expected non-negative lengths, got -3 at index 0"));
  ForwardBatch fb = st.decode();
  fb.seq_lens = negative.view();  // eager block draft: lengths are block ends
  EXPECT_TRUE(names(message([&] { be.init_forward_metadata(fb); }),
                    "MhaBackend.init_forward_metadata: batch.seq_lens: expected non-negative lengths, got -3 at index 0"));
  fb = st.decode();
  fb.batch_size = 3;
  fb.seq_lens = seq_buf.view();
  EXPECT_TRUE(names(message([&] { be.init_forward_metadata_replay_cuda_graph(fb); }),
                    "MhaBackend.init_forward_metadata_replay_cuda_graph: batch.batch_size: expected a captured batch "
                    "size, got 3"));
}

}  // namespace
}  // namespace btest
