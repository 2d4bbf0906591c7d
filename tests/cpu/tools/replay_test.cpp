// Small end-to-end CPU replays through the backend with every step checked against the
// reference ops (prefix cache, sliding-window group, sinks, verify, fp8, preemption).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>

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
  EXPECT_EQ(j["steps"]["step"].size(), r.steps.size());  // fewer steps than json_steps: all kept
  EXPECT_GT(j["summary"]["achieved_tflops"].get<double>(), 0.0);
  EXPECT_TRUE(j["summary"]["ratio_roofline"].is_null());  // no ceilings on the CPU by default
}

// Per-step records are strided to json_steps (the last step kept); the roofline ratio is
// the sum of per-step floors max(bytes / read, flops / compute) over the attention time.
TEST(Replay, ReportStridesStepsAndStatesTheRooflineRatio) {
  pt::ReplayOptions o = small();
  o.check_every = 0;
  o.json_steps = 5;
  o.ceiling_read_tbps = 0.05, o.ceiling_tflops = 0.2;
  const pt::ReplayResult r = pt::run_replay(o);
  ASSERT_GT(r.steps.size(), 10u);
  const nlohmann::json j = pt::replay_report_json(r);
  const auto& st = j["steps"];
  const int64_t stride = st["stride"];
  EXPECT_EQ(stride, (static_cast<int64_t>(r.steps.size()) + 4) / 5);
  EXPECT_LE(st["step"].size(), 6u);
  EXPECT_EQ(st["step"].back().get<int64_t>(), r.steps.back().step);
  EXPECT_EQ(st["pages_in_use"].size(), r.model.groups.size());
  EXPECT_EQ(st["pages_in_use"][0].size(), st["step"].size());
  double floor = 0, att = 0;
  for (const pt::StepRecord& s : r.steps) {
    floor += std::max(s.bytes / 0.05e12, s.flops / 0.2e12);
    att += s.attention_s;
  }
  EXPECT_NEAR(j["summary"]["roofline_floor_s"].get<double>(), floor, 1e-9 * floor);
  EXPECT_NEAR(j["summary"]["ratio_roofline"].get<double>(), floor / att, 1e-9 * floor / att);
  EXPECT_GT(j["summary"]["backend_metadata_host_time_per_step_us"].get<double>(), 0.0);
  EXPECT_GT(j["summary"]["tool_scheduler_host_time_per_step_us"].get<double>(), 0.0);
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

// A dry run schedules exactly the steps a real run does (the scheduler never looks at the
// executor), runs no attention and no checks, and states the floor with the H200 ceilings.
TEST(Replay, DryRunPlansTheSameStepsWithoutAttention) {
  pt::ReplayOptions o = small();
  o.check_every = 0;
  const pt::ReplayResult real = pt::run_replay(o);
  o.dry_run = true;
  o.check_every = 1;  // ignored by a dry run
  const pt::ReplayResult dry = pt::run_replay(o);
  ASSERT_EQ(dry.steps.size(), real.steps.size());
  EXPECT_EQ(dry.finished, real.finished);
  EXPECT_EQ(dry.check.steps_checked, 0);
  double floor = 0;
  for (size_t i = 0; i < dry.steps.size(); ++i) {
    EXPECT_EQ(dry.steps[i].tokens, real.steps[i].tokens) << i;
    EXPECT_EQ(dry.steps[i].bytes, real.steps[i].bytes) << i;
    EXPECT_EQ(dry.steps[i].flops, real.steps[i].flops) << i;
    EXPECT_EQ(dry.steps[i].attention_s, 0.0);
    floor += std::max(dry.steps[i].bytes / 4.6e12, dry.steps[i].flops / 760e12);
  }
  const nlohmann::json j = pt::replay_report_json(dry);
  EXPECT_NEAR(j["summary"]["roofline_floor_s"].get<double>(), floor, 1e-9 * floor);
  EXPECT_EQ(j["executor"], "none (--dry-run)");
  EXPECT_TRUE(j["options"]["dry_run"].get<bool>());
  // Nothing was timed: the measured figures are null, not zero.
  for (const char* k : {"ratio_roofline", "achieved_tbps", "achieved_tflops", "decode_steps_tbps",
                        "extend_steps_tflops", "generated_tokens_per_s", "attention_time_s",
                        "attention_time_per_step_us", "backend_metadata_host_time_per_step_us"})
    EXPECT_TRUE(j["summary"][k].is_null()) << k;
  EXPECT_NEAR(j["summary"]["roofline_floor_decode_steps_s"].get<double>() +
                  j["summary"]["roofline_floor_extend_steps_s"].get<double>(),
              floor, 1e-9 * floor);
}
