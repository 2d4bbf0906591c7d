// Command-line regressions: --time-limit truncation, argument validation (bench repeats /
// iters / scale / out-dir, replay requests / spec-tokens / kv-memory) and plot's
// shell-free spawning.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench.h"
#include "cli.h"
#include "pagedmha/error.h"
#include "replay/replay.h"

namespace pt = pagedmha::tools;
namespace fs = std::filesystem;

namespace {

int cli(std::vector<std::string> args) {
  args.insert(args.begin(), "pagedmha");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return pt::run_cli(static_cast<int>(argv.size()), argv.data());
}

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("pagedmha_cli_test_" + std::to_string(getpid()));
  fs::create_directories(d);
  return d / name;
}

pt::ReplayOptions tiny() {
  pt::ReplayOptions o;
  o.device = "cpu";
  o.requests = 6;
  o.model = "custom";
  o.overrides.layers = 1, o.overrides.q_heads = 2, o.overrides.kv_heads = 1, o.overrides.head_dim = 64;
  o.pages = 512;
  o.token_budget = 256;
  o.max_running = 4;
  o.check_every = 0;
  o.progress = false;
  return o;
}

// The library's error text for these options ("no error" when the replay runs).
std::string message(const pt::ReplayOptions& o) {
  try {
    pt::run_replay(o);
  } catch (const pagedmha::Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

// A limit reached before the first step: no step runs, nothing finishes, and the report
// still comes out complete and marked truncated.
TEST(ReplayTimeLimit, ZeroLimitStopsBeforeAnyStepAndMarksTheReport) {
  pt::ReplayOptions o = tiny();
  o.time_limit_s = 0.0;
  const pt::ReplayResult r = pt::run_replay(o);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(r.steps.size(), 0u);
  EXPECT_EQ(r.finished, 0);
  EXPECT_EQ(r.requests, 6);
  const nlohmann::json j = pt::replay_report_json(r);
  EXPECT_TRUE(j["truncated"].get<bool>());
  EXPECT_TRUE(j["summary"]["truncated"].get<bool>());
  EXPECT_EQ(j["summary"]["finished"], 0);
  EXPECT_EQ(j["options"]["time_limit_s"].get<double>(), 0.0);
  EXPECT_NE(pt::replay_summary(r).find("TRUNCATED"), std::string::npos);
}

TEST(ReplayTimeLimit, GenerousLimitRunsToCompletionUntruncated) {
  pt::ReplayOptions o = tiny();
  o.time_limit_s = 3600.0;
  const pt::ReplayResult r = pt::run_replay(o);
  EXPECT_FALSE(r.truncated);
  EXPECT_EQ(r.finished, 6);
  EXPECT_FALSE(pt::replay_report_json(r)["truncated"].get<bool>());
}

TEST(ReplayTimeLimit, MaxStepsAlsoTruncates) {
  pt::ReplayOptions o = tiny();
  o.max_steps = 2;
  const pt::ReplayResult r = pt::run_replay(o);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(r.steps.size(), 2u);
  EXPECT_LT(r.finished, 6);
}

// The CLI writes --json (and exits 0) for a truncated run.
TEST(ReplayTimeLimit, CliWritesTheJsonOfATruncatedRun) {
  const fs::path json = scratch("truncated.json");
  ASSERT_EQ(cli({"replay", "--device", "cpu", "--model", "custom", "--layers", "1", "--q-heads", "1", "--kv-heads",
                 "1", "--head-dim", "64", "--requests", "4", "--check-every", "0", "--time-limit", "0", "--no-progress",
                 "--quiet", "--json", json.string()}),
            0);
  std::ifstream f(json);
  ASSERT_TRUE(f);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_TRUE(j["truncated"].get<bool>());
  EXPECT_EQ(j["summary"]["requests"], 4);
  EXPECT_EQ(j["summary"]["finished"], 0);
}

TEST(ReplayCli, RejectsOutOfRangeArgumentsAsUsageErrors) {
  EXPECT_EQ(cli({"replay", "--device", "cpu", "--requests", "2000000000"}), 2);
  EXPECT_EQ(cli({"replay", "--device", "cpu", "--requests", "0"}), 2);
  EXPECT_EQ(cli({"replay", "--device", "cpu", "--requests", "-3"}), 2);
  EXPECT_EQ(cli({"replay", "--device", "cpu", "--requests=-3"}), 2);
  EXPECT_EQ(cli({"replay", "--device", "cpu", "--spec-tokens", "9"}), 2);
  EXPECT_EQ(cli({"replay", "--device", "cpu", "--spec-tokens", "0"}), 2);
  EXPECT_EQ(cli({"replay", "--device", "cpu", "--kv-memory", "-1"}), 2);
  EXPECT_EQ(cli({"replay", "--device", "cpu", "--kv-memory", "0"}), 2);
  EXPECT_EQ(cli({"replay", "--device", "cpu", "--time-limit", "-5"}), 2);
}

// The library validates the same bounds for callers that bypass the CLI.
TEST(ReplayCli, LibraryRejectsTheSameValuesNamingTheArgument) {
  pt::ReplayOptions o = tiny();
  o.trace.clear();
  o.requests = 2'000'000'000;
  EXPECT_NE(message(o).find("--requests"), std::string::npos);
  o = tiny();
  o.requests = -3;  // only -1 means "the default"
  EXPECT_NE(message(o).find("--requests"), std::string::npos);
  o = tiny();
  o.spec_tokens = 9;
  EXPECT_NE(message(o).find("--spec-tokens"), std::string::npos);
  o = tiny();
  o.pages = -1;
  o.kv_memory_gb = -2.0;
  EXPECT_NE(message(o).find("--kv-memory"), std::string::npos);
}

// -1 means "the device default"; any other out-of-range value is an error naming its
// argument and value, never a silent default, an overflow or another argument's name.
TEST(ReplayCli, NegativeHugeAndNonFiniteValuesNameTheirArgument) {
  struct Case {
    const char* arg;
    void (*set)(pt::ReplayOptions&);
    const char* value;
  };
  const Case cases[] = {
      {"--pages", [](pt::ReplayOptions& o) { o.pages = -5; }, "-5"},
      {"--token-budget", [](pt::ReplayOptions& o) { o.token_budget = -7; }, "-7"},
      {"--max-running", [](pt::ReplayOptions& o) { o.max_running = -3; }, "-3"},
      {"--check-every", [](pt::ReplayOptions& o) { o.check_every = -2; }, "-2"},
      {"--max-steps", [](pt::ReplayOptions& o) { o.max_steps = -7; }, "-7"},
      {"--page-size", [](pt::ReplayOptions& o) { o.page_size = 0; }, "0"},
      {"--ceiling-read-tbps", [](pt::ReplayOptions& o) { o.ceiling_read_tbps = -5.0; }, "-5"},
      {"--ceiling-tflops", [](pt::ReplayOptions& o) { o.ceiling_tflops = std::nan(""); }, "nan"},
      {"--kv-memory", [](pt::ReplayOptions& o) { o.pages = -1, o.kv_memory_gb = 1e300; }, "1e+300"},
      {"--kv-memory", [](pt::ReplayOptions& o) { o.pages = -1, o.kv_memory_gb = 1e12; }, "1e+12"},
  };
  for (const Case& c : cases) {
    pt::ReplayOptions o = tiny();
    c.set(o);
    const std::string m = message(o);
    EXPECT_NE(m.find(c.arg), std::string::npos) << c.arg << ": " << m;
    EXPECT_NE(m.find(c.value), std::string::npos) << c.arg << ": " << m;
  }
}

// An unwritable --json fails before the replay runs (not after a long GPU run).
TEST(ReplayCli, UnwritableJsonFailsUpFront) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(cli({"replay", "--device", "cpu", "--no-progress", "--quiet", "--json", "/nonexistent-dir/r.json"}), 1);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  const fs::path fresh = scratch("fresh.json");
  fs::remove(fresh);
  pt::ReplayOptions o = tiny();
  o.time_limit_s = 0.0;
  o.quiet = true;
  o.json = fresh.string();
  EXPECT_EQ(pt::replay_main(o), 0);
  EXPECT_TRUE(fs::exists(fresh));
}

TEST(BenchCli, RejectsNonPositiveRepeatsItersAndScale) {
  for (const char* bad : {"0", "-1"}) {
    EXPECT_EQ(cli({"bench", "--device", "cpu", "--repeats", bad}), 2) << bad;
    EXPECT_EQ(cli({"bench", "--device", "cpu", "--iters", bad}), 2) << bad;
    EXPECT_EQ(cli({"bench", "--device", "cpu", "--scale", bad}), 2) << bad;
  }
  pt::BenchOptions o;
  o.device = "cpu";
  o.repeats = 0;
  EXPECT_THROW(pt::bench_main(o), pagedmha::Error);
}

// An --out-dir that cannot be a folder fails before any measurement.
TEST(BenchCli, UnusableOutDirFailsUpFront) {
  const fs::path file = scratch("not_a_dir");
  std::ofstream(file) << "x";
  EXPECT_EQ(cli({"bench", "--device", "cpu", "--ops", "decode", "--models", "llama3-8b", "--out-dir",
                 (file / "sub").string()}),
            1);
}

TEST(BenchCli, MissingOutDirIsCreated) {
  const fs::path dir = scratch("made") / "deeper";
  fs::remove_all(dir);
  pt::BenchOptions o;
  o.device = "cpu";
  o.ops = "prefill";
  o.models = "llama3-8b";
  o.iters = 1, o.repeats = 1, o.scale = 64;
  o.out_dir = dir.string();
  EXPECT_EQ(pt::bench_main(o), 0);
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_FALSE(fs::is_empty(dir));
}

// File names go to Python as argv, never through a shell.
TEST(PlotCli, ReportNameIsNotInterpretedByAShell) {
  const fs::path pwned = scratch("pwned");
  fs::remove(pwned);
  const std::string evil = "x'; touch " + pwned.string() + "; echo '";
  EXPECT_EQ(cli({"plot", evil}), 1);
  EXPECT_FALSE(fs::exists(pwned));
  // Even when the file exists (so the report check passes), the name stays one argument.
  const fs::path dir = scratch("inj");
  fs::create_directories(dir);
  const fs::path evil_file = dir / ("r$(touch " + pwned.string() + ").json");
  std::ofstream(evil_file) << "{}";
  cli({"plot", evil_file.string(), "-o", (dir / "o.png").string()});
  EXPECT_FALSE(fs::exists(pwned));
}

TEST(PlotCli, MissingReportIsAnErrorNamingTheArgument) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(cli({"plot", scratch("does_not_exist.json").string()}), 1);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("report"), std::string::npos) << err;
  EXPECT_EQ(err.find("Traceback"), std::string::npos) << err;
}

TEST(Cli, UnknownSubcommandIsNamed) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(cli({"nosuchcmd"}), 2);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("unknown subcommand 'nosuchcmd'"), std::string::npos) << err;
  EXPECT_NE(err.find("replay"), std::string::npos) << err;
}

TEST(ReplayCli, CustomModelNamesTheMissingFlags) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(cli({"replay", "--device", "cpu", "--model", "custom", "--head-dim", "96"}), 1);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("missing --layers, --q-heads, --kv-heads"), std::string::npos) << err;
  EXPECT_EQ(err.find("--head-dim,"), std::string::npos) << err;  // given, so not listed as missing
}

// The report names its invocation and commit (PAGEDMHA_COMMIT wins over the build's sha).
TEST(ReplayCli, ReportRecordsCommandAndCommit) {
  const fs::path json = scratch("cmd.json");
  ASSERT_EQ(setenv("PAGEDMHA_COMMIT", "feedbee", 1), 0);
  ASSERT_EQ(cli({"replay", "--device", "cpu", "--model", "custom", "--layers", "1", "--q-heads", "1", "--kv-heads",
                 "1", "--head-dim", "64", "--requests", "2", "--check-every", "0", "--max-steps", "1",
                 "--no-progress", "--quiet", "--json", json.string()}),
            0);
  unsetenv("PAGEDMHA_COMMIT");
  std::ifstream f(json);
  ASSERT_TRUE(f);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["commit"], "feedbee");
  EXPECT_EQ(j["command"], "pagedmha replay --device cpu --model custom --layers 1 --q-heads 1 --kv-heads 1 "
                          "--head-dim 64 --requests 2 --check-every 0 --max-steps 1 --no-progress --quiet --json " +
                              json.string());
  EXPECT_FALSE(pt::build_commit().empty());
}

// Prompt tokens served from the prefix cache count as done: a complete run ends at 100%.
TEST(ReplayProgress, CompleteRunWithPrefixHitsEndsAtOneHundredPercent) {
  pt::ReplayOptions o = tiny();
  o.progress = true;
  testing::internal::CaptureStderr();
  const pt::ReplayResult r = pt::run_replay(o);
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_EQ(r.finished, 6);
  ASSERT_GT(r.sched.prefix_hit_tokens, 0);  // the case the old count missed
  ASSERT_EQ(r.sched.preemptions, 0);        // (a recompute would overshoot, capped at 100%)
  const size_t end = err.rfind("(end)");
  ASSERT_NE(end, std::string::npos) << err;
  const std::string last = err.substr(err.rfind('\n', end) + 1, end - err.rfind('\n', end));
  EXPECT_NE(last.find("(100.0%)"), std::string::npos) << last;
}

// --help shows the defaults of the options that have one.
TEST(ReplayCli, HelpShowsDefaults) {
  testing::internal::CaptureStdout();
  cli({"replay", "--help"});
  const std::string help = testing::internal::GetCapturedStdout();
  for (const char* d : {"--page-size INT=16", "--kv-dtype TEXT:{bf16,fp16,fp8}=bf16", "--seed UINT=1",
                        "--device TEXT:{auto,cpu,cuda}=auto", "--json-steps INT=2000"})
    EXPECT_NE(help.find(d), std::string::npos) << d;
}
