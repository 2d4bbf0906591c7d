// Command-line regressions: --time-limit truncation, argument validation (bench repeats /
// iters / scale / out-dir, replay requests / spec-tokens / kv-memory) and plot's
// shell-free spawning.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench.h"
#include "cli.h"
#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#include "replay/plot.h"
#include "replay/replay.h"
#include "report_paths.h"

namespace pt = pagedmha::tools;
namespace fs = std::filesystem;

namespace {

// Runs the CLI; `program`: put "pagedmha" in front (else args[0] is the program name).
int cli(std::vector<std::string> args, bool program = true) {
  if (program) args.insert(args.begin(), "pagedmha");
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

// Runs the CLI with stderr captured: {exit code, stderr}.
std::pair<int, std::string> cli_err(const std::vector<std::string>& args) {
  testing::internal::CaptureStderr();
  const int rc = cli(args);
  return {rc, testing::internal::GetCapturedStderr()};
}

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

bool have_python_module(const char* module) {
  return std::system(("python3 -c 'import " + std::string(module) + "' >/dev/null 2>&1").c_str()) == 0;
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

// A KV pool larger than the device's memory is a usage error naming the flag that sized
// it, before any allocation: accepted sizes (--page-size 4096 with the default --pages)
// had the process killed for memory while it filled the pool.
TEST(ReplayCli, KvPoolBeyondTheDevicesMemoryNamesTheFlag) {
  pt::ReplayOptions o = tiny();
  o.page_size = 4096;
  o.pages = 2'000'000'000;  // 2e9 pages of 4096 tokens: petabytes
  const std::string m = message(o);
  EXPECT_NE(m.find("replay: --pages: expected a KV pool within cpu's "), std::string::npos) << m;
  EXPECT_NE(m.find("2000000000 pages of 4096 tokens"), std::string::npos) << m;
}

// CPU ranks (--gpus N on the CPU) each hold a pool in the one host memory: two pools of
// 0.6x the host's memory are refused though each alone would fit.
TEST(ReplayCli, KvPoolCheckCountsEveryCpuRank) {
  const double host = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  ASSERT_GT(host, 0.0);
  pt::ReplayOptions o = tiny();
  o.gpus = 2, o.overrides.tp = 2;
  o.page_size = 4096;
  o.kv_dtype = "bf16";
  // Hkv 1 is kept whole on each TP rank: 4096 tokens x 1 head x D 64 x (K, V) x 2 bytes.
  const double bytes_per_page = 4096.0 * 64 * 2 * 2;
  o.pages = static_cast<int64_t>(0.6 * host / bytes_per_page);
  const std::string m = message(o);
  EXPECT_NE(m.find("replay: --pages: expected a KV pool within cpu's "), std::string::npos) << m;
  EXPECT_NE(m.find(" x 2 ranks"), std::string::npos) << m;
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

// The table on stdout starts with a header naming every column of the rows below it.
TEST(BenchCli, PrintsColumnHeaders) {
  pt::BenchOptions o;
  o.device = "cpu", o.ops = "decode", o.models = "llama3-8b";
  o.iters = 1, o.repeats = 1, o.scale = 256;
  o.out_dir = scratch("headers").string();
  testing::internal::CaptureStdout();
  const int rc = pt::bench_main(o);
  const std::string out = testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, 0);
  std::istringstream lines(out);
  std::string header, row;
  std::getline(lines, header);
  std::getline(lines, row);
  auto words = [](const std::string& s) {
    std::istringstream in(s);
    std::vector<std::string> w;
    for (std::string x; in >> x;) w.push_back(x);
    return w;
  };
  EXPECT_EQ(words(header), (std::vector<std::string>{"op", "model", "batch", "ctx", "q_len", "page", "kv", "time_us", "rate"}))
      << out;
  // The first shape: decode of llama3-8b, batch 1 / 4 -> 1, ctx 32768 / 256, one query, page 16, bf16.
  const std::vector<std::string> w = words(row);
  ASSERT_EQ(w.size(), 10u) << row;  // the rate has its unit
  EXPECT_EQ(std::vector<std::string>(w.begin(), w.begin() + 7),
            (std::vector<std::string>{"decode", "llama3-8b", "1", "128", "1", "16", "bf16"}))
      << row;
  EXPECT_EQ(w[9], "TB/s") << row;
  // Each header word ends where its column ends (right-aligned numbers) or starts (left-aligned names).
  EXPECT_EQ(header.find("batch") + 5, row.find(" 1 ") + 2) << header << "\n" << row;
}

// Errors that name the bench and its flag before anything is measured or made: a --scale
// that leaves a shape with ctx < q_len (or 0), an empty --out-dir, a CUDA device that is
// not there (used to be reported as "replay: --device"). Two runs of one day keep both
// result files (the name used to be the date alone).
TEST(BenchCli, ScaleOutDirAndDeviceErrorsNameTheBenchAndRunsKeepTheirFiles) {
  const fs::path dir = scratch("bench_errors");
  fs::remove_all(dir);
  auto error = [](const pt::BenchOptions& o) {
    try {
      pt::bench_main(o);
    } catch (const pagedmha::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  pt::BenchOptions o;
  o.device = "cpu", o.models = "gemma", o.iters = 1, o.repeats = 1, o.out_dir = dir.string();
  o.ops = "decode", o.scale = 513;
  EXPECT_NE(error(o).find("bench: --scale: expected <= 512 (every shape keeps ctx >= q_len >= 1), got 513"),
            std::string::npos);
  o.ops = "prefill", o.scale = 1025;
  EXPECT_NE(error(o).find("bench: --scale: expected <= 1024"), std::string::npos) << error(o);
  EXPECT_FALSE(fs::exists(dir));
  const auto [rc, err] = cli_err({"bench", "--device", "cpu", "--out-dir", ""});
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("--out-dir: expected a folder name, got ''"), std::string::npos) << err;
  if (!pagedmha::cuda_available()) {
    const auto [rc2, err2] = cli_err({"bench", "--device", "cuda", "--out-dir", dir.string()});
    EXPECT_EQ(rc2, 1);
    EXPECT_NE(err2.find("pagedmha: error: bench: --device: expected a visible CUDA device"), std::string::npos) << err2;
    EXPECT_FALSE(fs::exists(dir));
  }
  o.scale = 1024;
  testing::internal::CaptureStdout();
  EXPECT_EQ(pt::bench_main(o), 0);
  EXPECT_EQ(pt::bench_main(o), 0);
  testing::internal::GetCapturedStdout();
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.path().extension() == ".json";
  EXPECT_EQ(files, 2);
}

// Without --out-dir the JSON goes under the build folder (the nearest ancestor of the
// program with a CMakeCache.txt), never into the source tree.
TEST(BenchCli, DefaultOutDirIsUnderTheBuildFolder) {
  pt::BenchOptions o;
  o.device = "cpu", o.ops = "prefill", o.models = "gemma";
  o.iters = 1, o.repeats = 1, o.scale = 256;
  testing::internal::CaptureStdout();
  const int rc = pt::bench_main(o);
  const std::string out = testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, 0);
  const std::size_t at = out.rfind("wrote ");
  ASSERT_NE(at, std::string::npos) << out;
  fs::path file = out.substr(at + 6);
  while (!file.empty() && file.string().back() == '\n') file = file.string().substr(0, file.string().size() - 1);
  ASSERT_TRUE(fs::is_regular_file(file)) << file;
  const fs::path dir = fs::canonical(file.parent_path());
  EXPECT_EQ(dir.filename(), "results");
  EXPECT_EQ(dir.parent_path().filename(), "bench");
  EXPECT_TRUE(fs::exists(dir.parent_path().parent_path() / "CMakeCache.txt")) << dir;
  EXPECT_NE(dir, fs::weakly_canonical(fs::path(PAGEDMHA_SOURCE_DIR) / "bench" / "results"));
  fs::remove(file);
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

// matplotlib appends ".png" to a name without an image extension, so "plot -o out" wrote
// out.png while the tool reported "wrote out": such names (and '' or a directory) are
// usage errors. check --seed takes the same decimal as replay --seed (CLI11 alone wraps -1).
TEST(PlotCli, OutputNeedsAnImageExtensionAndCheckSeedIsDecimal) {
  const std::string rep = scratch("any.json").string();
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"plot", rep, "-o", scratch("plotout").string()},
       "plot: --output: expected an image file name ending in .png, .svg or .pdf, got "},
      {{"plot", rep, "-o", ""}, "plot: --output: expected an image file name ending in .png, .svg or .pdf, got ''"},
      {{"plot", rep, "-o", "/tmp"}, "plot: --output: expected an image file name ending in .png, .svg or .pdf"},
      {{"check", "--device", "cpu", "--seed", "-1"}, "check: --seed: expected an integer in [0, 2^64), got -1"},
      {{"check", "--device", "cpu", "--seed", "99999999999999999999999"},
       "check: --seed: expected an integer in [0, 2^64), got 99999999999999999999999"},
  };
  for (const auto& [args, want] : cases) {
    const auto [rc, err] = cli_err(args);
    EXPECT_EQ(rc, 2) << want;
    EXPECT_NE(err.find("pagedmha: error: " + want), std::string::npos) << err;
  }
  EXPECT_FALSE(fs::exists(scratch("plotout.png")));
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
                              pt::repo_relative(json.string(), PAGEDMHA_SOURCE_DIR));
  // Never the machine's absolute path (a temporary folder: "cmd.json").
  EXPECT_EQ(j["command"].get<std::string>().find(json.string()), std::string::npos);
  EXPECT_FALSE(pt::build_commit().empty());
}

// Reports record paths relative to the repository, never the machine's absolute paths.
TEST(ReportPaths, RepositoryRelative) {
  const std::string src = PAGEDMHA_SOURCE_DIR;
  const fs::path parent = fs::path(src).parent_path();
  const std::string far = (parent.parent_path() / "pagedmha_nowhere" / "out").string();  // two levels up
  EXPECT_EQ(pt::repo_relative(src + "/tests/fuzz/corpus/azure/small.csv", src), "tests/fuzz/corpus/azure/small.csv");
  EXPECT_EQ(pt::repo_relative(src + "/build/cpu/../../bench/results", src), "bench/results");
  if (parent != parent.root_path()) {  // a folder beside the repository (our CI's ../shared/traces)
    EXPECT_EQ(pt::repo_relative((parent / "shared/traces/conv.jsonl").string(), src), "../shared/traces/conv.jsonl");
  }
  EXPECT_EQ(pt::repo_relative(far + "/r.json", src), "r.json");
  EXPECT_EQ(pt::repo_relative("", src), "");
  EXPECT_EQ(pt::repo_relative_word("--json=" + far + "/r.json", src), "--json=r.json");
  EXPECT_EQ(pt::repo_relative_word(src + "/build/cpu/tools/pagedmha", src), "build/cpu/tools/pagedmha");
  EXPECT_EQ(pt::repo_relative_word("cuda", src), "cuda");
  EXPECT_EQ(pt::repo_relative_word("--device=cpu", src), "--device=cpu");
}

TEST(ReplayCli, ReportRecordsRepositoryRelativePaths) {
  const std::string src = PAGEDMHA_SOURCE_DIR;
  const fs::path json = scratch("paths.json");
  const std::string trace = src + "/tests/fuzz/corpus/azure/small.csv";
  ASSERT_EQ(cli({src + "/build/cpu/tools/pagedmha", "replay", "--device", "cpu", "--trace", trace, "--model", "custom",
                 "--layers", "1", "--q-heads", "1", "--kv-heads", "1", "--head-dim", "64", "--check-every", "0",
                 "--max-steps", "1", "--no-progress", "--quiet", "--json=" + json.string()}, /*program=*/false),
            0);
  std::ifstream f(json);
  ASSERT_TRUE(f);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["options"]["trace"], "tests/fuzz/corpus/azure/small.csv");
  EXPECT_EQ(j["command"], "build/cpu/tools/pagedmha replay --device cpu --trace tests/fuzz/corpus/azure/small.csv "
                          "--model custom --layers 1 --q-heads 1 --kv-heads 1 --head-dim 64 --check-every 0 "
                          "--max-steps 1 --no-progress --quiet --json=" +
                              pt::repo_relative(json.string(), src));  // outside: "paths.json"
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

// Values that used to be accepted silently (NaN as 1.0, a wrapped or saturated seed, an
// empty file name as "none", a format with nothing to read) are usage errors naming the
// flag and the value, before any work: the --json report is never created.
TEST(ReplayCli, SilentlyAcceptedValuesAreRejectedNamingTheFlag) {
  const fs::path json = scratch("never.json");
  fs::remove(json);
  const std::vector<std::string> base = {"replay", "--device", "cpu", "--requests", "1", "--max-steps", "1",
                                         "--no-progress", "--quiet"};
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--accept-rate", "nan"}, "replay: --accept-rate: expected a probability in [0, 1], got nan"},
      {{"--seed", "-1"}, "replay: --seed: expected an integer in [0, 2^64), got -1"},
      {{"--seed", "1e23"}, "replay: --seed: expected an integer in [0, 2^64), got 1e23"},
      {{"--seed", "18446744073709551616"}, "replay: --seed: expected an integer in [0, 2^64), got 18446744073709551616"},
      {{"--trace", ""}, "replay: --trace: expected a trace file name, got ''"},
      {{"--format", "azure"}, "replay: --format: expected a --trace file to read with it, got --format azure without --trace"},
      {{"--format", "auto"}, "replay: --format: expected a --trace file to read with it"},
      {{"--sinks", "5"}, "replay: --sinks: expected 0..1 (1: a sink per query head, 0: none), got 5"},
      {{"--json-steps", "-5"}, "replay: --json-steps: expected 1..2147483647 records, got -5"},
      {{"--layers", "2147483647"}, "replay: --layers: expected 1..4096 layers, got 2147483647"},
      {{"--kv-heads", "0"}, "replay: --kv-heads: expected 1..4096 heads, got 0"},
  };
  for (const auto& [extra, want] : cases) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--json", json.string()});
    const auto [rc, err] = cli_err(args);
    EXPECT_EQ(rc, 2) << want;
    EXPECT_NE(err.find("pagedmha: error: " + want), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(json)) << want;
  }
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--json", ""});
  const auto [rc, err] = cli_err(args);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("pagedmha: error: replay: --json: expected a report file name, got ''"), std::string::npos) << err;
  // The largest seed is a seed.
  EXPECT_EQ(cli({"replay", "--device", "cpu", "--model", "custom", "--layers", "1", "--q-heads", "1", "--kv-heads", "1",
                 "--head-dim", "64", "--requests", "1", "--max-steps", "1", "--check-every", "0", "--no-progress",
                 "--quiet", "--seed", "18446744073709551615"}),
            0);
}

// Library callers: the same values fail naming the flag (NaN used to pass the range test).
TEST(ReplayCli, LibraryRejectsNanAcceptRateAndAFormatWithoutATrace) {
  pt::ReplayOptions o = tiny();
  o.accept_rate = std::nan("");
  EXPECT_NE(message(o).find("replay: --accept-rate: expected a probability in [0, 1], got nan"), std::string::npos)
      << message(o);
  o = tiny();
  o.format = "mooncake";
  EXPECT_NE(message(o).find("replay: --format: expected a --trace file to read with it"), std::string::npos)
      << message(o);
  // replay_main checks before the report file is touched.
  const fs::path json = scratch("lib_never.json");
  fs::remove(json);
  o.json = json.string();
  EXPECT_THROW(pt::replay_main(o), pagedmha::Error);
  EXPECT_FALSE(fs::exists(json));
}

// 2147483647 used to hang (--max-running: per-row buffers for 2^31 rows) or fail in an
// allocation naming no flag (--token-budget); now it means "no limit".
TEST(ReplayCli, MaxIntTokenBudgetAndMaxRunningMeanNoLimit) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto [rc, err] = cli_err({"replay", "--device", "cpu", "--model", "custom", "--layers", "1", "--q-heads", "1",
                                  "--kv-heads", "1", "--head-dim", "64", "--requests", "3", "--check-every", "1",
                                  "--no-progress", "--quiet", "--max-running", "2147483647", "--token-budget",
                                  "2147483647"});
  EXPECT_EQ(rc, 0) << err;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60.0);
  // A pool that cannot be allocated (256 TB of K/V: beyond any address space) names the
  // flag that sized it, not only a byte count.
  pt::ReplayOptions o = tiny();
  o.pages = 1 << 21, o.page_size = 4096;
  o.overrides.head_dim = 256, o.overrides.kv_heads = 64, o.overrides.q_heads = 64;
  const std::string m = message(o);
  EXPECT_NE(m.find("replay: --pages: expected a KV pool within cpu's "), std::string::npos) << m;
  EXPECT_NE(m.find("2097152 pages of 4096 tokens"), std::string::npos) << m;
}

// The repro was 2^24 pages x 4096 x 2^21 KV heads x 64 x 2 bytes = 2^64, which
// wrapped to a 0-byte pool and then a wild write in append_kv (the pool's size is a
// checked product since). Heads are now at most 4096, but 4096 layers of 4096 KV heads of
// D 256 still pass 2^64 (2^70 bytes): the error names the sizing flag, in one line,
// before anything is allocated (the pool against the host's memory, computed in double).
TEST(ReplayCli, PoolSizeBeyond64BitsNamesTheFlags) {
  const auto [rc, err] = cli_err({"replay", "--device", "cpu", "--requests", "1", "--model", "custom", "--layers",
                                  "4096", "--q-heads", "4096", "--kv-heads", "4096", "--head-dim", "256", "--page-size",
                                  "4096", "--pages", "16777216", "--token-budget", "1", "--max-running", "1",
                                  "--check-every", "0", "--no-progress", "--quiet"});
  EXPECT_EQ(rc, 1) << err;
  EXPECT_NE(err.find("replay: --pages: expected a KV pool within cpu's "), std::string::npos) << err;
  EXPECT_EQ(lines(err), 1) << err;
}

// An empty or unknown --ops / --models list fails before the results folder is made
// (',' used to write an empty results file and exit 0).
TEST(BenchCli, EmptyOrUnknownListsFailBeforeTheOutDirIsMade) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--ops", ","}, "bench: --ops: expected a comma list of decode, prefill, got ','"},
      {{"--ops", "foo"}, "bench: --ops: expected decode, prefill, got 'foo'"},
      {{"--ops", "decode,foo"}, "bench: --ops: expected decode, prefill, got 'foo'"},
      {{"--models", ","}, "bench: --models: expected a comma list of llama3-8b"},
      {{"--models", "llama3-8b,nope"}, "bench: --models: expected llama3-8b, llama3-70b"},
  };
  for (const auto& [extra, want] : cases) {
    const fs::path dir = scratch("bench_never");
    fs::remove_all(dir);
    std::vector<std::string> args = {"bench", "--device", "cpu", "--out-dir", dir.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto [rc, err] = cli_err(args);
    EXPECT_EQ(rc, 1) << want;
    EXPECT_NE(err.find("pagedmha: error: " + want), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(dir)) << want;
  }
}

namespace {

// A real report of a truncated run (stopped before its first step, and after two).
nlohmann::json truncated_report(int max_steps) {
  pt::ReplayOptions o = tiny();
  o.requests = 3;
  if (max_steps == 0) o.time_limit_s = 0.0;
  else o.max_steps = max_steps;
  return pt::replay_report_json(pt::run_replay(o));
}

fs::path write_json(const std::string& name, const nlohmann::json& j) {
  const fs::path p = scratch(name);
  std::ofstream(p) << j.dump();
  return p;
}

}  // namespace

// A cut or edited report (a column shorter than the steps, a missing field) used to end in
// a Python traceback; now it is one line naming the field, before Python runs.
TEST(PlotCli, BrokenReportsAreOneLineErrorsNamingTheField) {
  const nlohmann::json good = truncated_report(2);
  ASSERT_TRUE(good["truncated"].get<bool>());
  ASSERT_EQ(good["steps"]["step"].size(), 2u);
  std::vector<std::pair<nlohmann::json, std::string>> cases;
  nlohmann::json j = good;
  j["steps"]["tokens"].erase(1);
  cases.push_back({j, "steps.tokens an array of 2 numbers (one per step), got an array of 1"});
  j = good;
  j["steps"].erase("stride");
  cases.push_back({j, "steps.stride a number, got nothing"});
  j = good;
  j["summary"].erase("finished");
  cases.push_back({j, "summary.finished a number, got nothing"});
  j = good;
  j["steps"]["pages_in_use"][0].erase(0);
  cases.push_back({j, "steps.pages_in_use[0] an array of 2, got an array of 1"});
  j = good;
  j["steps"]["live_pages"][0].erase(0);
  cases.push_back({j, "steps.live_pages[0] an array of 2, got an array of 1"});
  j = good;
  j["summary"]["prefix_hit_rate"] = "high";
  cases.push_back({j, "summary.prefix_hit_rate a number or null, got a string"});
  cases.push_back({nlohmann::json::array(), "its fields in an object, got an array of 0"});
  for (size_t i = 0; i < cases.size(); ++i) {
    const fs::path rep = write_json("broken" + std::to_string(i) + ".json", cases[i].first);
    const auto [rc, err] = cli_err({"plot", rep.string(), "-o", scratch("broken.png").string()});
    EXPECT_EQ(rc, 1) << cases[i].second;
    EXPECT_EQ(err.rfind("pagedmha: error: plot: report: expected a replay --json report with " + cases[i].second, 0), 0u)
        << err;
    EXPECT_EQ(lines(err), 1) << err;
    EXPECT_EQ(err.find("Traceback"), std::string::npos) << err;
  }
  // Reports written before live_pages existed are still plotted.
  j = good;
  j["steps"].erase("live_pages");
  EXPECT_NO_THROW(pt::check_replay_report(j, "old.json"));
  // A file cut short is not JSON: one line, naming where the parse failed.
  const std::string text = good.dump();
  const fs::path cut = scratch("cut.json");
  std::ofstream(cut) << text.substr(0, text.size() / 2);
  const auto [rc, err] = cli_err({"plot", cut.string(), "-o", scratch("cut.png").string()});
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("plot: report: expected a replay --json report (JSON), got a parse error at byte"), std::string::npos)
      << err;
  EXPECT_EQ(lines(err), 1) << err;
}

// Reports of truncated runs (no step at all, or some) plot.
TEST(PlotCli, TruncatedRunReportsPlot) {
  if (!have_python_module("matplotlib")) GTEST_SKIP() << "python3 with matplotlib not available";
  for (int steps : {0, 2}) {
    const fs::path rep = write_json("trunc" + std::to_string(steps) + ".json", truncated_report(steps));
    const fs::path png = scratch("trunc" + std::to_string(steps) + ".png");
    fs::remove(png);
    const auto [rc, err] = cli_err({"plot", rep.string(), "-o", png.string()});
    EXPECT_EQ(rc, 0) << err;
    EXPECT_GT(fs::file_size(png), 0u);
  }
}

// Whatever else makes the script raise, the CLI shows one line: the exception.
TEST(PlotCli, ScriptTracebackIsReducedToItsLastLine) {
  if (!have_python_module("json")) GTEST_SKIP() << "python3 not available";
  const fs::path script = scratch("raises.py");
  std::ofstream(script) << "import sys\nprint('partial', file=sys.stderr)\nraise ValueError('boom \\x1b[2J')\n";
  const fs::path rep = write_json("ok.json", truncated_report(2));
  const auto [rc, err] = cli_err({"plot", rep.string(), "-o", scratch("r.png").string(), "--script", script.string()});
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("pagedmha: error: plot: plot_replay.py failed on " + rep.string() + ": ValueError: boom \\x1B[2J"),
            std::string::npos)
      << err;
  EXPECT_EQ(lines(err), 1) << err;
  EXPECT_EQ(err.find("Traceback"), std::string::npos) << err;
}
