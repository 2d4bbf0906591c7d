// Metadata and routing rules of MhaBackend with hand-computed expected values
// (docs/semantics.md sections 3-6), on the CPU.
#include <gtest/gtest.h>

#include <limits>

#include "backend_fixture.h"
#include "common/error_text.h"

namespace btest {
namespace {

using V = std::vector<int32_t>;

BackendConfig config(int P, int C, int max_bs, int N = 1) { return make_config(P, C, max_bs, N); }

// req_to_page [rows, cols]: row i holds pages 10 * i + c + 1 (row 0: padding, zeros).
Ints req_to_page(int rows, int cols) {
  V v(static_cast<size_t>(rows) * cols, 0);
  for (int i = 1; i < rows; ++i)
    for (int c = 0; c < cols; ++c) v[static_cast<size_t>(i) * cols + c] = 10 * i + c + 1;
  return Ints(v, rows, cols);
}

TEST(BackendMetadata, DecodeAliasesSeqLensAndGathersPaddedTable) {
  MhaBackend be(config(64, 256, 4));
  Ints r2p = req_to_page(4, 4), rpi({2, 1}), seq({65, 1});
  ForwardBatch fb = decode_batch(seq.view(), rpi.view(), r2p.view());
  be.init_forward_metadata(fb);
  const AttentionMetadata* md = be.decode_metadata();
  ASSERT_NE(md, nullptr);
  EXPECT_EQ(be.prefill_metadata(), nullptr);
  EXPECT_EQ(md->cache_seqlens.data, seq.v.data());  // aliased, not copied
  EXPECT_EQ(md->max_seq_len_q, 1);
  EXPECT_EQ(values(md->cu_seqlens_q), (V{0, 1, 2}));
  // seq 65 at page 64 uses columns 0 and 1; the rest is the dummy page.
  EXPECT_EQ(values(md->page_table), (V{21, 22, 0, 0, 11, 0, 0, 0}));
}

TEST(BackendMetadata, DecodeGroupWriteSlots) {
  MhaBackend be(config(64, 256, 4));
  Ints seq({65, 64}), rpi({1, 2});
  Ints full({7, 9, -1, -1, 3, -1, -1, -1}, 2, 4);
  ForwardBatch fb;
  fb.forward_mode = ForwardMode::decode;
  fb.batch_size = 2;
  fb.seq_lens = seq.view();
  fb.req_pool_indices = rpi.view();
  fb.group_tables = {{"full_attention", full.view()}};
  be.init_forward_metadata(fb);
  const AttentionMetadata* md = be.decode_metadata();
  ASSERT_EQ(md->groups.size(), 1u);
  // seq_len 65 writes position 64: page column 1 offset 0 -> 9 * 64; seq 64 -> 3 * 64 + 63.
  EXPECT_EQ(values(md->groups[0].out_cache_loc), (V{9 * 64, 3 * 64 + 63}));
  LayerSpec any;
  // A lone group serves layers naming no group (another name is an error: regression_test).
  EXPECT_EQ(values(be.select_out_cache_loc(any, ForwardMode::decode, {})), (V{576, 255}));
}

TEST(BackendMetadata, VerifyClampsIntoOwnBufferAndWritesRequestMajor) {
  MhaBackend be(config(4, 64, 4, /*N=*/4));
  Ints seq({10, 1, 64}), rpi({1, 0, 2});
  // Row 1 is a padded row (page 0); seq 64 needs all 16 columns at P = 4.
  V wide(3 * 16, -1);
  for (int c = 0; c < 16; ++c) wide[c] = c < 3 ? 5 + c : -1, wide[16 + c] = 0, wide[32 + c] = 40 + c;
  Ints table(wide, 3, 16);
  ForwardBatch fb;
  fb.forward_mode = ForwardMode::target_verify;
  fb.batch_size = 3;
  fb.seq_lens = seq.view();
  fb.req_pool_indices = rpi.view();
  fb.group_tables = {{"full_attention", table.view()}};
  be.init_forward_metadata(fb);
  const AttentionMetadata* md = be.prefill_metadata();
  ASSERT_NE(md, nullptr);
  EXPECT_EQ(be.decode_metadata(), nullptr);  // target verify uses the prefill slot only
  EXPECT_EQ(values(md->cache_seqlens), (V{10, 4, 64}));
  EXPECT_NE(md->cache_seqlens.data, seq.v.data());
  EXPECT_EQ(seq.v, (V{10, 1, 64}));  // the caller's tensor untouched
  EXPECT_EQ(values(md->cu_seqlens_q), (V{0, 4, 8, 12}));
  EXPECT_EQ(md->max_seq_len_q, 4);
  EXPECT_FALSE(md->ragged);
  // Row 0: positions 6..9 -> pages 6, 6, 7, 7. Row 1 (padded): positions 0, 0, 0, 0 of
  // page 0. Row 2: positions 60..63 -> page 55.
  EXPECT_EQ(values(md->groups[0].out_cache_loc),
            (V{26, 27, 28, 29, 0, 0, 0, 0, 220, 221, 222, 223}));
}

TEST(BackendMetadata, VerifySingleTableReadsOnlyInsideTable) {
  MhaBackend be(config(4, 16, 2, /*N=*/4));
  Ints r2p = req_to_page(3, 4), rpi({1, 0}), seq({16, 1});
  ForwardBatch fb = decode_batch(seq.view(), rpi.view(), r2p.view());
  be.init_forward_metadata(fb);
  const AttentionMetadata* md = be.prefill_metadata();
  EXPECT_EQ(values(md->cache_seqlens), (V{16, 4}));  // <= C = 16, >= N = 4
  EXPECT_EQ(values(md->page_table), (V{11, 12, 13, 14, 0, 0, 0, 0}));
}

TEST(BackendMetadata, ExtendWithPrefixSlots) {
  MhaBackend be(config(2, 8, 4));
  // prefix [2, 0], new [3, 2] at page 2: request 0 writes positions 2, 3, 4 -> pages
  // 8, 8, 9 -> slots 16, 17, 18; request 1 positions 0, 1 on page 4 -> 8, 9.
  Ints seq({5, 2}), rpi({1, 2}), ext({3, 2}), pre({2, 0});
  Ints table({7, 8, 9, -1, 4, -1, -1, -1}, 2, 4);
  ForwardBatch fb;
  fb.forward_mode = ForwardMode::extend;
  fb.batch_size = 2;
  fb.seq_lens = seq.view();
  fb.req_pool_indices = rpi.view();
  fb.extend_seq_lens_cpu = ext.view();
  fb.extend_prefix_lens_cpu = pre.view();
  fb.group_tables = {{"full_attention", table.view()}};
  be.init_forward_metadata(fb);
  const AttentionMetadata* md = be.prefill_metadata();
  ASSERT_NE(md, nullptr);
  EXPECT_TRUE(md->ragged);
  EXPECT_EQ(md->max_seq_len_q, 3);
  EXPECT_EQ(md->num_tokens, 5);
  EXPECT_EQ(md->cache_seqlens.data, seq.v.data());
  EXPECT_EQ(values(md->cu_seqlens_q), (V{0, 3, 5}));
  EXPECT_EQ(values(md->cu_seqlens_k), (V{0, 5, 7}));
  EXPECT_EQ(values(md->groups[0].out_cache_loc), (V{16, 17, 18, 8, 9}));
  EXPECT_EQ(be.decode_metadata(), nullptr);  // target: no decode slot on extend
}

TEST(BackendMetadata, MixedRowsKeepTheirOwnQueryLengths) {
  MhaBackend be(config(4, 32, 4));
  Ints r2p = req_to_page(3, 8), seq({3, 7}), rpi({1, 2}), ext({3, 1}), seq_cpu({3, 7});
  ForwardBatch fb;
  fb.forward_mode = ForwardMode::mixed;
  fb.batch_size = 2;
  fb.seq_lens = seq.view();
  fb.seq_lens_cpu = seq_cpu.view();  // prefixes derived: 0 and 6
  fb.req_pool_indices = rpi.view();
  fb.req_to_page = r2p.view();
  fb.extend_seq_lens_cpu = ext.view();
  be.init_forward_metadata(fb);
  const AttentionMetadata* md = be.prefill_metadata();
  EXPECT_EQ(values(md->cu_seqlens_q), (V{0, 3, 4}));  // upstream used cu_seqlens_k here
  EXPECT_EQ(values(md->cu_seqlens_k), (V{0, 3, 10}));
  EXPECT_EQ(md->max_seq_len_q, 3);
}

TEST(BackendMetadata, DraftExtendAlsoSeedsDecodeSlot) {
  BackendConfig c = config(4, 32, 4, 3);
  c.is_draft = true;
  MhaBackend be(c);
  Ints r2p = req_to_page(3, 8), seq({5}), rpi({1}), ext({5});
  ForwardBatch fb;
  fb.forward_mode = ForwardMode::draft_extend;
  fb.batch_size = 1;
  fb.seq_lens = seq.view();
  fb.req_pool_indices = rpi.view();
  fb.req_to_page = r2p.view();
  fb.extend_seq_lens_cpu = ext.view();
  be.init_forward_metadata(fb);
  ASSERT_NE(be.prefill_metadata(), nullptr);
  ASSERT_NE(be.decode_metadata(), nullptr);
  EXPECT_EQ(be.decode_metadata()->cache_seqlens.data, seq.v.data());  // drafter's buffer by reference
}

TEST(BackendMetadata, BlockDraftExpandsRowsAndClamps) {
  BackendConfig c = config(4, 16, 3, /*N=*/4);
  c.is_draft = true;
  c.draft_block_decode = true;
  MhaBackend be(c);
  Ints r2p = req_to_page(4, 4), seq({6, 2, 40}), rpi({1, 3, 2});
  ForwardBatch fb = decode_batch(seq.view(), rpi.view(), r2p.view());
  be.init_forward_metadata(fb);
  const AttentionMetadata* md = be.decode_metadata();
  ASSERT_NE(md, nullptr);
  EXPECT_EQ(md->batch, 12);
  EXPECT_EQ(values(md->cache_seqlens), (V{6, 6, 6, 6, 4, 4, 4, 4, 16, 16, 16, 16}));  // clamp(., 4, 16)
  const V pt = values(md->page_table);
  for (int r = 0; r < 3; ++r)
    for (int j = 0; j < 4; ++j)
      for (int col = 0; col < 4; ++col)
        EXPECT_EQ(pt[(r * 4 + j) * 4 + col], 10 * rpi.v[r] + col + 1) << r << " " << j << " " << col;
  Ints ends({9, 3, 17});
  be.fill_block_decode_seq_lens(3, ends.view());
  EXPECT_EQ(values(md->cache_seqlens), (V{9, 9, 9, 9, 4, 4, 4, 4, 16, 16, 16, 16}));
}

TEST(BackendMetadata, GroupsRouteByLayerAndShedStateGroups) {
  BackendConfig c = config(4, 32, 2);
  c.state_cache_groups = {"mamba"};
  MhaBackend be(c);
  Ints seq({5}), rpi({1});
  Ints full({3, 4, -1, -1}, 1, 4), sliding({0, 8, -1, -1}, 1, 4), state({99, 99, 99, 99}, 1, 4);
  ForwardBatch fb;
  fb.forward_mode = ForwardMode::decode;
  fb.batch_size = 1;
  fb.seq_lens = seq.view();
  fb.req_pool_indices = rpi.view();
  fb.group_tables = {{"full_attention", full.view()}, {"sliding_attention", sliding.view()}, {"mamba", state.view()}};
  be.init_forward_metadata(fb);
  const AttentionMetadata* md = be.decode_metadata();
  ASSERT_EQ(md->groups.size(), 2u);  // the state group is shed
  LayerSpec a, b, unknown;
  a.group_id = "full_attention";
  b.group_id = "sliding_attention";
  unknown.group_id = "cross_attention";
  EXPECT_EQ(values(be.select_out_cache_loc(a, ForwardMode::decode, {})), (V{4 * 4 + 0}));
  EXPECT_EQ(values(be.select_out_cache_loc(b, ForwardMode::decode, {})), (V{8 * 4 + 0}));
  try {
    be.select_out_cache_loc(unknown, ForwardMode::decode, {});
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cross_attention"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sliding_attention"), std::string::npos) << e.what();
  }
}

TEST(BackendMetadata, RejectsBadInput) {
  MhaBackend be(config(4, 32, 2));
  std::vector<int64_t> seq64{5};
  Ints rpi({1}), r2p = req_to_page(2, 8);
  ForwardBatch fb;
  fb.batch_size = 1;
  fb.seq_lens = TensorView(seq64.data(), DType::int64, Device::cpu(), {1});
  fb.req_pool_indices = rpi.view();
  fb.req_to_page = r2p.view();
  EXPECT_THROW(be.init_forward_metadata(fb), Error);  // int64 seq_lens
  Ints seq({5, 5, 5});
  fb.seq_lens = seq.view();
  fb.batch_size = 3;
  EXPECT_THROW(be.init_forward_metadata(fb), Error);  // bs > max_bs
  fb.batch_size = 1;
  fb.forward_mode = ForwardMode::extend;
  EXPECT_THROW(be.init_forward_metadata(fb), Error);  // extend without host lengths
  BackendConfig bad = config(4, 32, 2, 9);
  EXPECT_THROW(MhaBackend{bad}, Error);
}

// An extend length of INT_MIN, or a host length shorter than the extend: errors naming
// the field, before the prefix seq_lens_cpu - extend is formed (it overflowed int32).
TEST(BackendMetadata, ExtendLengthsCheckedBeforeThePrefix) {
  MhaBackend be(config(4, 32, 2));
  Ints r2p = req_to_page(3, 8), seq({3, 7}), rpi({1, 2}), seq_cpu({3, 7});
  ForwardBatch fb;
  fb.forward_mode = ForwardMode::extend;
  fb.batch_size = 2;
  fb.seq_lens = seq.view();
  fb.seq_lens_cpu = seq_cpu.view();
  fb.req_pool_indices = rpi.view();
  fb.req_to_page = r2p.view();
  Ints ext({3, std::numeric_limits<int32_t>::min()});
  fb.extend_seq_lens_cpu = ext.view();
  std::string msg = testutil::error_of([&] { be.init_forward_metadata(fb); });
  EXPECT_NE(msg.find("batch.extend_seq_lens_cpu: expected non-negative lengths, got -2147483648 at 1"),
            std::string::npos) << msg;
  // A negative prefix given directly is named as such, before prefix + extend is compared.
  Ints ok_ext({3, 2}), neg_prefix({-5, 5});
  fb.extend_seq_lens_cpu = ok_ext.view();
  fb.extend_prefix_lens_cpu = neg_prefix.view();
  msg = testutil::error_of([&] { be.init_forward_metadata(fb); });
  EXPECT_NE(msg.find("batch.extend_prefix_lens_cpu: expected non-negative prefix lengths, got -5 at 0"),
            std::string::npos) << msg;
  fb.extend_prefix_lens_cpu = {};
  Ints longer({3, 8});
  fb.extend_seq_lens_cpu = longer.view();
  msg = testutil::error_of([&] { be.init_forward_metadata(fb); });
  EXPECT_NE(msg.find("batch.seq_lens_cpu: expected lengths >= extend_seq_lens_cpu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("got 7 at 1"), std::string::npos) << msg;
}

// seq_lens_cpu, where seq_lens is host-readable too (the CPU device), must be its copy:
// a stale one would derive wrong extend prefixes. Rejected before any buffer is written.
TEST(BackendMetadata, SeqLensCpuMustMatchSeqLens) {
  auto message = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  MhaBackend be(config(4, 32, 4));
  Ints r2p = req_to_page(3, 8), seq({5, 6}), rpi({1, 2}), stale({5, 7}), same({5, 6});
  ForwardBatch fb = decode_batch(seq.view(), rpi.view(), r2p.view());
  fb.seq_lens_cpu = stale.view();
  EXPECT_EQ(message([&] { be.init_forward_metadata(fb); }),
            "MhaBackend.init_forward_metadata: batch.seq_lens_cpu: expected a host copy of batch.seq_lens "
            "(6 at 1), got 7 at 1");
  EXPECT_EQ(be.decode_metadata(), nullptr);
  fb.seq_lens_cpu = same.view();
  be.init_forward_metadata(fb);
  ASSERT_NE(be.decode_metadata(), nullptr);

  // Extend with prefixes derived from seq_lens_cpu: named as the stale copy, not as a
  // prefix + extend mismatch of seq_lens.
  Ints ext({3, 2});
  fb.forward_mode = ForwardMode::extend;
  fb.extend_seq_lens_cpu = ext.view();
  fb.seq_lens_cpu = stale.view();
  EXPECT_EQ(message([&] { be.init_forward_metadata(fb); }),
            "MhaBackend.init_forward_metadata: batch.seq_lens_cpu: expected a host copy of batch.seq_lens "
            "(6 at 1), got 7 at 1");
  fb.seq_lens_cpu = same.view();
  be.init_forward_metadata(fb);
  EXPECT_EQ(values(be.prefill_metadata()->cu_seqlens_k), (V{0, 5, 11}));

  // Graph replay: the captured page table keeps its previous contents.
  MhaBackend g(config(4, 16, 4));
  Ints seq_buf({5, 1, 1, 1}), r2p4 = req_to_page(4, 4), rpi2({3, 0});
  g.init_cuda_graph_state(4, seq_buf.view());
  g.init_forward_metadata_capture_cuda_graph(2, ForwardMode::decode);
  ForwardBatch rb = decode_batch(seq_buf.view().slice(0, 0, 2), rpi2.view(), r2p4.view());
  rb.seq_lens = seq_buf.view();
  g.init_forward_metadata_replay_cuda_graph(rb);
  const AttentionMetadata* md = g.decode_metadata();
  EXPECT_EQ(values(md->page_table), (V{31, 32, 0, 0, 0, 0, 0, 0}));
  Ints rpi3({2, 0}), stale_buf({9, 1});
  rb.req_pool_indices = rpi3.view();
  seq_buf.v = {9, 1, 1, 1};
  rb.seq_lens_cpu = stale.view();  // {5, 7}
  EXPECT_EQ(message([&] { g.init_forward_metadata_replay_cuda_graph(rb); }),
            "MhaBackend.init_forward_metadata_replay_cuda_graph: batch.seq_lens_cpu: expected a host copy of "
            "batch.seq_lens (9 at 0), got 5 at 0");
  EXPECT_EQ(values(md->page_table), (V{31, 32, 0, 0, 0, 0, 0, 0}));  // not regathered
  rb.seq_lens_cpu = stale_buf.view();
  g.init_forward_metadata_replay_cuda_graph(rb);
  EXPECT_EQ(values(md->page_table), (V{21, 22, 23, 0, 0, 0, 0, 0}));
}

// The decode workspace is sized from the config's geometry or register_layers; both
// validate it (on the CPU the size itself is 0).
TEST(BackendMetadata, WorkspaceGeometryIsValidated) {
  auto expect_error = [](auto&& call, const std::string& what) {
    try {
      call();
      ADD_FAILURE() << "expected Error containing '" << what << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  BackendConfig c = config(4, 32, 4, 2);
  c.num_q_heads = 30, c.num_kv_heads = 8, c.head_dim = 128;
  expect_error([&] { MhaBackend{c}; }, "num_q_heads: expected a positive multiple of num_kv_heads 8, got 30");
  c.num_q_heads = 32;
  MhaBackend be(c);
  LayerSpec ok, bad;
  ok.num_q_heads = 64, ok.num_kv_heads = 8, ok.head_dim = 256;
  bad.num_q_heads = 8, bad.num_kv_heads = 8, bad.head_dim = 96;
  be.register_layers({ok});
  expect_error([&] { be.register_layers({ok, bad}); }, "head_dim");
}

TEST(BackendMetadata, IdleClearsSlots) {
  MhaBackend be(config(4, 32, 2));
  ForwardBatch fb;
  fb.forward_mode = ForwardMode::idle;
  be.init_forward_metadata(fb);
  EXPECT_EQ(be.decode_metadata(), nullptr);
  EXPECT_EQ(be.prefill_metadata(), nullptr);
}

TEST(BackendRegistry, NamesAndAlias) {
  BackendConfig c = config(16, 64, 2);
  EXPECT_NE(create_backend("pagedmha", c), nullptr);
  EXPECT_NE(create_backend("trtllm", c), nullptr);
  try {
    create_backend("flashinfer", c);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("pagedmha"), std::string::npos) << m;
    EXPECT_NE(m.find("trtllm"), std::string::npos) << m;
    EXPECT_NE(m.find("flashinfer"), std::string::npos) << m;
  }
  register_backend("mine", [](const BackendConfig& cfg) { return std::make_unique<MhaBackend>(cfg); });
  const auto names = registered_backends();
  EXPECT_NE(std::find(names.begin(), names.end(), "mine"), names.end());
}

// The graph path is device-agnostic: on the CPU its buffers and refresh are checked exactly.
TEST(BackendGraph, ReplayRefreshesPersistentBuffersAndGuardsStaleTables) {
  BackendConfig c = config(4, 32, 4, /*N=*/2);
  MhaBackend be(c);
  Ints seq_buf({1, 1, 1, 1});
  be.init_cuda_graph_state(4, seq_buf.view(), {"full_attention", "mamba_state"});
  be.init_forward_metadata_capture_cuda_graph(2, ForwardMode::target_verify, {"full_attention"});
  const AttentionMetadata* md = be.prefill_metadata();
  ASSERT_NE(md, nullptr);
  const void* table_ptr = md->groups[0].page_table.data;

  // Replay 1: one real request (seq 6) and a padded row; the table has only the real row.
  seq_buf.v = {6, 1, 1, 1};
  Ints t1({3, 5, -1, -1}, 1, 4);
  ForwardBatch fb;
  fb.forward_mode = ForwardMode::target_verify;
  fb.batch_size = 2;
  fb.seq_lens = seq_buf.view();
  fb.group_tables = {{"full_attention", t1.view()}};
  be.init_forward_metadata_replay_cuda_graph(fb);
  md = be.prefill_metadata();
  EXPECT_EQ(md->groups[0].page_table.data, table_ptr);  // same persistent buffer
  EXPECT_EQ(values(md->cache_seqlens), (V{6, 2}));
  V table = values(md->groups[0].page_table);
  EXPECT_EQ(V(table.begin(), table.begin() + 8), (V{3, 5, 0, 0, 0, 0, 0, 0}));  // -1 tail -> 0
  EXPECT_EQ(V(table.begin() + 8, table.begin() + 16), V(8, 0));                // padded row
  EXPECT_EQ(values(md->groups[0].out_cache_loc), (V{5 * 4 + 0, 5 * 4 + 1, 0, 0}));

  // Replay 2: two real rows with new pages.
  seq_buf.v = {3, 9, 1, 1};
  Ints t2({7, -1, -1, -1, 2, 4, 6, -1}, 2, 4);
  fb.group_tables = {{"full_attention", t2.view()}};
  be.init_forward_metadata_replay_cuda_graph(fb);
  EXPECT_EQ(values(md->cache_seqlens), (V{3, 9}));
  EXPECT_EQ(values(md->groups[0].out_cache_loc), (V{7 * 4 + 1, 7 * 4 + 2, 4 * 4 + 3, 6 * 4 + 0}));

  // Stale-table guard: the captured group's table missing.
  fb.group_tables = {{"mamba_state", t2.view()}};
  EXPECT_THROW(be.init_forward_metadata_replay_cuda_graph(fb), Error);
  fb.group_tables = {};
  EXPECT_THROW(be.init_forward_metadata_replay_cuda_graph(fb), Error);
  fb.batch_size = 3;  // never captured
  fb.group_tables = {{"full_attention", t2.view()}};
  EXPECT_THROW(be.init_forward_metadata_replay_cuda_graph(fb), Error);
}

// A second init_cuda_graph_state retires the first state's group slot buffers rather than
// freeing them: a view select_out_cache_loc handed out stays readable (ASan checks the read).
TEST(BackendGraph, NewGraphStateKeepsHandedOutSlotViewsAlive) {
  MhaBackend be(config(4, 32, 4, /*N=*/2));
  Ints seq_buf({6, 1, 1, 1});
  be.init_cuda_graph_state(4, seq_buf.view(), {"full_attention"});
  be.init_forward_metadata_capture_cuda_graph(1, ForwardMode::target_verify, {"full_attention"});
  Ints t({3, 5, -1, -1}, 1, 4);
  ForwardBatch fb;
  fb.forward_mode = ForwardMode::target_verify;
  fb.batch_size = 1;
  fb.seq_lens = seq_buf.view();
  fb.group_tables = {{"full_attention", t.view()}};
  be.init_forward_metadata_replay_cuda_graph(fb);
  LayerSpec layer;
  layer.group_id = "full_attention";
  const TensorView slots = be.select_out_cache_loc(layer, ForwardMode::target_verify, {});
  ASSERT_EQ(values(slots), (V{5 * 4 + 0, 5 * 4 + 1}));
  be.init_cuda_graph_state(2, seq_buf.view(), {"full_attention"});
  EXPECT_EQ(values(slots), (V{5 * 4 + 0, 5 * 4 + 1}));
  EXPECT_EQ(be.prefill_metadata(), nullptr);  // the new state has no step yet
}

TEST(BackendGraph, DecodeAliasesSeqLensBufAndGathersReqToPage) {
  MhaBackend be(config(4, 16, 4));
  Ints seq_buf({1, 1, 1, 1}), r2p = req_to_page(4, 4);
  be.init_cuda_graph_state(4, seq_buf.view());
  be.init_forward_metadata_capture_cuda_graph(2, ForwardMode::decode);
  const AttentionMetadata* md = be.decode_metadata();
  EXPECT_EQ(md->cache_seqlens.data, seq_buf.v.data());
  seq_buf.v = {5, 1, 1, 1};
  Ints rpi({3, 0});
  ForwardBatch fb;
  fb.batch_size = 2;
  fb.seq_lens = seq_buf.view();
  fb.req_pool_indices = rpi.view();
  fb.req_to_page = r2p.view();
  be.init_forward_metadata_replay_cuda_graph(fb);
  EXPECT_EQ(be.decode_metadata(), md);
  EXPECT_EQ(values(md->page_table), (V{31, 32, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(seq_buf.v, (V{5, 1, 1, 1}));  // never written by the backend
  Ints other({5, 1});
  fb.seq_lens = other.view();
  EXPECT_THROW(be.init_forward_metadata_replay_cuda_graph(fb), Error);  // not the aliased buffer
}

}  // namespace
}  // namespace btest
