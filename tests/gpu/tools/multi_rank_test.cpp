// replay --gpus on CUDA devices through NCCL: N = 1 on any GPU machine (one rank, the
// NCCL path all the same), N = 2 where two devices are visible. Every checked row of every
// rank against the CPU reference; the schedule is the one-device run's. Skipped when the
// build has no NCCL or no device is visible.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "common/error_text.h"
#include "pagedmha/memory.h"
#include "replay/collective.h"
#include "replay/device_info.h"
#include "replay/replay.h"

namespace pt = pagedmha::tools;

namespace {

// A short llama-like replay (or gpt-oss-like: sliding + full layers, sinks, fp8 KV,
// verify) with every step checked.
pt::ReplayOptions short_replay(bool hybrid) {
  pt::ReplayOptions o;
  o.device = "cuda";
  o.requests = 12;
  o.model = hybrid ? "gpt-oss-20b" : "llama3-8b";
  o.overrides.layers = 2;
  if (hybrid) o.kv_dtype = "fp8", o.spec_tokens = 3;
  o.pages = 4096;
  o.token_budget = 2048;
  o.max_running = 8;
  o.check_every = 1;
  o.check_rows = 2;
  o.progress = false;
  return o;
}

// Why a test of `ranks` ranks cannot run here (empty: it can). GTEST_SKIP must be in the
// TEST body itself: in a helper it returns from the helper only and the test goes on.
std::string missing_nccl_gpus(int ranks) {
  if (!pt::built_with_nccl()) return "this build has no NCCL (PAGEDMHA_WITH_NCCL)";
  if (pt::cuda_device_count() < ranks) return std::to_string(ranks) + " CUDA device(s) needed";
  return "";
}
#define SKIP_WITHOUT_NCCL_GPUS(ranks)                                            \
  if (const std::string why = missing_nccl_gpus(ranks); !why.empty()) GTEST_SKIP() << why

void run_ranks(bool hybrid, int ranks, bool dcp) {
  pt::ReplayOptions o = short_replay(hybrid);
  const pt::ReplayResult one = pt::run_replay(o);
  ASSERT_TRUE(one.check.ok) << one.check.failure;
  o.gpus = ranks;
  if (dcp) o.dcp = ranks;
  else o.overrides.tp = ranks;
  const pt::ReplayResult r = pt::run_replay(o);
  EXPECT_TRUE(r.check.ok) << r.check.failure;
  EXPECT_EQ(r.finished, o.requests);
  EXPECT_EQ(r.check.steps_checked, static_cast<int64_t>(r.steps.size()));
  EXPECT_NE(r.executor.find("NCCL"), std::string::npos) << r.executor;
  if (!dcp || ranks == 1) {
    // TP, and DCP on one rank, keep the one-device pools: the same schedule, each checked
    // row on every rank.
    EXPECT_EQ(r.check.rows_checked, ranks * one.check.rows_checked);
    ASSERT_EQ(r.steps.size(), one.steps.size());
    for (size_t i = 0; i < r.steps.size(); ++i) EXPECT_EQ(r.steps[i].tokens, one.steps[i].tokens) << i;
  }
  const nlohmann::json j = pt::replay_report_json(r);
  ASSERT_EQ(j["ranks"]["per_rank"].size(), static_cast<size_t>(ranks));
  EXPECT_GT(j["summary"]["combine_time_s"].get<double>(), 0.0);
  EXPECT_EQ(j["ranks"]["nccl_nvls_enable"], "0");
}

}  // namespace

TEST(MultiRankGpu, OneRankTensorParallelThroughNccl) {
  SKIP_WITHOUT_NCCL_GPUS(1);
  run_ranks(false, 1, false);
  run_ranks(true, 1, false);
}

TEST(MultiRankGpu, OneRankDecodeContextParallelThroughNccl) {
  SKIP_WITHOUT_NCCL_GPUS(1);
  run_ranks(false, 1, true);
  run_ranks(true, 1, true);
}

TEST(MultiRankGpu, TwoRanksTensorParallel) {
  SKIP_WITHOUT_NCCL_GPUS(2);
  run_ranks(false, 2, false);
  run_ranks(true, 2, false);
}

TEST(MultiRankGpu, TwoRanksDecodeContextParallel) {
  SKIP_WITHOUT_NCCL_GPUS(2);
  run_ranks(false, 2, true);
  run_ranks(true, 2, true);
}

TEST(MultiRankGpu, MoreRanksThanDevicesNamesTheFlag) {
  SKIP_WITHOUT_NCCL_GPUS(1);
  pt::ReplayOptions o = short_replay(false);
  const int n = pt::cuda_device_count() + 1;
  o.gpus = n, o.overrides.tp = n;
  o.model = "custom", o.overrides.q_heads = 8 * n, o.overrides.kv_heads = n, o.overrides.head_dim = 128;
  EXPECT_EQ(testutil::error_of([&] { pt::run_replay(o); }),
            "replay: --gpus: expected at most the " + std::to_string(n - 1) +
                " visible CUDA device(s) (one per rank), got " + std::to_string(n));
}
