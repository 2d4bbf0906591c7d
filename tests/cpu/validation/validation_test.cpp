// Argument validation of every op (one test per error kind: each asserts that the
// message names the op, the argument and the value given), plus a few hand-computed
// results proving the CPU ops run. The full oracle grid lives in tests/cpu/ops/.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#include "pagedmha/numeric.h"
#include "pagedmha/ops.h"

namespace {

using namespace pagedmha;

const Device kCpu = Device::cpu();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The Error message of `f`, or a test failure when it throws none.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected pagedmha::Error, none thrown";
  return {};
}

// Asserts that `call` throws Error and that its message contains every fragment.
#define EXPECT_ERROR(call, ...)                                                     \
  do {                                                                              \
    const std::string msg_ = error_of([&] { call; });                               \
    for (const std::string frag_ : {__VA_ARGS__}) {                                 \
      EXPECT_NE(msg_.find(frag_), std::string::npos) << "missing \"" << frag_       \
                                                     << "\" in: " << msg_;          \
    }                                                                               \
  } while (0)

template <class T>
TensorView view(std::vector<T>& v, DType dtype, std::initializer_list<int64_t> shape) {
  return TensorView(v.data(), dtype, kCpu, shape);
}

std::vector<uint16_t> bf16_fill(std::size_t n, float x) { return std::vector<uint16_t>(n, float_to_bf16(x)); }

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

// append_kv: 3 tokens into a pool of 8 pages x 4 slots (32 slots), Hkv 2, D 64.
struct Append {
  std::vector<uint16_t> k = bf16_fill(3 * 2 * 64, 1.0f), v = bf16_fill(3 * 2 * 64, 2.0f);
  std::vector<uint16_t> kc = bf16_fill(32 * 2 * 64, 0.0f), vc = kc;
  std::vector<int32_t> loc{4, 5, 31};
  TensorView K() { return view(k, DType::bf16, {3, 2, 64}); }
  TensorView V() { return view(v, DType::bf16, {3, 2, 64}); }
  TensorView KC() { return view(kc, DType::bf16, {32, 2, 64}); }
  TensorView VC() { return view(vc, DType::bf16, {32, 2, 64}); }
  TensorView L() { return view(loc, DType::int32, {3}); }
};

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

// gather_page_table_with_padding: req_to_page [4, 8].
struct Gather {
  std::vector<int32_t> r2p, idx{2, 1, 0}, lens{9, 3, 1}, out = std::vector<int32_t>(3 * 8, -7);
  Gather() {
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 8; ++c) r2p.push_back(r == 0 ? 0 : 10 * r + c);
    }
  }
  void run(int bs, int cols, int P = 4) {
    gather_page_table_with_padding(view(r2p, DType::int32, {4, 8}), view(idx, DType::int32, {3}),
                                   view(lens, DType::int32, {3}), view(out, DType::int32, {3, 8}), bs, cols, P);
  }
};

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

// q = e0; k0 = e0, k1 = 0; v0 = 1, v1 = 5. With bmm1_scale = ln 3 the logits are
// ln 3 and 0, so the weights are 3/4 and 1/4: o = 2, lse = ln 4.
struct TwoKeys {
  static constexpr int D = 64, P = 2;
  std::vector<uint16_t> q, kc = bf16_fill(2 * P * D, 0.0f), vc = bf16_fill(2 * P * D, 0.0f);
  std::vector<uint16_t> o;
  std::vector<float> lse;
  std::vector<int32_t> table{1}, lens{2};
  int rows;
  explicit TwoKeys(int rows_ = 1) : rows(rows_) {
    q = bf16_fill(static_cast<std::size_t>(rows * D), 0.0f);
    for (int r = 0; r < rows; ++r) q[static_cast<std::size_t>(r * D)] = float_to_bf16(1.0f);
    o.assign(q.size(), float_to_bf16(-9.0f));
    lse.assign(rows, -9.0f);
    kc[P * D] = float_to_bf16(1.0f);  // slot 2 = page 1, offset 0
    for (int x = 0; x < D; ++x) {
      vc[P * D + x] = float_to_bf16(1.0f);
      vc[(P + 1) * D + x] = float_to_bf16(5.0f);
    }
  }
  TensorView Q() { return view(q, DType::bf16, {rows, 1, D}); }
  TensorView K() { return view(kc, DType::bf16, {2 * P, 1, D}); }
  TensorView V() { return view(vc, DType::bf16, {2 * P, 1, D}); }
  TensorView O() { return view(o, DType::bf16, {rows, 1, D}); }
  TensorView LSE() { return view(lse, DType::fp32, {rows, 1}); }
  float out(int r) {
    for (int x = 1; x < D; ++x) EXPECT_EQ(o[r * D + x], o[r * D]) << "row " << r << " not uniform";
    return bf16_to_float(o[static_cast<std::size_t>(r * D)]);
  }
};

AttentionParams ln3_params() {
  AttentionParams p;
  p.bmm1_scale = std::log(3.0f);
  return p;
}

TEST(HandComputed, DecodeTwoKeys) {
  TwoKeys t;
  batch_decode(t.Q(), t.K(), t.V(), view(t.table, DType::int32, {1, 1}), view(t.lens, DType::int32, {1}), 2, 1,
               t.O(), ln3_params(), t.LSE());
  EXPECT_EQ(t.out(0), 2.0f);
  EXPECT_NEAR(t.lse[0], std::log(4.0), 1e-6);
}

TEST(HandComputed, DecodeTwoKeysWithSinkAndVScale) {
  // Sink ln 4: Z = 3 + 1 + 4 = 8, o = bmm2 * (3 * 1 + 1 * 5) / 8 = bmm2 * 1; lse = ln 8.
  TwoKeys t;
  std::vector<float> sinks{std::log(4.0f)};
  AttentionParams p = ln3_params();
  p.sinks = view(sinks, DType::fp32, {1});
  p.bmm2_scale = 2.5f;
  batch_decode(t.Q(), t.K(), t.V(), view(t.table, DType::int32, {1, 1}), view(t.lens, DType::int32, {1}), 2, 1,
               t.O(), p, t.LSE());
  EXPECT_EQ(t.out(0), 2.5f);
  EXPECT_NEAR(t.lse[0], std::log(8.0), 1e-6);
}

TEST(HandComputed, PrefillCausalWindowAndNonCausal) {
  // Three queries over L = 2 keys: positions -1, 0, 1. Causal: row 0 sees nothing
  // (o = 0, lse = -inf), row 1 sees key 0 (o = 1), row 2 sees both (o = 2).
  TwoKeys t(3);
  std::vector<int32_t> cu{0, 3};
  auto run = [&](AttentionParams p) {
    batch_prefill(t.Q(), t.K(), t.V(), view(t.table, DType::int32, {1, 1}), view(t.lens, DType::int32, {1}),
                  view(cu, DType::int32, {2}), 2, 3, t.O(), p, t.LSE());
  };
  AttentionParams p = ln3_params();
  run(p);
  EXPECT_EQ(t.out(0), 0.0f);
  EXPECT_EQ(t.lse[0], -kInf);
  EXPECT_EQ(t.out(1), 1.0f);
  EXPECT_NEAR(t.lse[1], std::log(3.0), 1e-6);
  EXPECT_EQ(t.out(2), 2.0f);
  p.window_left = 0;  // each query sees only itself: row 2 sees key 1
  run(p);
  EXPECT_EQ(t.out(1), 1.0f);
  EXPECT_EQ(t.out(2), 5.0f);
  EXPECT_NEAR(t.lse[2], 0.0, 1e-6);
  p.window_left = -1;
  p.causal = false;  // every query sees both keys
  run(p);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(t.out(r), 2.0f);
}

TEST(HandComputed, EmptyRowsGiveZeroAndSinkLse) {
  TwoKeys t;
  t.lens = {0};
  t.table = {-1};  // never read
  std::vector<float> sinks{2.5f};
  AttentionParams p = ln3_params();
  batch_decode(t.Q(), t.K(), t.V(), view(t.table, DType::int32, {1, 1}), view(t.lens, DType::int32, {1}), 2, 1,
               t.O(), p, t.LSE());
  EXPECT_EQ(t.out(0), 0.0f);
  EXPECT_EQ(t.lse[0], -kInf);
  p.sinks = view(sinks, DType::fp32, {1});
  batch_decode(t.Q(), t.K(), t.V(), view(t.table, DType::int32, {1, 1}), view(t.lens, DType::int32, {1}), 2, 1,
               t.O(), p, t.LSE());
  EXPECT_EQ(t.out(0), 0.0f);
  EXPECT_EQ(t.lse[0], 2.5f);
}

TEST(HandComputed, LogitsFarBelowAnySentinel) {
  // Logits -65536 and -76800: the argmax key (v = 1) takes all the weight.
  TwoKeys t;
  t.q[0] = float_to_bf16(-256.0f);
  t.kc[TwoKeys::P * TwoKeys::D] = float_to_bf16(256.0f);
  t.kc[(TwoKeys::P + 1) * TwoKeys::D] = float_to_bf16(300.0f);
  AttentionParams p;
  batch_decode(t.Q(), t.K(), t.V(), view(t.table, DType::int32, {1, 1}), view(t.lens, DType::int32, {1}), 2, 1,
               t.O(), p, t.LSE());
  EXPECT_EQ(t.out(0), 1.0f);
  EXPECT_EQ(t.lse[0], -65536.0f);
}

TEST(HandComputed, SoftCapBeforeSoftmax) {
  // bmm1_scale 2, cap 1: logits tanh(2) and 0.
  TwoKeys t;
  AttentionParams p;
  p.bmm1_scale = 2.0f;
  p.logits_soft_cap = 1.0f;
  batch_decode(t.Q(), t.K(), t.V(), view(t.table, DType::int32, {1, 1}), view(t.lens, DType::int32, {1}), 2, 1,
               t.O(), p, t.LSE());
  const double w = std::exp(std::tanh(2.0));
  EXPECT_NEAR(t.out(0), (w * 1 + 5) / (w + 1), 1e-2);
  EXPECT_NEAR(t.lse[0], std::log(w + 1), 1e-6);
}

TEST(HandComputed, GqaHeadsMapToContiguousGroups) {
  // Hq 4, Hkv 2: heads 0, 1 read KV head 0 (v = 3), heads 2, 3 read KV head 1 (v = 7).
  const int D = 64, P = 1;
  std::vector<uint16_t> q = bf16_fill(4 * D, 0.1f), o(4 * D), kc = bf16_fill(2 * 2 * D, 0.2f), vc(2 * 2 * D);
  for (int x = 0; x < D; ++x) {
    vc[2 * D + x] = float_to_bf16(3.0f);      // slot 1 (page 1), head 0
    vc[2 * D + D + x] = float_to_bf16(7.0f);  // slot 1, head 1
  }
  std::vector<int32_t> table{1}, lens{1};
  batch_decode(view(q, DType::bf16, {1, 4, D}), view(kc, DType::bf16, {2, 2, D}), view(vc, DType::bf16, {2, 2, D}),
               view(table, DType::int32, {1, 1}), view(lens, DType::int32, {1}), P, 1, view(o, DType::bf16, {1, 4, D}),
               AttentionParams{});
  for (int h = 0; h < 4; ++h) EXPECT_EQ(bf16_to_float(o[h * D]), h < 2 ? 3.0f : 7.0f) << "head " << h;
}

TEST(HandComputed, AppendKvQuantisesToFp8AndTouchesNothingElse) {
  Append a;
  a.k[0] = float_to_bf16(1000.0f);  // token 0, head 0, dim 0: saturates to 448
  std::vector<uint8_t> kc8(32 * 2 * 64, 0x11), vc8(32 * 2 * 64, 0x11);
  append_kv(a.K(), a.V(), view(kc8, DType::fp8_e4m3, {32, 2, 64}), view(vc8, DType::fp8_e4m3, {32, 2, 64}), a.L(),
            4, /*k_scale=*/0.5f, /*v_scale=*/4.0f);
  for (int s = 0; s < 32; ++s) {
    const bool written = s == 4 || s == 5 || s == 31;
    for (int e = 0; e < 2 * 64; ++e) {
      const std::size_t i = static_cast<std::size_t>(s * 128 + e);
      const uint8_t kx = written ? (s == 4 && e == 0 ? 0x7E : float_to_fp8_e4m3(2.0f)) : 0x11;
      const uint8_t vx = written ? float_to_fp8_e4m3(0.5f) : 0x11;
      ASSERT_EQ(kc8[i], kx) << "slot " << s << " elem " << e;
      ASSERT_EQ(vc8[i], vx) << "slot " << s << " elem " << e;
    }
  }
  EXPECT_EQ(fp8_e4m3_to_float(0x7E), 448.0f);
}

TEST(HandComputed, AppendKvInto4dHndViewMatchesNhd) {
  // An HND buffer [pages, Hkv, P, D] seen as [pages, P, Hkv, D] through strides.
  Append a;
  for (std::size_t i = 0; i < a.k.size(); ++i) a.k[i] = float_to_bf16(static_cast<float>(i % 97));
  std::vector<uint16_t> hnd(32 * 2 * 64, 0), hnd_v(32 * 2 * 64, 0);
  TensorView k4(hnd.data(), DType::bf16, kCpu, {8, 4, 2, 64}, {512, 64, 256, 1});
  TensorView v4(hnd_v.data(), DType::bf16, kCpu, {8, 4, 2, 64}, {512, 64, 256, 1});
  append_kv(a.K(), a.V(), k4, v4, a.L(), 4);
  append_kv(a.K(), a.V(), a.KC(), a.VC(), a.L(), 4);
  for (int t = 0; t < 3; ++t) {
    const int s = a.loc[t];
    for (int h = 0; h < 2; ++h) {
      for (int x = 0; x < 64; ++x) {
        const uint16_t want = a.k[static_cast<std::size_t>((t * 2 + h) * 64 + x)];
        ASSERT_EQ(hnd[static_cast<std::size_t>((s / 4) * 512 + h * 256 + (s % 4) * 64 + x)], want);
        ASSERT_EQ(a.kc[static_cast<std::size_t>((s * 2 + h) * 64 + x)], want);
      }
    }
  }
}

TEST(HandComputed, GatherPadsWithDummyPageAndLeavesTheRest) {
  Gather g;
  g.run(/*bs=*/2, /*cols=*/4);
  // Row 0: request 2, 9 tokens -> 3 pages; row 1: request 1, 3 tokens -> 1 page.
  const std::vector<int32_t> row0{20, 21, 22, 0, -7, -7, -7, -7}, row1{10, 0, 0, 0, -7, -7, -7, -7};
  EXPECT_EQ(std::vector<int32_t>(g.out.begin(), g.out.begin() + 8), row0);
  EXPECT_EQ(std::vector<int32_t>(g.out.begin() + 8, g.out.begin() + 16), row1);
  EXPECT_EQ(std::vector<int32_t>(g.out.begin() + 16, g.out.end()), std::vector<int32_t>(8, -7));
}

TEST(HandComputed, MetadataHelpers) {
  std::vector<int32_t> lens{3, 0, 5}, cu(4);
  cumsum_lengths(view(lens, DType::int32, {3}), view(cu, DType::int32, {4}));
  EXPECT_EQ(cu, (std::vector<int32_t>{0, 3, 3, 8}));

  std::vector<int32_t> clamped(3);
  clamp_seq_lens(view(lens, DType::int32, {3}), 2, view(clamped, DType::int32, {3}));
  EXPECT_EQ(clamped, (std::vector<int32_t>{3, 2, 5}));
  std::vector<int32_t> expanded(6);  // block-diffusion form: clamp to [2, 4], two rows each
  clamp_seq_lens(view(lens, DType::int32, {3}), 2, 4, 2, view(expanded, DType::int32, {6}));
  EXPECT_EQ(expanded, (std::vector<int32_t>{3, 3, 2, 2, 4, 4}));

  // Page size 4; request 0 pages {7, 9}, request 1 pages {3, 0}.
  std::vector<int32_t> table{7, 9, 3, 0}, seq{6, 1}, slots(4);
  decode_write_slots(view(table, DType::int32, {2, 2}), view(seq, DType::int32, {2}), 4, 2,
                     view(slots, DType::int32, {4}));
  // Request 0 positions 4, 5 -> page 9; request 1 positions max(-1, 0) = 0 and 0 -> page 3.
  EXPECT_EQ(slots, (std::vector<int32_t>{36, 37, 12, 12}));

  std::vector<int32_t> prefix{3, 0}, cuq{0, 2, 3}, ext(3);
  extend_write_slots(view(table, DType::int32, {2, 2}), view(prefix, DType::int32, {2}),
                     view(cuq, DType::int32, {3}), 4, view(ext, DType::int32, {3}));
  EXPECT_EQ(ext, (std::vector<int32_t>{31, 36, 12}));  // positions 3, 4 of request 0; 0 of request 1
}

}  // namespace
