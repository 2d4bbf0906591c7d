// `pagedmha replay`: serve a request trace through MhaBackend, check sampled steps against
// the CPU reference ops, and report attention time, bandwidth and FLOP rates.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pagedmha/tensor.h"
#include "replay/executor.h"
#include "replay/model.h"
#include "replay/ranks.h"
#include "replay/scheduler.h"

namespace pagedmha::tools {

/// Largest --requests (the built-in workload is generated in memory).
inline constexpr int64_t kMaxReplayRequests = 10'000'000;

/// Every option of the subcommand; negative / empty values mean "the device default"
/// (see resolve_replay_defaults).
struct ReplayOptions {
  std::string trace;             // empty: the built-in workload
  std::string format = "auto";   // azure | mooncake | auto
  int64_t requests = -1;         // first N requests (built-in: N requests)
  std::string model = "";        // preset name
  ModelOverrides overrides;
  std::string device = "auto";   // auto | cpu | cuda
  std::string kv_dtype = "bf16"; // bf16 | fp16 | fp8
  int page_size = 16;            // tokens
  int64_t pages = -1;            // per cache group (page 0 included)
  double kv_memory_gb = -1.0;    // GB (1e9 bytes) of K/V over all layers
  int token_budget = -1;         // query tokens per step
  int max_running = -1;          // requests per step
  int spec_tokens = 1;
  double accept_rate = 0.7;
  bool prefix_cache = true;
  bool cuda_graphs = true;
  bool dry_run = false;          // schedule only: no attention, no checks (work and roofline floor)
  int check_every = -1;          // 0: off
  int check_rows = 2;            // rows checked per checked step
  int64_t max_steps = -1;        // stop after this many steps
  double time_limit_s = -1.0;    // wall clock: stop starting steps after this many seconds (< 0: none)
  uint64_t seed = 1;
  double ceiling_read_tbps = -1.0;  // roofline ceilings, TB/s and TFLOP/s; on a GPU by default
  double ceiling_tflops = -1.0;     // the H200's measured 4.6 / 760, on the CPU none (0)
  int json_steps = 2000;         // per-step records kept in the report (evenly strided)
  std::string json;              // report file
  bool progress = true;
  bool quiet = false;            // no final table
  std::string command;           // the invocation (argv joined), recorded in --json; empty: not known
  // Several ranks (docs/multi-gpu.md): -1 = not given. --gpus N runs N ranks in one process,
  // one device (cuda:0..N-1; on --device cpu, threads) each, with --tp N (heads split) or
  // --dcp N (KV split by pages). Without --gpus, --tp N alone serves one rank's heads on one
  // device, as before. --pages / --kv-memory are per device.
  int gpus = -1;
  int dcp = -1;
  std::string baseline_json;     // a one-device report of the same trace: scaling figures
};

/// Fills the device-dependent defaults: on CUDA llama3-8b, all requests of a trace (or
/// 1000 built-in), 40 GB of KV, token budget 8192, 256 running, check every 200 steps;
/// on the CPU llama3-8b geometry with 2 layers, 8 built-in requests, 2048 pages,
/// token budget 2048, 16 running, check every 16 steps (sized to finish in well under
/// 2 minutes on 2 cores with checks on). Ceilings: 4.6 TB/s, 760 TFLOP/s on a GPU, none on
/// the CPU.
ReplayOptions resolve_replay_defaults(const ReplayOptions& options, Device device);

/// "auto" -> cuda:0 when pagedmha::cuda_available(), else cpu.
/// --device of subcommand `cmd` ("auto", "cpu", "cuda"); errors name `cmd`.
Device parse_device(const std::string& name, const char* cmd = "replay");

struct StepRecord {
  int64_t step = 0;
  int rows = 0, extend_rows = 0, decode_rows = 0;
  std::vector<std::array<int, 2>> extend;  // (q_len, seq_len) of each extend row, in row order
  int64_t tokens = 0;       // query tokens
  int64_t kv_tokens = 0;    // sum of seq_len over rows
  double attention_s = 0.0; // all layers (device time)
  double metadata_s = 0.0;  // host: the backend's init_forward_metadata / replay preparation
  double prepare_s = 0.0;   // host: the tool's lengths, page-table sync, token data
  double schedule_s = 0.0;  // host: the tool's scheduler (schedule + complete)
  double capture_s = 0.0;   // host: CUDA-graph capture (first use of a batch size)
  // Several ranks: attention_s is the slowest rank's attention; combine_s the slowest rank's
  // combination of the ranks' outputs (collective, DCP merge); step_s the slowest rank's sum.
  // One device: combine_s = 0, step_s = attention_s.
  double combine_s = 0.0;
  double step_s = 0.0;
  std::vector<RankTimes> ranks;  // per rank (several ranks only)
  double bytes = 0.0;       // K/V read for visible keys + Q + O, all layers
  double flops = 0.0;       // 4 * Hq * D * visible pairs, all layers
  std::vector<int64_t> pages_in_use;  // per group, pages only the prefix cache holds included
  std::vector<int64_t> live_pages;    // per group, pages running requests reference
  int64_t running = 0, waiting = 0;
};

struct CheckStats {
  int64_t steps_checked = 0;
  int64_t rows_checked = 0;  // (query row, layer) pairs, on every rank: (row, layer, rank)
  double max_rel_err = 0.0;
  bool ok = true;
  std::string failure;
};

/// The one-device run a multi-rank run is compared with (--baseline-json).
struct ScalingBaseline {
  std::string path;
  double attention_s = 0.0;
  double decode_attention_s = -1.0;  // < 0: not in the report (older reports)
  int64_t steps = 0, prefill_tokens = 0, decode_tokens = 0, generated_tokens = 0;
  bool truncated = false;
  std::string device, gpu, commit;
};

struct ReplayResult {
  ReplayOptions options;  // resolved
  ModelSpec model;        // the whole model (one device with --tp alone: one rank's heads)
  RankSetup ranks;
  std::vector<TpShard> shards;     // tp: per rank
  std::vector<double> rank_bytes;  // per rank: K/V of its keys + Q + O, all steps and layers
  std::optional<ScalingBaseline> baseline;
  Device device;
  std::string executor;
  SchedulerStats sched;
  int64_t requests = 0, finished = 0, prompt_tokens = 0, output_tokens = 0;
  std::vector<StepRecord> steps;
  CheckStats check;
  double wall_s = 0.0;
  int64_t pages_per_group = 0;
  bool truncated = false;  // stopped by --time-limit / --max-steps before every request finished
};

/// Throws Error naming the flag for an option no replay accepts (before any work).
void check_replay_options(const ReplayOptions& options);

/// The ranks the (checked) options ask for: single without --gpus, else tp or dcp.
RankSetup rank_setup(const ReplayOptions& options);

/// Reads --baseline-json and checks that it is a one-device report of the same trace,
/// model and scheduling options as `options` (resolved); throws Error naming the flag.
ScalingBaseline load_scaling_baseline(const std::string& path, const ReplayOptions& options, const ModelSpec& model);

/// Runs the replay; throws Error for bad options or traces. A check mismatch stops the
/// run and is reported in result.check (ok = false).
ReplayResult run_replay(const ReplayOptions& options);

/// Visible (query, key) pairs of n queries ending at KV length L with window_left w.
int64_t visible_pairs(int64_t L, int64_t n, int w);
/// Distinct keys the n queries read.
int64_t keys_read(int64_t L, int64_t n, int w);

/// The commit the report names: env PAGEDMHA_COMMIT when set, else the git sha CMake saw at
/// configure time (PAGEDMHA_GIT_SHA), else "unknown".
std::string build_commit();

/// Summary, options and per-step records as columns ("steps": {"step": [...], ...}),
/// at most options.json_steps of them, evenly strided ("stride").
nlohmann::json replay_report_json(const ReplayResult& result);
/// The final table (plain text).
std::string replay_summary(const ReplayResult& result);

/// The whole subcommand: run, print, write --json; returns the exit code.
int replay_main(const ReplayOptions& options);

}  // namespace pagedmha::tools
