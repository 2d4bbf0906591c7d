// The comparison must be able to fail: a reference computed with one semantic detail
// changed (one key fewer, the window one wider, another sink, a 3% scale, no soft-cap)
// or a single corrupted output element must be rejected. This guards the tolerances.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "oracle/test_util.h"

namespace {

using pagedmha::DType;
using namespace ptest;

struct Mutation {
  std::string name;
  std::function<void(AttnProblem&)> apply;
};

TEST(CheckerSensitivity, RejectsNearMisses) {
  AttnCase c;
  c.Hq = 8, c.Hkv = 2, c.D = 128, c.page_size = 16;
  c.q_len_per_req = 2;
  c.kv_lens = {1031, 200, 129};
  c.window_left = 127;
  c.soft_cap = 10.0;
  c.sinks = SinkMode::mixed;
  const AttnProblem p = build(c);
  run_cpu(p);
  ASSERT_TRUE(check_attention(p, p.reference()));

  const std::vector<Mutation> mutations = {
      {"one key fewer", [](AttnProblem& m) { m.c.kv_lens[1] -= 1; }},
      {"window one wider", [](AttnProblem& m) { m.c.window_left += 1; }},
      {"window one narrower", [](AttnProblem& m) { m.c.window_left -= 1; }},
      {"sink 3 -> 2", [](AttnProblem& m) { m.sink_values[2] = 2.0; }},
      {"bmm2 +3%", [](AttnProblem& m) { m.c.v_scale *= 1.03; }},
      {"no soft-cap", [](AttnProblem& m) { m.c.soft_cap = 0.0; }},
      {"non-causal", [](AttnProblem& m) { m.c.causal = false, m.c.window_left = -1; }},
  };
  for (const auto& mu : mutations) {
    AttnProblem m = p;
    mu.apply(m);
    EXPECT_FALSE(check_attention(p, m.reference())) << mu.name;
  }
  // One output element off by 1/32 of its row's largest value.
  AttnProblem bad = p;
  bad.out.storage = std::make_shared<std::vector<uint8_t>>(*p.out.storage);
  double row_max = 0;
  for (int d = 0; d < c.D; ++d) row_max = std::max(row_max, std::fabs(p.out.get({3, 5, d})));
  bad.out.set({3, 5, 17}, bad.out.get({3, 5, 17}) + row_max / 32);
  EXPECT_FALSE(check_attention(bad, p.reference()));
  // A NaN anywhere, and a write outside the view, never pass.
  AttnProblem nan = p;
  nan.out.storage = std::make_shared<std::vector<uint8_t>>(*p.out.storage);
  nan.out.set({0, 0, 0}, std::numeric_limits<double>::quiet_NaN());
  EXPECT_FALSE(check_attention(nan, p.reference()));
}

TEST(CheckerSensitivity, RejectsStrayWritesOutsideTheOutputView) {
  AttnCase c;
  c.Hq = 4, c.Hkv = 2, c.D = 64;
  c.kv_lens = {10, 20};
  c.out_layout = RowLayout::fused;  // [rows, Hq (+1 pad head), D]
  const AttnProblem p = build(c);
  run_cpu(p);
  ASSERT_TRUE(check_attention(p, p.reference()));
  AttnProblem stray = p;
  stray.out.storage = std::make_shared<std::vector<uint8_t>>(*p.out.storage);
  HostTensor pad = stray.out;
  pad.shape = {2, 5, 64};
  pad.set({1, 4, 0}, 0.0);  // the padding head of row 1
  EXPECT_FALSE(check_attention(stray, p.reference()));
}

}  // namespace
