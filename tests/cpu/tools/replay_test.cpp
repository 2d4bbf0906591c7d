// Small end-to-end CPU replays through the backend with every step checked against the
// reference ops (prefix cache, sliding-window group, sinks, verify, fp8, preemption).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "check/check.h"
#include "replay/replay.h"

namespace pt = pagedmha::tools;

namespace {

pt::ReplayOptions small() {
  pt::ReplayOptions o;
  o.device = "cpu";
  o.requests = 4;
  o.model = "custom";
  o.overrides.layers = 2, o.overrides.q_heads = 8, o.overrides.kv_heads = 2, o.overrides.head_dim = 64;
  o.pages = 512;
  o.token_budget = 1024;
  o.max_running = 4;
  o.check_every = 1;
  o.check_rows = 3;
  o.progress = false;
  return o;
}

}  // namespace

TEST(Replay, LlamaLikeWithPrefixCacheChecksEveryStep) {
  pt::ReplayOptions o = small();
  o.requests = 6;
  const pt::ReplayResult r = pt::run_replay(o);
  EXPECT_TRUE(r.check.ok) << r.check.failure;
  EXPECT_EQ(r.finished, 6);
  EXPECT_EQ(r.check.steps_checked, static_cast<int64_t>(r.steps.size()));
  EXPECT_GT(r.sched.prefix_hit_tokens, 0);
  const nlohmann::json j = pt::replay_report_json(r);
  EXPECT_EQ(j["summary"]["finished"], 6);
  EXPECT_EQ(j["steps"].size(), r.steps.size());
  EXPECT_GT(j["summary"]["achieved_tflops"].get<double>(), 0.0);
}

TEST(Replay, HybridWindowSinksVerifyFp8WithPreemption) {
  pt::ReplayOptions o = small();
  o.model = "gpt-oss-20b";
  o.overrides = {};
  o.overrides.layers = 2, o.overrides.q_heads = 8, o.overrides.kv_heads = 2;  // one sliding, one full layer
  o.kv_dtype = "fp8";
  o.spec_tokens = 3;
  o.pages = 150;  // tight: forces preemption
  o.check_every = 3;
  o.requests = 8;
  const pt::ReplayResult r = pt::run_replay(o);
  EXPECT_TRUE(r.check.ok) << r.check.failure;
  EXPECT_EQ(r.finished, 8);
  EXPECT_EQ(r.model.groups.size(), 2u);
  EXPECT_GT(r.sched.preemptions, 0);
  EXPECT_GT(r.sched.accepted_draft_tokens, 0);
}

TEST(Check, EveryOpPassesOnTheCpu) {
  pt::CheckOptions o;
  o.device = "cpu";
  const pt::CheckSummary s = pt::run_checks(o);
  EXPECT_GT(s.cases, 10);
  EXPECT_EQ(s.failures, 0);
}
