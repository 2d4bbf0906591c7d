// Small end-to-end CPU replays through the backend with every step checked against the
// reference ops (prefix cache, sliding-window group, sinks, verify, fp8, preemption).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "check/check.h"
#include "replay/kv_pool.h"
#include "replay/replay.h"
#include "small_replay.h"

namespace pt = pagedmha::tools;

namespace {

pt::ReplayOptions small() { return testutil::small_cpu_replay(); }

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
  // Each kept step's extend rows: as many as extend_rows, their queries the step's tokens
  // less one per decode row (no speculative verify here).
  ASSERT_EQ(st["extend"].size(), st["step"].size());
  for (size_t i = 0; i < st["step"].size(); ++i) {
    ASSERT_EQ(st["extend"][i].size(), st["extend_rows"][i].get<size_t>()) << i;
    int64_t q = 0;
    for (const auto& row : st["extend"][i]) {
      q += row[0].get<int64_t>();
      EXPECT_GE(row[1].get<int64_t>(), row[0].get<int64_t>()) << i;  // seq_len includes the queries
    }
    EXPECT_EQ(q, st["tokens"][i].get<int64_t>() - st["decode_rows"][i].get<int64_t>()) << i;
  }
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

// The table names why a row does not apply instead of a bare "-", and splits peak pages
// into live ones (running requests) and those only the prefix cache holds.
TEST(Replay, TableMarksRowsThatDoNotApplyAndSplitsPeakPages) {
  pt::ReplayOptions o = small();
  o.check_every = 0;
  const pt::ReplayResult r = pt::run_replay(o);
  const std::string t = pt::replay_summary(r);
  auto row = [&](const std::string& label) {
    const std::size_t at = t.find("  " + label);
    if (at == std::string::npos) return std::string("missing");
    const std::size_t end = t.find('\n', at);
    std::string v = t.substr(at + 2 + label.size(), end - at - 2 - label.size());
    return v.substr(v.find_first_not_of(' '));
  };
  const std::string no_ceiling = "n/a on CPU (no roofline ceilings: needs both --ceiling-read-tbps and --ceiling-tflops)";
  EXPECT_EQ(row("ratio to read ceiling (decode)"), no_ceiling) << t;
  EXPECT_EQ(row("ratio to TFLOP/s ceiling (extend)"), no_ceiling) << t;
  EXPECT_EQ(row("roofline floor (decode / extend)"), no_ceiling) << t;
  EXPECT_EQ(row("roofline ratio (whole trace)"), no_ceiling) << t;
  EXPECT_EQ(row("graph capture (one-off)"), "n/a on CPU (CUDA graphs run on the GPU only)") << t;
  EXPECT_EQ(row("checks (steps / rows, max rel err)"), "n/a (--check-every 0)") << t;
  EXPECT_EQ(t.find(" - "), std::string::npos) << t;
  EXPECT_EQ(t.find(" -\n"), std::string::npos) << t;
  const std::string name = r.model.groups[0].name + " ";
  EXPECT_EQ(row("peak pages live (of 511)"), name + std::to_string(r.sched.peak_live_pages[0])) << t;
  EXPECT_EQ(row("peak pages, prefix cache only"), name + std::to_string(r.sched.peak_prefix_cache_pages[0])) << t;
  EXPECT_EQ(row("peak pages in use (live + cache)"), name + std::to_string(r.sched.peak_pages[0])) << t;

  // The report adds the split (older readers keep peak_pages and pages_in_use).
  const nlohmann::json j = pt::replay_report_json(r);
  const auto& s = j["summary"];
  EXPECT_EQ(s["peak_pages"], r.sched.peak_pages);
  EXPECT_EQ(s["peak_live_pages"], r.sched.peak_live_pages);
  EXPECT_EQ(s["peak_prefix_cache_pages"], r.sched.peak_prefix_cache_pages);
  const auto& st = j["steps"];
  ASSERT_EQ(st["live_pages"].size(), r.model.groups.size());
  ASSERT_EQ(st["live_pages"][0].size(), st["step"].size());
  int64_t live_peak = 0;
  for (size_t i = 0; i < st["step"].size(); ++i) {
    EXPECT_LE(st["live_pages"][0][i].get<int64_t>(), st["pages_in_use"][0][i].get<int64_t>());
    live_peak = std::max(live_peak, st["live_pages"][0][i].get<int64_t>());
  }
  EXPECT_LE(live_peak, r.sched.peak_live_pages[0]);
  EXPECT_GE(r.sched.peak_pages[0], r.sched.peak_live_pages[0]);
}

// A truncated run's token row is the requests' totals, labelled so: per-token figures
// divide by what was produced.
TEST(Replay, TruncatedRunLabelsTheRequestsTokenTotals) {
  pt::ReplayOptions o = small();
  o.check_every = 0;
  o.max_steps = 1;
  const pt::ReplayResult r = pt::run_replay(o);
  ASSERT_TRUE(r.truncated);
  const std::string t = pt::replay_summary(r);
  EXPECT_NE(t.find("  prompt / output tokens (all requests) " + std::to_string(r.prompt_tokens) + " / "),
            std::string::npos) << t;
}

// Dry runs and steps of one kind say so.
TEST(Replay, DryRunTableSaysNothingIsTimed) {
  pt::ReplayOptions o = small();
  o.dry_run = true;
  o.check_every = -1;
  const std::string t = pt::replay_summary(pt::run_replay(o));
  EXPECT_NE(t.find("attention time total              n/a (dry run: nothing is timed)"), std::string::npos) << t;
  EXPECT_NE(t.find("checks (steps / rows, max rel err) n/a (dry run: no attention to check)"), std::string::npos) << t;
  // A dry run plans the GPU run: no "on CPU" reason for the graph capture either.
  EXPECT_NE(t.find("graph capture (one-off)           n/a (dry run: nothing is timed)"), std::string::npos) << t;
  EXPECT_EQ(t.find(" - "), std::string::npos) << t;
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

// A crafted 3-line Mooncake trace whose third request's first hash id collides (64-bit
// chain key) with block 1 of the first request's prompt. Exact keys: no prefix hit at all
// (no two requests share ids), and every step's rows check against the reference.
TEST(Replay, CraftedPrefixHashCollisionIsAMissAndChecksPass) {
  using PC = pt::PrefixCache;
  const int64_t a = 101, b = 202;
  const auto y = static_cast<int64_t>(PC::chain_key(0, a) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(b));
  ASSERT_EQ(PC::chain_key(0, y), PC::chain_key(PC::chain_key(0, a), b)) << "chain_key changed: rebuild the collision";
  const auto path = std::filesystem::temp_directory_path() / ("pagedmha_collide_" + std::to_string(getpid()) + ".jsonl");
  std::ofstream(path) << R"({"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [101, 202, 303]})" "\n"
                      << R"({"timestamp": 1, "input_length": 300, "output_length": 4, "hash_ids": [404]})" "\n"
                      << R"({"timestamp": 2, "input_length": 600, "output_length": 4, "hash_ids": [)" << y << ", 505]}\n";
  pt::ReplayOptions o = small();
  o.trace = path.string();
  o.requests = -1;
  o.max_running = 1;  // request 2 starts once request 0's blocks are cached
  o.check_rows = 4;
  const pt::ReplayResult r = pt::run_replay(o);
  std::filesystem::remove(path);
  EXPECT_EQ(r.finished, 3);
  EXPECT_EQ(r.sched.prefix_hit_tokens, 0);
  EXPECT_TRUE(r.check.ok) << r.check.failure;
  EXPECT_EQ(r.check.steps_checked, static_cast<int64_t>(r.steps.size()));
}

// 2147483647 for --token-budget / --max-running means "no limit" (it used to size buffers
// for 2^31 tokens and rows): everything is admitted in the first step.
TEST(Replay, UnlimitedTokenBudgetAndMaxRunningAdmitEverythingAtOnce) {
  pt::ReplayOptions o = small();
  o.token_budget = INT_MAX;
  o.max_running = INT_MAX;
  o.check_every = 2;
  const pt::ReplayResult r = pt::run_replay(o);
  EXPECT_TRUE(r.check.ok) << r.check.failure;
  EXPECT_EQ(r.finished, 4);
  ASSERT_FALSE(r.steps.empty());
  EXPECT_EQ(r.steps[0].extend_rows, 4);
  EXPECT_EQ(r.steps[0].tokens, r.prompt_tokens);
}

// A window longer than every sequence is full attention: same steps and work, checks pass.
TEST(Replay, HugeWindowMatchesFullAttention) {
  pt::ReplayOptions o = small();
  o.check_every = 3;
  const pt::ReplayResult full = pt::run_replay(o);
  o.overrides.window = INT_MAX;
  const pt::ReplayResult huge = pt::run_replay(o);
  EXPECT_TRUE(huge.check.ok) << huge.check.failure;
  ASSERT_EQ(huge.steps.size(), full.steps.size());
  for (size_t i = 0; i < full.steps.size(); ++i) {
    EXPECT_EQ(huge.steps[i].tokens, full.steps[i].tokens) << i;
    EXPECT_EQ(huge.steps[i].flops, full.steps[i].flops) << i;
  }
}

// The prefix-cache hit rate where no prompt can hit says why (it used to be 0.0000 for an
// Azure trace, which has no prefix ids): the table row and the report's null with the reason.
TEST(Replay, PrefixHitRateSaysWhyItDoesNotApply) {
  const std::string dir = std::filesystem::temp_directory_path().string() + "/pagedmha_prefix_" +
                          std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/azure.csv") << "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    << "2023-11-16 18:15:46.5,700,3\n2023-11-16 18:15:47.5,1100,2\n";
  std::ofstream(dir + "/mooncake.jsonl")
      << R"({"timestamp": 0, "input_length": 1100, "output_length": 2, "hash_ids": [1, 2, 3]})" "\n"
      << R"({"timestamp": 1, "input_length": 1100, "output_length": 2, "hash_ids": [1, 2, 4]})" "\n";
  auto run = [&](const std::string& trace, int page_size, bool prefix_cache) {
    pt::ReplayOptions o = small();
    o.trace = dir + "/" + trace;
    o.requests = -1;
    o.dry_run = true;
    o.check_every = -1;
    o.max_running = 1;  // the second request starts once the first one's blocks are cached
    o.page_size = page_size;
    o.prefix_cache = prefix_cache;
    return pt::run_replay(o);
  };
  const auto row = [](const pt::ReplayResult& r) {
    const std::string t = pt::replay_summary(r), label = "  prefix-cache hit rate";
    const size_t at = t.find(label);
    if (at == std::string::npos) return std::string("missing");
    const std::string v = t.substr(at + label.size(), t.find('\n', at) - at - label.size());
    return v.substr(v.find_first_not_of(' '));
  };
  const struct {
    const char* trace;
    int page_size;
    bool prefix_cache;
    const char* why;
  } cases[] = {
      {"azure.csv", 16, true, "trace has no prefix ids"},
      {"mooncake.jsonl", 48, true, "--page-size 48 does not divide the trace's 512-token prefix blocks"},
      {"mooncake.jsonl", 16, false, "--no-prefix-cache"},
  };
  for (const auto& c : cases) {
    const pt::ReplayResult r = run(c.trace, c.page_size, c.prefix_cache);
    EXPECT_EQ(row(r), std::string("n/a (") + c.why + ")") << c.trace;
    const nlohmann::json s = pt::replay_report_json(r)["summary"];
    EXPECT_TRUE(s["prefix_hit_rate"].is_null()) << c.trace;
    EXPECT_EQ(s["prefix_hit_rate_na"], c.why) << c.trace;
    EXPECT_EQ(s["prefix_hit_tokens"], 0) << c.trace;
  }
  // Where the cache serves the trace: the second prompt's two leading blocks of 2 (1024 of
  // its 1100 tokens, the first prompt's 1100 all missing).
  const pt::ReplayResult hit = run("mooncake.jsonl", 16, true);
  EXPECT_EQ(hit.sched.prefix_hit_tokens, 1024);
  EXPECT_EQ(row(hit), "0.4655") << pt::replay_summary(hit);
  const nlohmann::json s = pt::replay_report_json(hit)["summary"];
  EXPECT_DOUBLE_EQ(s["prefix_hit_rate"].get<double>(), 1024.0 / 2200.0);
  EXPECT_TRUE(s["prefix_hit_rate_na"].is_null());
  std::filesystem::remove_all(dir);
}
