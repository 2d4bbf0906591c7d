// replay --gpus N on CPU ranks (threads exchanging through host memory in place of NCCL):
// tensor-parallel heads combined by the all-reduce and decode-context-parallel KV merged
// with merge_attention_states, every checked row of every rank against the CPU reference
// (sinks, sliding windows, verify, fp8, prefix cache, preemption); the report's per-rank
// and scaling figures; and the errors of bad rank flags.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "cli.h"
#include "common/error_text.h"
#include "replay/collective.h"
#include "replay/device_info.h"
#include "replay/ranked_executor.h"
#include "replay/replay.h"
#include "small_replay.h"

namespace pt = pagedmha::tools;
namespace fs = std::filesystem;
using testutil::error_of;

namespace {

pt::ReplayOptions small() { return testutil::small_cpu_replay(); }

// gpt-oss layout (layer 0 sliding with window 127, layer 1 full, sinks), fp8 KV, verify of
// 3 tokens, prefix cache and a pool tight enough to preempt.
pt::ReplayOptions hybrid() {
  pt::ReplayOptions o = small();
  o.model = "gpt-oss-20b";
  o.overrides = {};
  o.overrides.layers = 2, o.overrides.q_heads = 8, o.overrides.kv_heads = 2;
  o.kv_dtype = "fp8";
  o.spec_tokens = 3;
  o.requests = 8;
  o.check_every = 2;
  return o;
}

std::string replay_error(const pt::ReplayOptions& o) {
  return error_of([&] { pt::run_replay(o); });
}

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("pagedmha_multi_rank_test_" + std::to_string(getpid()));
  fs::create_directories(d);
  return d / name;
}

}  // namespace

// Two TP ranks of 4 query heads and 1 KV head: every rank's all-reduced output is the
// whole model's, checked every step; the schedule is the one-device run's (same pages).
TEST(MultiRank, TensorParallelRanksMatchTheReference) {
  pt::ReplayOptions o = small();
  const pt::ReplayResult one = pt::run_replay(o);
  o.gpus = 2, o.overrides.tp = 2;
  const pt::ReplayResult r = pt::run_replay(o);
  EXPECT_TRUE(r.check.ok) << r.check.failure;
  EXPECT_EQ(r.finished, 4);
  EXPECT_EQ(r.check.steps_checked, static_cast<int64_t>(r.steps.size()));
  EXPECT_EQ(r.check.rows_checked, 2 * one.check.rows_checked);  // each row on both ranks
  EXPECT_EQ(r.model.num_q_heads, 8);                             // the whole model
  ASSERT_EQ(r.steps.size(), one.steps.size());
  for (size_t i = 0; i < r.steps.size(); ++i) {
    EXPECT_EQ(r.steps[i].tokens, one.steps[i].tokens) << i;
    ASSERT_EQ(r.steps[i].ranks.size(), 2u);
    EXPECT_GT(r.steps[i].ranks[1].combine_s, 0.0);
  }
  EXPECT_NE(r.executor.find("TP 2 (Hq 4, Hkv 1 per rank)"), std::string::npos) << r.executor;
  const nlohmann::json j = pt::replay_report_json(r);
  ASSERT_TRUE(j["ranks"].is_object());
  EXPECT_EQ(j["ranks"]["mode"], "tp");
  ASSERT_EQ(j["ranks"]["per_rank"].size(), 2u);
  EXPECT_EQ(j["ranks"]["per_rank"][1]["q_head_begin"], 4);
  EXPECT_EQ(j["ranks"]["per_rank"][1]["kv_head_begin"], 1);
  // Each rank reads half the K/V, Q and O of the whole model.
  const double whole = j["summary"]["bytes"].get<double>();
  EXPECT_NEAR(j["ranks"]["per_rank"][0]["bytes"].get<double>(), whole / 2, 1e-9 * whole);
  EXPECT_GE(j["summary"]["attention_plus_combine_time_s"].get<double>(), j["summary"]["attention_time_s"].get<double>());
  EXPECT_TRUE(j["scaling"].is_null());
}

// Four TP ranks over 2 KV heads (each KV head replicated on 2 ranks), with windows,
// sinks, fp8 and verify.
TEST(MultiRank, TensorParallelReplicatedKvHeadsWithSinksAndWindows) {
  pt::ReplayOptions o = hybrid();
  o.gpus = 4, o.overrides.tp = 4;
  const pt::ReplayResult r = pt::run_replay(o);
  EXPECT_TRUE(r.check.ok) << r.check.failure;
  EXPECT_EQ(r.finished, 8);
  ASSERT_EQ(r.shards.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r.shards[i].q_heads, 2);
    EXPECT_EQ(r.shards[i].kv_heads, 1);
    EXPECT_EQ(r.shards[i].kv_begin, i / 2);
  }
  EXPECT_GT(r.sched.accepted_draft_tokens, 0);
}

// DCP over 2 and 3 ranks: full-attention KV dealt by pages, each rank's partial merged with
// the sinks once; the sliding layer held whole on every rank. Every checked row of every
// rank matches the reference, through extend, mixed, decode and verify steps, with the
// prefix cache sharing pages.
TEST(MultiRank, DecodeContextParallelRanksMatchTheReference) {
  for (int ranks : {2, 3}) {
    pt::ReplayOptions o = hybrid();
    o.pages = 150;  // per rank: the sliding group's pool is that, held whole
    o.gpus = ranks, o.dcp = ranks;
    const pt::ReplayResult r = pt::run_replay(o);
    EXPECT_TRUE(r.check.ok) << ranks << " ranks: " << r.check.failure;
    EXPECT_EQ(r.finished, 8);
    EXPECT_GT(r.check.rows_checked, 0);
    EXPECT_GT(r.sched.accepted_draft_tokens, 0);
    EXPECT_GT(r.sched.prefix_hit_tokens, 0);
    const nlohmann::json j = pt::replay_report_json(r);
    EXPECT_EQ(j["ranks"]["mode"], "dcp");
    ASSERT_EQ(j["ranks"]["per_rank"].size(), static_cast<size_t>(ranks));
    // The full-attention group's pages lie in every rank's own pool.
    for (int i = 0; i < ranks; ++i) {
      EXPECT_GT(j["ranks"]["per_rank"][i]["peak_pages"][0].get<int64_t>(), 0) << "rank " << i;
      EXPECT_LE(j["ranks"]["per_rank"][i]["peak_pages"][0].get<int64_t>(), o.pages - 1) << "rank " << i;
    }
  }
}

// Plain decode over 2 DCP ranks, bf16, with a pool of 60 pages per rank tight enough to
// preempt: every step checked.
TEST(MultiRank, DecodeContextParallelLlamaLikeWithPreemption) {
  pt::ReplayOptions o = small();
  o.requests = 6;
  o.pages = 61;
  o.gpus = 2, o.dcp = 2;
  const pt::ReplayResult r = pt::run_replay(o);
  EXPECT_TRUE(r.check.ok) << r.check.failure;
  EXPECT_EQ(r.finished, 6);
  EXPECT_GT(r.sched.preemptions, 0);
  EXPECT_EQ(r.check.steps_checked, static_cast<int64_t>(r.steps.size()));
  // Each rank reads about half the keys (whole pages alternate), all of Q and O.
  const nlohmann::json j = pt::replay_report_json(r);
  const double b0 = j["ranks"]["per_rank"][0]["bytes"].get<double>(), b1 = j["ranks"]["per_rank"][1]["bytes"].get<double>();
  EXPECT_GT(b0, 0.3 * j["summary"]["bytes"].get<double>());
  EXPECT_LT(b1, 0.7 * j["summary"]["bytes"].get<double>());
}

// One rank through the multi-rank path, against a one-device report: the scaling figures
// are the baseline's attention time over the slowest-rank sums, and the schedule is the same.
TEST(MultiRank, ScalingAgainstAOneDeviceBaseline) {
  pt::ReplayOptions o = small();
  o.check_every = 0;
  const fs::path base = scratch("base.json");
  {
    const pt::ReplayResult one = pt::run_replay(o);
    std::ofstream(base) << pt::replay_report_json(one).dump();
  }
  for (bool dcp : {false, true}) {
    pt::ReplayOptions m = o;
    m.gpus = 1;
    if (dcp) m.dcp = 1;
    m.baseline_json = base.string();
    const pt::ReplayResult r = pt::run_replay(m);
    const nlohmann::json j = pt::replay_report_json(r);
    const auto& sc = j["scaling"];
    ASSERT_TRUE(sc.is_object());
    EXPECT_TRUE(sc["same_schedule"].get<bool>());
    const double t1 = sc["baseline_attention_time_s"].get<double>();
    const double tn = j["summary"]["attention_plus_combine_time_s"].get<double>();
    EXPECT_NEAR(sc["efficiency"].get<double>(), t1 / tn, 1e-12 * t1 / tn);
    EXPECT_NEAR(sc["time_ratio"].get<double>(), tn / t1, 1e-12 * tn / t1);
    EXPECT_NE(pt::replay_summary(r).find("scaling efficiency (vs 1 device)"), std::string::npos);
  }
  // A baseline of other options is refused before the run, naming the flag.
  pt::ReplayOptions other = o;
  other.gpus = 2, other.overrides.tp = 2, other.seed = 7;
  other.baseline_json = base.string();
  EXPECT_NE(replay_error(other).find("replay: --baseline-json: expected the same seed as this run (7)"),
            std::string::npos)
      << replay_error(other);
  other.seed = o.seed, other.overrides.layers = 1;
  EXPECT_NE(replay_error(other).find("--baseline-json: expected the same layers as this run (1)"), std::string::npos);
  other.baseline_json = scratch("missing.json").string();
  EXPECT_NE(replay_error(other).find("--baseline-json: expected a readable replay report"), std::string::npos);
  fs::remove_all(base.parent_path());
}

TEST(MultiRank, BadRankFlagsNameTheFlag) {
  pt::ReplayOptions o = small();
  o.gpus = 0;
  EXPECT_EQ(replay_error(o), "replay: --gpus: expected 1..64 ranks (one device each), got 0");
  o.gpus = 2;  // --tp 1 (default), no --dcp
  EXPECT_EQ(replay_error(o), "replay: --tp: expected 2 (= --gpus: one rank per device), or --dcp 2, got 1");
  o.overrides.tp = 3, o.gpus = 3;  // 8 query heads
  EXPECT_EQ(replay_error(o), "replay: --tp: expected >= 1 and dividing the query heads (8), got 3");
  o.overrides.tp = 4, o.gpus = 4, o.overrides.kv_heads = 3, o.overrides.q_heads = 12;
  EXPECT_EQ(replay_error(o), "replay: --tp: expected a divisor or multiple of the KV heads (3), got 4");
  o = small();
  o.gpus = 2, o.dcp = 3;
  EXPECT_EQ(replay_error(o), "replay: --dcp: expected --gpus (2): one rank per device, got 3");
  o.dcp = 2, o.overrides.tp = 2;
  EXPECT_EQ(replay_error(o),
            "replay: --tp: expected 1 with --dcp (tensor and context parallelism together are not implemented), got 2");
  o = small();
  o.dcp = 2;
  EXPECT_EQ(replay_error(o), "replay: --dcp: expected --gpus 2 with it (one device per rank), got --dcp 2 without --gpus");
  o = small();
  o.baseline_json = "x.json";
  EXPECT_EQ(replay_error(o),
            "replay: --baseline-json: expected --gpus (the baseline is compared with a multi-rank run), got no --gpus");
  o = small();
  o.gpus = 1, o.dry_run = true;
  EXPECT_EQ(replay_error(o), "replay: --dry-run: expected no --gpus (a dry run schedules for one device), got --gpus 1");
}

// GPU ranks need NCCL in the build and one visible device per rank; whichever is missing
// here is named (a CPU build has neither NCCL nor devices).
TEST(MultiRank, GpuRanksNeedNcclAndEnoughDevices) {
  const int visible = pt::cuda_device_count();
  const std::string e = error_of([&] { pt::check_rank_devices(visible + 1); });
  if (!pt::built_with_nccl()) {
    EXPECT_NE(e.find("replay: --gpus: expected a build with NCCL for GPU ranks"), std::string::npos) << e;
  } else {
    EXPECT_EQ(e, "replay: --gpus: expected at most the " + std::to_string(visible) +
                     " visible CUDA device(s) (one per rank), got " + std::to_string(visible + 1));
  }
}

// The command line rejects a rank count outside 1..64 as a usage error naming the flag.
TEST(MultiRank, CliRejectsRankCountsOutsideTheRange) {
  for (const char* flag : {"--gpus", "--dcp"})
    for (const char* value : {"0", "-1", "65"}) {
      std::vector<std::string> args = {"pagedmha", "replay", "--device", "cpu", flag, value};
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      testing::internal::CaptureStderr();
      const int rc = pt::run_cli(static_cast<int>(argv.size()), argv.data());
      const std::string err = testing::internal::GetCapturedStderr();
      EXPECT_EQ(rc, 2) << flag << " " << value;
      EXPECT_NE(err.find(std::string(flag) + ": expected 1..64 ranks, got " + value), std::string::npos) << err;
    }
}
