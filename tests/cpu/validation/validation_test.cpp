// Argument validation of every op (one test per error kind: each asserts that the
// message names the op, the argument and the value given). Hand-computed results are in
// hand_computed_test.cpp; the full oracle grid lives in tests/cpu/ops/.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/error_text.h"
#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#include "pagedmha/numeric.h"
#include "pagedmha/ops.h"
#include "op_fixtures.h"

namespace {

using namespace pagedmha;
using namespace opfix;

const Device kCpu = Device::cpu();
constexpr float kInf = std::numeric_limits<float>::infinity();

using testutil::error_of;

// Asserts that `call` throws Error and that its message contains every fragment.
#define EXPECT_ERROR(call, ...)                                                     \
  do {                                                                              \
    const std::string msg_ = error_of([&] { call; });                               \
    for (const std::string frag_ : {__VA_ARGS__}) {                                 \
      EXPECT_NE(msg_.find(frag_), std::string::npos) << "missing \"" << frag_       \
                                                     << "\" in: " << msg_;          \
    }                                                                               \
  } while (0)

// A valid decode call: batch 2, one query each, Hq 4, Hkv 2, D 64, page size 4,
// 8 pages, page table of 3 columns, seq_lens {5, 9}. Tests break one thing each.
struct Decode {
  int B = 2, n = 1, Hq = 4, Hkv = 2, D = 64, P = 4, pages = 8, cols = 3;
  std::vector<uint16_t> q, kc, vc, o;
  std::vector<int32_t> table{1, 2, 0, 3, 4, 5}, lens{5, 9};
  std::vector<float> lse;
  AttentionParams params;
  Decode() {
    q = bf16_fill(static_cast<std::size_t>(B * n * Hq * D), 0.5f);
    kc = bf16_fill(static_cast<std::size_t>(pages * P * Hkv * D), 0.25f);
    vc = kc;
    o.assign(q.size(), 0);
    lse.assign(static_cast<std::size_t>(B * n * Hq), 0.0f);
    params.bmm1_scale = 0.125f;
  }
  TensorView Q() { return view(q, DType::bf16, {B * n, Hq, D}); }
  TensorView K() { return view(kc, DType::bf16, {pages * P, Hkv, D}); }
  TensorView V() { return view(vc, DType::bf16, {pages * P, Hkv, D}); }
  TensorView O() { return view(o, DType::bf16, {B * n, Hq, D}); }
  TensorView T() { return view(table, DType::int32, {B, cols}); }
  TensorView S() { return view(lens, DType::int32, {B}); }
  TensorView LSE() { return view(lse, DType::fp32, {B * n, Hq}); }
  void run() { batch_decode(Q(), K(), V(), T(), S(), P, n, O(), params, LSE()); }
};

TEST(Validation, ValidDecodeRuns) {
  Decode d;
  d.run();
  // Every visible key is equal, so the output is V's value.
  for (uint16_t x : d.o) ASSERT_EQ(bf16_to_float(x), 0.25f);
}

TEST(Validation, ShapeOutDiffersFromQ) {
  Decode d;
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), d.V(), d.T(), d.S(), d.P, 1,
                            view(d.o, DType::bf16, {2, 2, 64}), d.params),
               "batch_decode: out: expected shape [2, 4, 64]", "got [2, 2, 64]");
}

TEST(Validation, ShapeKvCachesDiffer) {
  Decode d;
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), view(d.vc, DType::bf16, {16, 2, 64}), d.T(), d.S(), d.P, 1, d.O(),
                            d.params),
               "v_cache: expected shape [32, 2, 64]", "got [16, 2, 64]");
}

TEST(Validation, ShapeLse) {
  Decode d;
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), d.V(), d.T(), d.S(), d.P, 1, d.O(), d.params,
                            view(d.lse, DType::fp32, {4, 2})),
               "batch_decode: lse: expected shape [2, 4]", "got [4, 2]");
}

TEST(Validation, DtypeCacheNotQueryDtypeNorFp8) {
  Decode d;
  EXPECT_ERROR(batch_decode(view(d.q, DType::fp16, {2, 4, 64}), d.K(), d.V(), d.T(), d.S(), d.P, 1,
                            view(d.o, DType::fp16, {2, 4, 64}), d.params),
               "batch_decode: k_cache: expected dtype fp16 or fp8_e4m3", "got bf16");
}

TEST(Validation, DtypeOutDiffersFromQuery) {
  Decode d;
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), d.V(), d.T(), d.S(), d.P, 1, view(d.o, DType::fp16, {2, 4, 64}),
                            d.params),
               "out: expected dtype bf16", "got fp16");
}

TEST(Validation, DtypeLseNotFp32) {
  Decode d;
  std::vector<uint16_t> lse16(8);
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), d.V(), d.T(), d.S(), d.P, 1, d.O(), d.params,
                            view(lse16, DType::bf16, {2, 4})),
               "lse: expected dtype fp32", "got bf16");
}

TEST(Validation, DtypeSinksNotFp32) {
  Decode d;
  std::vector<uint16_t> sinks(4);
  d.params.sinks = view(sinks, DType::bf16, {4});
  EXPECT_ERROR(d.run(), "sinks: expected dtype fp32", "got bf16");
}

TEST(Validation, DtypeFp8QueryNeedsFp8Cache) {
  Decode d;
  std::vector<uint8_t> q8(2 * 4 * 64);
  EXPECT_ERROR(batch_decode(view(q8, DType::fp8_e4m3, {2, 4, 64}), d.K(), d.V(), d.T(), d.S(), d.P, 1, d.O(),
                            d.params),
               "k_cache: expected dtype fp8_e4m3", "got bf16");
}

TEST(Validation, DtypeSeqLensNotInt32) {
  Decode d;
  std::vector<int64_t> lens64{5, 9};
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), d.V(), d.T(), view(lens64, DType::int64, {2}), d.P, 1, d.O(), d.params),
               "batch_decode: seq_lens: expected dtype int32", "got int64");
}

TEST(Validation, DtypePageTableNotInt32) {
  Decode d;
  std::vector<uint16_t> t16(6);
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), d.V(), view(t16, DType::fp16, {2, 3}), d.S(), d.P, 1, d.O(), d.params),
               "page_table: expected dtype int32", "got fp16");
}

TEST(Validation, DeviceMismatch) {
  Decode d;
  TensorView k = d.K();
  k.device = Device::cuda(0);
  EXPECT_ERROR(batch_decode(d.Q(), k, d.V(), d.T(), d.S(), d.P, 1, d.O(), d.params),
               "batch_decode: k_cache: expected device cpu", "got cuda:0");
}

TEST(Validation, DeviceCudaWithoutCudaBuild) {
  if (built_with_cuda()) GTEST_SKIP() << "this build has CUDA support";
  std::vector<int32_t> lens{1}, cu(2);
  TensorView l(lens.data(), DType::int32, Device::cuda(1), {1});
  TensorView c(cu.data(), DType::int32, Device::cuda(1), {2});
  EXPECT_ERROR(cumsum_lengths(l, c), "cumsum_lengths: device: expected cpu (this build has no CUDA support)",
               "got cuda:1");
}

TEST(Validation, UnsupportedHeadDim) {
  Decode d;
  EXPECT_ERROR(batch_decode(view(d.q, DType::bf16, {2, 2, 96}), view(d.kc, DType::bf16, {32, 2, 96}),
                            view(d.vc, DType::bf16, {32, 2, 96}), d.T(), d.S(), d.P, 1,
                            view(d.o, DType::bf16, {2, 2, 96}), d.params),
               "k_cache: expected head dim 64, 128 or 256", "got 96");
}

TEST(Validation, QueryHeadDimDiffersFromCache) {
  Decode d;
  EXPECT_ERROR(batch_decode(view(d.q, DType::bf16, {2, 2, 128}), d.K(), d.V(), d.T(), d.S(), d.P, 1,
                            view(d.o, DType::bf16, {2, 2, 128}), d.params),
               "q: expected head dim 64 (the cache's)", "got [2, 2, 128]");
}

TEST(Validation, QueryHeadsNotMultipleOfKvHeads) {
  Decode d;
  EXPECT_ERROR(batch_decode(view(d.q, DType::bf16, {2, 3, 64}), d.K(), d.V(), d.T(), d.S(), d.P, 1,
                            view(d.o, DType::bf16, {2, 3, 64}), d.params),
               "q: expected num_q_heads a multiple of num_kv_heads 2", "got 3 heads");
}

TEST(Validation, LastDimNotContiguous) {
  Decode d;
  TensorView q(d.q.data(), DType::bf16, kCpu, {2, 4, 64}, {512, 128, 2});
  EXPECT_ERROR(batch_decode(q, d.K(), d.V(), d.T(), d.S(), d.P, 1, d.O(), d.params),
               "q: expected a contiguous last dim", "strides [512, 128, 2]");
}

TEST(Validation, PageTableNarrowerThanSeqLen) {
  Decode d;
  d.lens = {5, 13};  // needs ceil(13 / 4) = 4 columns, the table has 3
  EXPECT_ERROR(d.run(), "batch_decode: page_table: expected at least ceil(seq_lens[1] / page_size) = 4 columns",
               "got 3 columns");
}

TEST(Validation, PageIdOutsidePool) {
  Decode d;
  d.table[4] = 8;  // row 1 column 1; the pool has 8 pages
  EXPECT_ERROR(d.run(), "page_table: expected page ids in [0, 8)", "got 8 at [1, 1]");
}

TEST(Validation, WindowSkipsReleasedPages) {
  // Row 1 (L = 9) with window_left 2 reads keys 6..8 only: pages at columns 1 and 2.
  // Row 0 (L = 5) reads keys 2..4: columns 0 and 1.
  Decode d;
  d.table = {1, 2, -1, -1, 4, 5};
  d.params.window_left = 2;
  d.run();  // released entries (-1) before the window are never read
  for (uint16_t x : d.o) ASSERT_EQ(bf16_to_float(x), 0.25f);
  d.params.window_left = -1;
  EXPECT_ERROR(d.run(), "page_table: expected page ids in [0, 8)", "got -1 at [1, 0]");
}

TEST(Validation, NegativeSeqLen) {
  Decode d;
  d.lens = {5, -1};
  EXPECT_ERROR(d.run(), "batch_decode: seq_lens: expected non-negative lengths", "got -1 at index 1");
}

TEST(Validation, SeqLensLengthDiffersFromPageTableRows) {
  Decode d;
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), d.V(), view(d.table, DType::int32, {3, 2}), d.S(), d.P, 1, d.O(),
                            d.params),
               "page_table: expected shape [2, *]", "got [3, 2]");
}

TEST(Validation, QLenPerReqNotDividingRows) {
  Decode d;
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), d.V(), d.T(), d.S(), d.P, 2, d.O(), d.params),
               "q: expected 2 requests (seq_lens) x q_len_per_req 2 = 4 rows", "got [2, 4, 64]");
}

TEST(Validation, QLenPerReqBelowOne) {
  Decode d;
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), d.V(), d.T(), d.S(), d.P, 0, d.O(), d.params),
               "q_len_per_req: expected >= 1", "got 0");
}

TEST(Validation, PageSizeBelowOne) {
  Decode d;
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), d.V(), d.T(), d.S(), 0, 1, d.O(), d.params),
               "page_size: expected >= 1", "got 0");
}

TEST(Validation, PageSizeMismatchWith4dCache) {
  Decode d;
  auto k4 = view(d.kc, DType::bf16, {8, 4, 2, 64});
  auto v4 = view(d.vc, DType::bf16, {8, 4, 2, 64});
  EXPECT_ERROR(batch_decode(d.Q(), k4, v4, d.T(), d.S(), 16, 1, d.O(), d.params),
               "k_cache: expected size(1) == page_size 16", "got [8, 4, 2, 64]");
}

TEST(Validation, NumSlotsNotMultipleOfPageSize) {
  Decode d;
  EXPECT_ERROR(batch_decode(d.Q(), view(d.kc, DType::bf16, {30, 2, 64}), view(d.vc, DType::bf16, {30, 2, 64}),
                            d.T(), d.S(), d.P, 1, d.O(), d.params),
               "k_cache: expected num_slots a multiple of page_size 4", "got 30 slots");
}

TEST(Validation, NonFiniteScale) {
  Decode d;
  d.params.bmm1_scale = std::nanf("");
  EXPECT_ERROR(d.run(), "batch_decode: bmm1_scale: expected a finite value", "got nan");
}

TEST(Validation, WindowBelowMinusOne) {
  Decode d;
  d.params.window_left = -2;
  EXPECT_ERROR(d.run(), "window_left: expected >= -1", "got -2");
}

TEST(Validation, NegativeSoftCap) {
  Decode d;
  d.params.logits_soft_cap = -1.0f;
  EXPECT_ERROR(d.run(), "logits_soft_cap: expected >= 0", "got -1");
}

TEST(Validation, NegativeSmMargin) {
  Decode d;
  d.params.sm_margin = -1;
  EXPECT_ERROR(d.run(), "batch_decode: sm_margin: expected >= 0", "got -1");
}

TEST(Validation, SinkPositiveInfinity) {
  Decode d;
  std::vector<float> sinks{0.0f, kInf, 0.0f, 0.0f};
  d.params.sinks = view(sinks, DType::fp32, {4});
  EXPECT_ERROR(d.run(), "sinks: expected finite values or -inf", "got inf at index 1");
}

TEST(Validation, WorkspaceNotBytes) {
  Decode d;
  std::vector<int32_t> ws(16);
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), d.V(), d.T(), d.S(), d.P, 1, d.O(), d.params, {},
                            view(ws, DType::int32, {16})),
               "workspace: expected dtype uint8", "got int32");
}

TEST(Validation, DecodeWorkspaceSizeIsZeroOnCpu) {
  EXPECT_EQ(decode_workspace_size(kCpu, 64, 4, 32, 8, 128), 0u);
  EXPECT_ERROR(decode_workspace_size(kCpu, 64, 4, 30, 8, 128), "num_q_heads: expected a positive multiple of num_kv_heads 8",
               "got 30");
}

// A valid prefill call: 3 requests with query lengths {2, 1, 2} (cu {0, 2, 3, 5}).
struct Prefill : Decode {
  std::vector<int32_t> cu{0, 2, 3, 5};
  Prefill() {
    B = 3;
    table = {1, 2, 0, 3, 4, 5, 6, 7, 0};
    lens = {5, 9, 2};
    q = bf16_fill(static_cast<std::size_t>(5 * Hq * D), 0.5f);
    o.assign(q.size(), 0);
  }
  TensorView Q() { return view(q, DType::bf16, {5, Hq, D}); }
  TensorView O() { return view(o, DType::bf16, {5, Hq, D}); }
  TensorView CU() { return view(cu, DType::int32, {B + 1}); }
  void run(int max_q_len = 2) { batch_prefill(Q(), K(), V(), T(), S(), CU(), P, max_q_len, O(), params); }
};

TEST(Validation, ValidPrefillRuns) {
  Prefill p;
  p.run();
  for (uint16_t x : p.o) ASSERT_EQ(bf16_to_float(x), 0.25f);
}

TEST(Validation, CuSeqlensNotMonotone) {
  Prefill p;
  p.cu = {0, 3, 2, 5};
  EXPECT_ERROR(p.run(3), "batch_prefill: cu_seqlens_q: expected non-decreasing prefix sums",
               "got 2 after 3 at index 2");
}

TEST(Validation, CuSeqlensNotStartingAtZero) {
  Prefill p;
  p.cu = {1, 2, 3, 5};
  EXPECT_ERROR(p.run(), "cu_seqlens_q: expected cu_seqlens_q[0] == 0", "got 1");
}

TEST(Validation, CuSeqlensNotEndingAtTotalQ) {
  Prefill p;
  p.cu = {0, 2, 3, 4};
  EXPECT_ERROR(p.run(), "cu_seqlens_q: expected last entry == 5 (total query rows)", "got 4 at index 3");
}

TEST(Validation, CuSeqlensWrongLength) {
  Prefill p;
  EXPECT_ERROR(batch_prefill(p.Q(), p.K(), p.V(), p.T(), p.S(), view(p.cu, DType::int32, {3}), p.P, 2, p.O(),
                             p.params),
               "cu_seqlens_q: expected shape [4]", "got [3]");
}

TEST(Validation, MaxQLenBelowLongestQuery) {
  Prefill p;
  EXPECT_ERROR(p.run(1), "max_q_len: expected >= every query length (request 0 has 2)", "got 1");
}

TEST(Validation, OutCacheLocOutsidePool) {
  Append a;
  a.loc = {4, 32, 6};
  EXPECT_ERROR(append_kv(a.K(), a.V(), a.KC(), a.VC(), a.L(), 4),
               "append_kv: out_cache_loc: expected slots in [0, 32)", "got 32 at index 1");
  a.loc = {4, -1, 6};
  EXPECT_ERROR(append_kv(a.K(), a.V(), a.KC(), a.VC(), a.L(), 4), "got -1 at index 1");
}

TEST(Validation, OutCacheLocWrongLength) {
  Append a;
  EXPECT_ERROR(append_kv(a.K(), a.V(), a.KC(), a.VC(), view(a.loc, DType::int32, {2}), 4),
               "out_cache_loc: expected shape [3]", "got [2]");
}

TEST(Validation, AppendHeadsDifferFromCache) {
  Append a;
  EXPECT_ERROR(append_kv(view(a.k, DType::bf16, {6, 1, 64}), view(a.v, DType::bf16, {6, 1, 64}), a.KC(), a.VC(),
                         view(a.loc, DType::int32, {3}), 4),
               "append_kv: k: expected shape [*, 2, 64]", "got [6, 1, 64]");
}

TEST(Validation, AppendNonPositiveScale) {
  Append a;
  std::vector<uint8_t> kc8(32 * 2 * 64), vc8(32 * 2 * 64);
  EXPECT_ERROR(append_kv(a.K(), a.V(), view(kc8, DType::fp8_e4m3, {32, 2, 64}),
                         view(vc8, DType::fp8_e4m3, {32, 2, 64}), a.L(), 4, 1.0f, 0.0f),
               "append_kv: v_scale: expected a finite value > 0", "got 0");
}

TEST(Validation, GatherColsAboveCapacity) {
  Gather g;
  EXPECT_ERROR(g.run(3, 9), "gather_page_table_with_padding: cols: expected <= 8 (req_to_page capacity",
               "got 9");
}

TEST(Validation, GatherNegativeSeqLen) {
  Gather g;
  g.lens = {9, -3, 1};
  EXPECT_ERROR(g.run(3, 4), "seq_lens: expected non-negative lengths", "got -3 at index 1");
}

TEST(Validation, GatherRequestIndexOutsideTable) {
  Gather g;
  g.idx = {2, 4, 0};
  EXPECT_ERROR(g.run(3, 4), "req_pool_indices: expected rows of req_to_page in [0, 4)", "got 4 at index 1");
}

TEST(Validation, GatherSeqLenBeyondCols) {
  Gather g;
  EXPECT_ERROR(g.run(3, 2), "seq_lens: expected ceil(seq_lens[r] / page_size) <= cols 2", "got 9 at index 0");
}

TEST(Validation, GatherBsAboveRows) {
  Gather g;
  EXPECT_ERROR(g.run(4, 3), "req_pool_indices: expected size(0) >= 4", "got [3]");
}

TEST(Validation, DecodeWriteSlotsBeyondTable) {
  std::vector<int32_t> table{1, 2, 3, 4}, lens{3, 9}, out(2);
  EXPECT_ERROR(decode_write_slots(view(table, DType::int32, {2, 2}), view(lens, DType::int32, {2}), 4, 1,
                                  view(out, DType::int32, {2})),
               "decode_write_slots: seq_lens: expected positions inside the page table", "position 8 for request 1");
}

TEST(Validation, ExtendWriteSlotsNegativePrefix) {
  std::vector<int32_t> table{1, 2, 3, 4}, prefix{0, -2}, cu{0, 2, 3}, out(3);
  EXPECT_ERROR(extend_write_slots(view(table, DType::int32, {2, 2}), view(prefix, DType::int32, {2}),
                                  view(cu, DType::int32, {3}), 4, view(out, DType::int32, {3})),
               "extend_write_slots: prefix_lens: expected non-negative lengths", "got -2 at index 1");
}

TEST(Validation, ClampMaxBelowMin) {
  std::vector<int32_t> lens{3, 1}, out(2);
  EXPECT_ERROR(clamp_seq_lens(view(lens, DType::int32, {2}), 4, 2, 1, view(out, DType::int32, {2})),
               "clamp_seq_lens: max_len: expected >= 4", "got 2");
}

TEST(Validation, CumsumNegativeLength) {
  std::vector<int32_t> lens{3, -1}, out(3);
  EXPECT_ERROR(cumsum_lengths(view(lens, DType::int32, {2}), view(out, DType::int32, {3})),
               "cumsum_lengths: lengths: expected non-negative lengths", "got -1 at index 1");
}

// ---- Hand-computed results -------------------------------------------------------------

// One request, one head, D 64, page size 2, keys at page 1 (page 0 is the dummy).
// D5: NumPy gives empty arrays strides 0; an empty view addresses nothing, so
// append_kv with T = 0 and batch_decode with batch 0 are no-ops.
TEST(Validation, EmptyViewsWithZeroStridesAreNoOps) {
  Append a;
  const std::vector<uint16_t> kc0 = a.kc;
  TensorView k0(a.k.data(), DType::bf16, kCpu, {0, 2, 64}, {0, 0, 0});
  TensorView loc0(a.loc.data(), DType::int32, kCpu, {0}, {0});
  append_kv(k0, k0, a.KC(), a.VC(), loc0, 4);
  EXPECT_EQ(a.kc, kc0);

  Decode d;
  TensorView q0(d.q.data(), DType::bf16, kCpu, {0, 4, 64}, {0, 0, 0});
  TensorView o0(d.o.data(), DType::bf16, kCpu, {0, 4, 64}, {0, 0, 0});
  TensorView t0(d.table.data(), DType::int32, kCpu, {0, 3}, {0, 0});
  TensorView s0(d.lens.data(), DType::int32, kCpu, {0}, {0});
  batch_decode(q0, d.K(), d.V(), t0, s0, d.P, 1, o0, d.params);
  std::vector<int32_t> cu{0};
  batch_prefill(q0, d.K(), d.V(), t0, s0, view(cu, DType::int32, {1}), d.P, 0, o0, d.params);
  // Validated all the same (docs/semantics.md 8.1): NaN sinks are an error for both.
  std::vector<float> sinks{0.0f, std::nanf(""), 1.0f, 2.0f};
  d.params.sinks = view(sinks, DType::fp32, {4});
  EXPECT_ERROR(batch_decode(q0, d.K(), d.V(), t0, s0, d.P, 1, o0, d.params), "batch_decode: sinks",
               "nan at index 1");
  EXPECT_ERROR(batch_prefill(q0, d.K(), d.V(), t0, s0, view(cu, DType::int32, {1}), d.P, 0, o0, d.params),
               "batch_prefill: sinks", "nan at index 1");
}

// D11: negative sizes are rejected in the op and argument they appear in.
TEST(Validation, NegativeSizesRejected) {
  Append a;
  EXPECT_ERROR(append_kv(view(a.k, DType::bf16, {-3, 2, 64}), a.V(), a.KC(), a.VC(), a.L(), 4),
               "append_kv: k: expected non-negative sizes", "got shape [-3, 2, 64]");
  EXPECT_ERROR(append_kv(a.K(), a.V(), view(a.kc, DType::bf16, {-32, 2, 64}), a.VC(), a.L(), 4),
               "append_kv: k_cache: expected non-negative sizes", "got shape [-32, 2, 64]");
  Decode d;
  EXPECT_ERROR(batch_decode(view(d.q, DType::bf16, {-2, 4, 64}), d.K(), d.V(), d.T(), d.S(), d.P, 1, d.O(),
                            d.params),
               "batch_decode: q: expected non-negative sizes", "got shape [-2, 4, 64]");
  EXPECT_ERROR(batch_decode(d.Q(), view(d.kc, DType::bf16, {-32, 2, 64}), d.V(), d.T(), d.S(), d.P, 1, d.O(),
                            d.params),
               "batch_decode: k_cache: expected non-negative sizes");
  std::vector<uint8_t> ws(16);
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), d.V(), d.T(), d.S(), d.P, 1, d.O(), d.params, {},
                            view(ws, DType::uint8, {-5})),
               "batch_decode: workspace: expected non-negative sizes", "got shape [-5]");
  Gather g;
  EXPECT_ERROR(gather_page_table_with_padding(view(g.r2p, DType::int32, {4, 8}), view(g.idx, DType::int32, {3}),
                                              view(g.lens, DType::int32, {3}), view(g.out, DType::int32, {-3, 8}),
                                              0, 0, 4),
               "gather_page_table_with_padding: out: expected non-negative sizes");
}

// D11: sizes that do not fit the int32 problem fields are rejected, not truncated.
TEST(Validation, SizesAboveInt32Rejected) {
  Decode d;
  const int64_t big = (int64_t{1} << 32) + 2;
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), d.V(), d.T(), view(d.lens, DType::int32, {big}), d.P, 1, d.O(), d.params),
               "batch_decode: seq_lens: expected size(0) at most 2^31 - 1", "got shape [4294967298]");
  EXPECT_ERROR(batch_decode(view(d.q, DType::bf16, {2, big + 2, 64}), d.K(), d.V(), d.T(), d.S(), d.P, 1, d.O(),
                            d.params),
               "batch_decode: q: expected size(1) at most 2^31 - 1", "got shape [2, 4294967300, 64]");
}

// D12: outputs and written caches whose elements alias each other are rejected.
TEST(Validation, OverlappingOutputsAndCachesRejected) {
  Decode d;
  TensorView o_rows0(d.o.data(), DType::bf16, kCpu, {2, 4, 64}, {0, 64, 1});
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), d.V(), d.T(), d.S(), d.P, 1, o_rows0, d.params),
               "batch_decode: out: expected a view whose elements do not overlap", "strides [0, 64, 1]");
  TensorView o_heads(d.o.data(), DType::bf16, kCpu, {2, 4, 64}, {256, 32, 1});
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), d.V(), d.T(), d.S(), d.P, 1, o_heads, d.params),
               "out: expected a view whose elements do not overlap", "strides [256, 32, 1]");
  TensorView lse0(d.lse.data(), DType::fp32, kCpu, {2, 4}, {1, 1});
  EXPECT_ERROR(batch_decode(d.Q(), d.K(), d.V(), d.T(), d.S(), d.P, 1, d.O(), d.params, lse0),
               "lse: expected a view whose elements do not overlap");

  Append a;
  TensorView kc_tok0(a.kc.data(), DType::bf16, kCpu, {32, 2, 64}, {0, 64, 1});
  EXPECT_ERROR(append_kv(a.K(), a.V(), kc_tok0, a.VC(), a.L(), 4),
               "append_kv: k_cache: expected a view whose elements do not overlap", "strides [0, 64, 1]");
  TensorView vc_heads(a.vc.data(), DType::bf16, kCpu, {32, 2, 64}, {128, 32, 1});
  EXPECT_ERROR(append_kv(a.K(), a.V(), a.KC(), vc_heads, a.L(), 4),
               "append_kv: v_cache: expected a view whose elements do not overlap", "strides [128, 32, 1]");
  EXPECT_ERROR(append_kv(a.K(), a.V(), a.KC(), a.KC(), a.L(), 4),
               "append_kv: v_cache: expected memory distinct from k_cache");
  // K and V interleaved in one buffer [slots, 2, Hkv, D] do not alias: accepted.
  std::vector<uint16_t> kv(32 * 2 * 2 * 64, 0);
  TensorView k_il(kv.data(), DType::bf16, kCpu, {32, 2, 64}, {256, 64, 1});
  TensorView v_il(kv.data() + 128, DType::bf16, kCpu, {32, 2, 64}, {256, 64, 1});
  append_kv(a.K(), a.V(), k_il, v_il, a.L(), 4);
  EXPECT_EQ(bf16_to_float(kv[4 * 256]), 1.0f);
  EXPECT_EQ(bf16_to_float(kv[4 * 256 + 128]), 2.0f);

  Gather g;
  TensorView out_rows0(g.out.data(), DType::int32, kCpu, {3, 8}, {0, 1});
  EXPECT_ERROR(gather_page_table_with_padding(view(g.r2p, DType::int32, {4, 8}), view(g.idx, DType::int32, {3}),
                                              view(g.lens, DType::int32, {3}), out_rows0, 3, 4, 4),
               "gather_page_table_with_padding: out: expected a view whose elements do not overlap");
}

// D13: a strides list of the wrong length is rejected before it is read (ASan).
TEST(Validation, TensorViewStridesCountMismatch) {
  std::vector<uint16_t> x(64);
  EXPECT_ERROR(TensorView(x.data(), DType::bf16, kCpu, {2, 4, 8, 1, 1, 1}, {8}),
               "TensorView: strides: expected 6 strides", "got 1");
}

// cols == 0 still validates seq_lens and req_pool_indices.
TEST(Validation, GatherZeroColsStillValidates) {
  Gather g;
  EXPECT_ERROR(g.run(3, 0), "seq_lens: expected ceil(seq_lens[r] / page_size) <= cols 0", "got 9 at index 0");
  g.lens = {0, -1, 0};
  EXPECT_ERROR(g.run(3, 0), "seq_lens: expected non-negative lengths", "got -1 at index 1");
  g.lens = {0, 0, 0};
  g.idx = {2, 4, 0};
  EXPECT_ERROR(g.run(3, 0), "req_pool_indices: expected rows of req_to_page in [0, 4)", "got 4 at index 1");
  g.idx = {2, 1, 0};
  g.run(3, 0);
  EXPECT_EQ(g.out, std::vector<int32_t>(3 * 8, -7));
}

}  // namespace
