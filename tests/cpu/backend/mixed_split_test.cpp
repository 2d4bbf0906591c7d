// Extend / mixed steps whose trailing rows have one query each run those rows through
// batch_decode and the leading rows through batch_prefill. Checked against the fp64
// oracle and against one batch_prefill over every row (the route before the split).
#include <gtest/gtest.h>

#include <algorithm>

#include "backend_fixture.h"
#include "pagedmha/ops.h"

namespace btest {
namespace {

using V = std::vector<int32_t>;
constexpr int Hq = 8, Hkv = 2, D = 64, P = 4, C = 64, kCols = C / P;

struct Case {
  const char* name;
  ForwardMode mode;
  V ext, prefix;
};

// Each cache group maps its rows through its own permutation of the pool's pages 1..n.
Ints group_table(int bs, bool reversed) {
  const int n = bs * kCols;  // 13 is coprime with n for every bs below 13
  V t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = 1 + (reversed ? n - 1 - i : (i * 13) % n);
  return Ints(t, bs, kCols);
}

void run_case(const Case& c) {
  SCOPED_TRACE(c.name);
  const int bs = static_cast<int>(c.ext.size());
  const int num_pages = 1 + bs * kCols;
  std::mt19937 rng(77);
  Layer full(Hq, Hkv, D, P, num_pages, DType::bf16, rng);
  Layer sliding(Hq, Hkv, D, P, num_pages, DType::bf16, rng);
  full.spec.group_id = "full_attention";
  full.spec.logits_soft_cap = 8.0f;
  sliding.spec.group_id = "sliding_attention";
  sliding.spec.window_left = 6;
  std::vector<float> sinks_full(Hq), sinks_slide(Hq);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  for (int h = 0; h < Hq; ++h) sinks_full[h] = nd(rng), sinks_slide[h] = nd(rng);
  full.spec.sinks = TensorView(sinks_full.data(), DType::fp32, Device::cpu(), {Hq});
  sliding.spec.sinks = TensorView(sinks_slide.data(), DType::fp32, Device::cpu(), {Hq});

  V seq_v(bs), cu_v(bs + 1, 0);
  for (int r = 0; r < bs; ++r) {
    seq_v[r] = c.prefix[r] + c.ext[r];
    cu_v[r + 1] = cu_v[r] + c.ext[r];
  }
  const int T = cu_v[bs];
  Ints seq(seq_v), ext(c.ext), pre(c.prefix), rpi(V(bs, 0)), cu(cu_v);
  Ints tfull = group_table(bs, true), tslide = group_table(bs, false);

  BackendConfig cfg;
  cfg.page_size = P;
  cfg.context_len = C;
  cfg.max_bs = 8;
  cfg.num_q_heads = Hq, cfg.num_kv_heads = Hkv, cfg.head_dim = D;
  MhaBackend be(cfg);
  ForwardBatch fb;
  fb.forward_mode = c.mode;
  fb.batch_size = bs;
  fb.seq_lens = seq.view();
  fb.req_pool_indices = rpi.view();
  fb.extend_seq_lens_cpu = ext.view();
  fb.extend_prefix_lens_cpu = pre.view();
  fb.group_tables = {{"full_attention", tfull.view()}, {"sliding_attention", tslide.view()}};
  be.init_forward_metadata(fb);
  int lead = bs;
  while (lead > 0 && c.ext[lead - 1] == 1) --lead;
  ASSERT_EQ(be.prefill_metadata()->decode_rows, bs - lead);
  ASSERT_EQ(be.prefill_metadata()->prefill_max_seq_len_q,
            lead > 0 ? *std::max_element(c.ext.begin(), c.ext.begin() + lead) : 0);

  for (Layer* layer : {&full, &sliding}) {
    const Ints& table = layer == &full ? tfull : tslide;
    Floats q(DType::bf16, {T, Hq * D}), k(DType::bf16, {T, Hkv * D}), v(DType::bf16, {T, Hkv * D}),
        out(DType::bf16, {T, Hq * D}), single(DType::bf16, {T, Hq * D});
    q.randomize(rng), k.randomize(rng), v.randomize(rng);
    be.forward_extend(q.view(), k.view(), v.view(), layer->spec, layer->kv(), {}, bs, out.view());

    for (int r = 0; r < bs; ++r) {
      const int32_t* row = table.v.data() + static_cast<size_t>(r) * kCols;
      for (int p = c.prefix[r]; p < seq_v[r]; ++p) {  // the step's K landed at the group's slots
        const int64_t slot = oracle::slot_of(row, p, P), t = cu_v[r] + p - c.prefix[r];
        for (int e = 0; e < Hkv * D; ++e) ASSERT_EQ(layer->k.get(slot * Hkv * D + e), k.get(t * Hkv * D + e));
      }
      EXPECT_TRUE(close(rows_of(out, cu_v[r], c.ext[r]),
                        layer->reference(rows_of(q, cu_v[r], c.ext[r]), c.ext[r], seq_v[r], row)))
          << "row " << r;
    }

    // The pre-split route: one batch_prefill over every row, same params.
    AttentionParams params;
    params.bmm1_scale = layer->spec.scaling;
    params.window_left = layer->spec.window_left;
    params.logits_soft_cap = layer->spec.logits_soft_cap;
    params.sinks = layer->spec.sinks;
    const int max_q = *std::max_element(c.ext.begin(), c.ext.end());
    Ints tcopy = table;
    batch_prefill(TensorView(q.bytes.data(), DType::bf16, Device::cpu(), {T, Hq, D}), layer->k.view(), layer->v.view(), tcopy.view(), seq.view(), cu.view(), P,
                  max_q, TensorView(single.bytes.data(), DType::bf16, Device::cpu(), {T, Hq, D}), params);
    // The CPU decode and prefill paths share one per-query kernel: bitwise equal.
    for (int64_t i = 0; i < out.numel(); ++i) {
      ASSERT_TRUE(std::isfinite(out.get(i))) << "element " << i;
      ASSERT_EQ(out.get(i), single.get(i)) << "element " << i;
    }
  }
}

TEST(BackendMixedSplit, MixedExtendRowsThenDecodeRows) {
  // 2 extend rows after prefixes, then 5 decode rows (one with no prefix, one past the window).
  run_case({"mixed", ForwardMode::mixed, {9, 5, 1, 1, 1, 1, 1}, {7, 3, 20, 0, 33, 12, 5}});
}

TEST(BackendMixedSplit, LengthOneRowInsideTheExtendRowsStaysInPrefill) {
  // Only the trailing run of 1-query rows splits off; row 1 goes with the prefill rows.
  run_case({"interior", ForwardMode::extend, {4, 1, 6, 1, 1}, {2, 9, 0, 30, 1}});
}

TEST(BackendMixedSplit, AllRowsOneQueryUseDecodeOnly) {
  run_case({"all-decode", ForwardMode::draft_extend, {1, 1, 1}, {10, 0, 41}});
}

TEST(BackendMixedSplit, NoOneQueryRowsUsePrefillOnly) {
  run_case({"all-prefill", ForwardMode::extend, {3, 7, 2}, {5, 0, 19}});
}

TEST(BackendMixedSplit, ExtendRowsOfZeroQueriesBeforeDecodeRows) {
  // Leading rows with no new tokens: nothing for batch_prefill; the decode rows still run.
  run_case({"empty-lead", ForwardMode::mixed, {0, 0, 1, 1, 1}, {6, 11, 20, 3, 44}});
}

}  // namespace
}  // namespace btest
