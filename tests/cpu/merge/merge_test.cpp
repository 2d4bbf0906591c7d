// merge_attention_states on the CPU against the fp64 oracle over the union of the keys:
// parts from the oracle over key subsets (ranges, pages, tokens, random, one part with
// the others empty), parts from batch_decode / batch_prefill over shards of the paged
// cache (decode context parallelism, cascade-style prefix / suffix splits, windows),
// sinks given to the merge or held by one part, in place, empty parts and K = 0 / 1.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "oracle/merge_parts.h"

namespace {

using namespace ptest;
constexpr double kInf = std::numeric_limits<double>::infinity();

AttnCase small_case(bool decode, uint64_t seed) {
  AttnCase c;
  c.decode = decode;
  c.Hq = 4, c.Hkv = 2, c.D = 64, c.page_size = 8;
  c.seed = seed;
  if (decode) {
    c.kv_lens = {0, 1, 37, 150};
  } else {
    c.q_lens = {5, 0, 17, 9};
    c.kv_lens = {5, 3, 80, 40};
  }
  return c;
}

// Merges `parts` into a fresh output of `p` (sinks given to the merge when sinks_in_merge)
// and checks it against the oracle over all of p's keys.
void merge_and_check(const AttnProblem& p, const Parts& parts, bool sinks_in_merge, const std::string& what,
                     RowLayout out_layout = RowLayout::contiguous) {
  AttnProblem r = with_merge_outputs(p, parts.o.dtype);
  r.out = make_rows(parts.o.dtype, p.rows, p.c.Hq, p.c.D, out_layout, 1, 8);
  const TensorView sinks = sinks_in_merge && p.c.sinks != SinkMode::none ? p.sinks.view() : TensorView{};
  pagedmha::merge_attention_states(parts.o.view(), parts.lse.view(), r.out.view(), r.lse.view(), sinks);
  r.c.name = what;
  EXPECT_TRUE(check_attention(r, p.reference(), merge_tolerance(parts.o.dtype)));
}

// ---------------------------------------------------------------------------------
// Parts from the oracle.

TEST(Merge, OracleSplitsGrid) {
  const SplitKind kinds[] = {SplitKind::ranges, SplitKind::pages, SplitKind::tokens, SplitKind::one_part,
                             SplitKind::random_keys};
  const DType dtypes[] = {DType::bf16, DType::fp16, DType::fp32};
  int i = 0;
  for (bool decode : {true, false})
    for (SplitKind kind : kinds)
      for (int K : {1, 2, 3, 5}) {
        AttnCase c = small_case(decode, 100 + i);
        c.window_left = i % 3 == 1 ? 19 : -1;
        c.sinks = i % 4 == 2 ? SinkMode::mixed : SinkMode::none;
        c.causal = decode || i % 5 != 3;
        c.D = i % 7 == 4 ? 128 : (i % 7 == 6 ? 256 : 64);
        const DType dtype = dtypes[i % 3];
        const AttnProblem p = build(c);
        const KeySplit split = make_split(p, kind, K, 7 * i + 1);
        const std::string what = std::string(decode ? "decode" : "prefill") + " split=" + split_name(kind) +
                                 " K=" + std::to_string(K) + " dtype=" + pagedmha::dtype_name(dtype) +
                                 " W=" + std::to_string(c.window_left) + " D=" + std::to_string(c.D) +
                                 " causal=" + std::to_string(c.causal);
        // Sinks given to the merge, parts without them.
        merge_and_check(p, oracle_parts(p, K, split, dtype, -1, i % 2 ? 8 : 0), true, what + " sinks in merge");
        // Sinks held by one part (the last), none given to the merge.
        if (c.sinks != SinkMode::none) {
          merge_and_check(p, oracle_parts(p, K, split, dtype, K - 1), false, what + " sinks in a part");
        }
        ++i;
      }
}

TEST(Merge, ExtremeSinksAndStridedOut) {
  for (SinkMode mode : {SinkMode::mixed, SinkMode::extreme}) {
    AttnCase c = small_case(false, 300 + static_cast<int>(mode));
    c.sinks = mode;
    c.Hq = 8;
    const AttnProblem p = build(c);
    for (int sink_part : {-1, 0, 2}) {
      const Parts parts = oracle_parts(p, 3, make_split(p, SplitKind::tokens, 3, 5), DType::bf16, sink_part);
      merge_and_check(p, parts, sink_part < 0, "sinks part " + std::to_string(sink_part), RowLayout::padded);
    }
  }
}

TEST(Merge, SinkCountedTwiceIsDetected) {
  // The sink given to the merge *and* held by a part counts twice: the check must fail.
  AttnCase c = small_case(true, 320);
  c.sinks = SinkMode::custom;
  c.custom_sinks = {1.0, 2.0, 0.5, 3.0};
  const AttnProblem p = build(c);
  const Parts parts = oracle_parts(p, 2, make_split(p, SplitKind::pages, 2, 1), DType::fp32, 0);
  AttnProblem r = with_merge_outputs(p, DType::fp32);
  pagedmha::merge_attention_states(parts.o.view(), parts.lse.view(), r.out.view(), r.lse.view(), p.sinks.view());
  EXPECT_FALSE(check_attention(r, p.reference(), merge_tolerance(DType::fp32)));
}

// ---------------------------------------------------------------------------------
// Empty parts, K = 0, in place.

TEST(Merge, EmptyPartsAreNeverRead) {
  for (SinkMode mode : {SinkMode::none, SinkMode::mixed}) {
    AttnCase c = small_case(true, 330);
    c.sinks = mode;
    const AttnProblem p = build(c);
    // Part 1 of 4 holds everything; parts 0, 2, 3 are empty (and hold NaN).
    Parts parts = oracle_parts(p, 4, [](int, int) { return 1; }, DType::bf16, -1);
    poison_empty_parts(parts);
    merge_and_check(p, parts, true, "3 empty parts with NaN o");
  }
}

TEST(Merge, AllPartsEmptyAndNoParts) {
  AttnCase c = small_case(true, 340);
  c.kv_lens = {0, 0, 0};
  for (SinkMode mode : {SinkMode::none, SinkMode::mixed}) {
    c.sinks = mode;
    const AttnProblem p = build(c);
    for (int K : {0, 1, 3}) {
      Parts parts = oracle_parts(p, K, [](int, int) { return 0; }, DType::fp16, -1);
      poison_empty_parts(parts);
      // The reference of rows with no key: o = 0, lse = -inf or the sink.
      merge_and_check(p, parts, true, "all empty K=" + std::to_string(K));
    }
  }
}

TEST(Merge, InPlace) {
  AttnCase c = small_case(false, 350);
  c.sinks = SinkMode::mixed;
  c.window_left = 11;
  const AttnProblem p = build(c);
  for (DType dtype : {DType::bf16, DType::fp32}) {
    for (int k : {0, 2}) {
      const Parts parts = oracle_parts(p, 3, make_split(p, SplitKind::ranges, 3, 9), dtype, -1, 8);
      const HostTensor out = part_of(parts.o, k), out_lse = part_of(parts.lse, k);
      pagedmha::merge_attention_states(parts.o.view(), parts.lse.view(), out.view(), out_lse.view(), p.sinks.view());
      // Copy the merged part out so check_attention judges it (poison around included).
      AttnProblem r = with_merge_outputs(p, dtype);
      r.c.name = "in place into part " + std::to_string(k);
      copy_merged(r, out, out_lse);
      EXPECT_TRUE(check_attention(r, p.reference(), merge_tolerance(dtype)));
    }
  }
}

TEST(Merge, OutLseOptionalAndZeroRows) {
  AttnCase c = small_case(true, 360);
  const AttnProblem p = build(c);
  const Parts parts = oracle_parts(p, 2, make_split(p, SplitKind::tokens, 2, 3), DType::bf16, -1);
  AttnProblem r = with_merge_outputs(p, DType::bf16);
  pagedmha::merge_attention_states(parts.o.view(), parts.lse.view(), r.out.view());
  r.c.with_lse = false;
  EXPECT_TRUE(check_attention(r, p.reference(), merge_tolerance(DType::bf16)));
  // T = 0: nothing to do, nothing written.
  HostTensor o0 = make_tensor(DType::bf16, {2, 0, 4, 64}), l0 = make_tensor(DType::fp32, {2, 0, 4});
  HostTensor out0 = make_tensor(DType::bf16, {0, 4, 64});
  pagedmha::merge_attention_states(o0.view(), l0.view(), out0.view());
}

TEST(Merge, SyntheticPartsAgainstFormula) {
  // Many parts, far-apart lse, empty parts holding NaN, sinks on some heads; and one
  // buffer seen as every part (stride 0 on K).
  std::vector<double> sinks{-kInf, 0.0, 35.0};
  HostTensor sink_t = make_tensor(DType::fp32, {3});
  for (int h = 0; h < 3; ++h) sink_t.typed<float>()[h] = static_cast<float>(sinks[h]);
  int i = 0;
  for (DType dtype : {DType::bf16, DType::fp16, DType::fp32})
    for (int K : {1, 2, 33}) {
      Parts parts = random_parts(50, 3, 128, K, dtype, 600 + i++, K == 2 ? 0.0 : 0.3, 60.0);
      if (K == 2) parts.o.strides[0] = 0;  // both parts read part 0's o
      for (bool with_sinks : {false, true}) {
        HostTensor out = make_tensor(dtype, {50, 3, 128}), out_lse = make_tensor(DType::fp32, {50, 3});
        pagedmha::merge_attention_states(parts.o.view(), parts.lse.view(), out.view(), out_lse.view(),
                                         with_sinks ? sink_t.view() : TensorView{});
        std::vector<double> ref_o, ref_lse;
        reference_merge(parts.o, parts.lse, with_sinks ? &sinks : nullptr, ref_o, ref_lse);
        EXPECT_TRUE(check_merge(out, &out_lse, ref_o, ref_lse))
            << pagedmha::dtype_name(dtype) << " K=" << K << " sinks=" << with_sinks;
      }
    }
}

// ---------------------------------------------------------------------------------
// Parts from the attention ops over shards of the paged cache.

// Part [a, e) of request b's keys (a a multiple of the page size) by batch_decode or
// batch_prefill over the request's pages from column a / P, into the rows of o[k] and
// lse[k]; the problem's sinks go in when `with_sinks`. Shifting positions by a keeps the
// causal mask and the window; a part ending before L is a non-causal one (every query
// sees all its keys), its window shrunk by the L - e keys after it. Returns false for a
// part the ops cannot express (a window cutting such a part differently per query).
bool op_range_part(const AttnProblem& p, int b, int a, int e, const Parts& parts, int k, bool with_sinks) {
  const int n = p.q_lens[b], L = p.c.kv_lens[b], P = p.c.page_size, W = p.c.window_left;
  if (n == 0) return true;
  int len = e - a, window = W;
  bool causal = p.c.causal;
  if (e < L) {
    if (causal && L - n < e - 1) return false;  // the causal mask would cut [a, e)
    causal = false;
    window = W < 0 ? -1 : W - (L - e);
    if (W >= 0 && window < 0) {
      if (L - n - W < e) return false;  // some query sees part of [a, e), some not
      len = 0, window = -1;             // no query sees any key of [a, e)
    }
  }
  std::vector<int32_t> seq_len{len}, cu{0, n};
  const int64_t cols = p.cols - a / P;
  const TensorView table(p.page_table.typed<int32_t>() + static_cast<int64_t>(b) * p.cols + a / P, DType::int32,
                         Device::cpu(), {1, cols}, {p.cols, 1});
  const TensorView lens(seq_len.data(), DType::int32, Device::cpu(), {1});
  const TensorView q = p.q.view().slice(0, p.q_start[b], n);
  const TensorView out = part_of(parts.o, k).view().slice(0, p.q_start[b], n);
  const TensorView lse = part_of(parts.lse, k).view().slice(0, p.q_start[b], n);
  AttentionParams prm = p.params(p.sinks.view());
  if (!with_sinks) prm.sinks = {};
  prm.window_left = window;
  prm.causal = causal;
  const AttnViews v = p.host_views();
  if (causal && p.c.decode) {
    pagedmha::batch_decode(q, v.k_cache, v.v_cache, table, lens, P, n, out, prm, lse);
  } else {
    const TensorView cu_view(cu.data(), DType::int32, Device::cpu(), {2});
    pagedmha::batch_prefill(q, v.k_cache, v.v_cache, table, lens, cu_view, P, n, out, prm, lse);
  }
  return true;
}

// Splits every request at `cuts(b)` (sorted, page-aligned except possibly none) into
// contiguous ranges, computes them with the ops and merges.
void check_op_ranges(const AttnProblem& p, int K, const std::function<std::vector<int>(int)>& cuts, DType dtype,
                     int sink_part, const std::string& what) {
  Parts parts = make_parts(p, K, dtype);
  for (int b = 0; b < p.batch; ++b) {
    std::vector<int> bounds = cuts(b);
    bounds.insert(bounds.begin(), 0);
    bounds.push_back(p.c.kv_lens[b]);
    ASSERT_EQ(static_cast<int>(bounds.size()), K + 1);
    for (int k = 0; k < K; ++k) {
      ASSERT_TRUE(op_range_part(p, b, bounds[k], bounds[k + 1], parts, k, k == sink_part))
          << what << ": request " << b << " part [" << bounds[k] << ", " << bounds[k + 1] << ") not expressible";
    }
  }
  merge_and_check(p, parts, sink_part < 0, what);
}

TEST(Merge, DecodeRangesThroughOps) {
  // One query per request: every contiguous range is expressible, windows included (a
  // range wholly before the window is an empty part).
  for (int W : {-1, 0, 20, 100}) {
    AttnCase c = small_case(true, 400 + W);
    c.kv_lens = {0, 1, 37, 150, 64};
    c.window_left = W;
    c.sinks = SinkMode::mixed;
    c.release_window_pages = false;  // a range before the window still reads its pages
    const AttnProblem p = build(c);
    for (int K : {1, 2, 4}) {
      const auto cuts = [&](int b) {
        std::vector<int> v;
        const int pages = (c.kv_lens[b] + c.page_size - 1) / c.page_size;
        for (int i = 1; i < K; ++i) v.push_back(std::min(pages * i / K, pages) * c.page_size);
        for (int& x : v) x = std::min(x, c.kv_lens[b]);
        return v;
      };
      const std::string what = "decode ranges W=" + std::to_string(W) + " K=" + std::to_string(K);
      check_op_ranges(p, K, cuts, DType::bf16, -1, what + " sinks in merge");
      check_op_ranges(p, K, cuts, DType::bf16, K - 1, what + " sinks in last part");
    }
  }
}

TEST(Merge, PrefillPrefixSuffixThroughOps) {
  // Cascade-style: the cached prefix (whole pages before the first query) as one or two
  // non-causal parts, the rest causal; windows wide enough to see every prefix part whole.
  for (int W : {-1, 70}) {
    for (bool causal : {true, false}) {
      AttnCase c = small_case(false, 450 + W + causal);
      c.q_dtype = c.kv_dtype = DType::fp16;  // the parts have the query's dtype
      c.q_lens = {5, 3, 17, 9, 1};
      c.kv_lens = {5, 40, 80, 57, 17};
      c.window_left = W;
      c.causal = causal;
      c.sinks = SinkMode::mixed;
      c.release_window_pages = false;
      const AttnProblem p = build(c);
      const int P = c.page_size;
      const auto two = [&](int b) {
        const int prefix = c.kv_lens[b] - c.q_lens[b];
        return std::vector<int>{std::max(prefix, 0) / P * P};
      };
      const auto three = [&](int b) {
        const int whole = std::max(c.kv_lens[b] - c.q_lens[b], 0) / P;
        return std::vector<int>{whole / 2 * P, whole * P};
      };
      const std::string what = "prefill W=" + std::to_string(W) + " causal=" + std::to_string(causal);
      check_op_ranges(p, 2, two, DType::fp16, -1, what + " prefix|suffix");
      check_op_ranges(p, 3, three, DType::fp16, 1, what + " prefix|prefix|suffix, sinks in part 1");
    }
  }
}

// Decode context parallelism: request b's pages dealt to K ranks (contiguous chunks or
// round-robin); each rank runs batch_decode on its own page table and lengths; the merge
// takes the sinks. A rank without pages for a request gets seq_len 0 (an empty part).
TEST(Merge, DecodeContextParallelThroughOps) {
  for (bool interleaved : {false, true}) {
    for (int K : {2, 3, 8}) {
      AttnCase c = small_case(true, 500 + K + interleaved);
      c.kv_lens = {0, 1, 8, 37, 150, 300};
      c.sinks = SinkMode::mixed;
      c.Hq = 8;
      const AttnProblem p = build(c);
      const int P = c.page_size;
      Parts parts = make_parts(p, K, DType::bf16);
      const AttnViews v = p.host_views();
      for (int k = 0; k < K; ++k) {
        std::vector<int32_t> table(static_cast<size_t>(p.batch) * p.cols, 0), lens(p.batch, 0);
        for (int b = 0; b < p.batch; ++b) {
          const int L = c.kv_lens[b], pages = (L + P - 1) / P, chunk = (pages + K - 1) / K;
          const int32_t* row = p.page_table.typed<int32_t>() + static_cast<int64_t>(b) * p.cols;
          int count = 0;
          for (int col = 0; col < pages; ++col) {
            if ((interleaved ? col % K : col / chunk) != k) continue;
            table[static_cast<size_t>(b) * p.cols + count++] = row[col];
            lens[b] += std::min(P, L - col * P);  // the last page may be partial (and is last)
          }
        }
        const TensorView t(table.data(), DType::int32, Device::cpu(), {p.batch, p.cols});
        const TensorView l(lens.data(), DType::int32, Device::cpu(), {p.batch});
        AttentionParams prm = p.params(TensorView{});
        pagedmha::batch_decode(v.q, v.k_cache, v.v_cache, t, l, P, 1, part_of(parts.o, k).view(), prm,
                               part_of(parts.lse, k).view());
      }
      merge_and_check(p, parts, true,
                      std::string(interleaved ? "round-robin" : "contiguous") + " DCP K=" + std::to_string(K));
    }
  }
}

}  // namespace
