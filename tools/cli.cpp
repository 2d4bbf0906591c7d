#include "cli.h"

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench.h"
#include "check/check.h"
#include "pagedmha/error.h"
#include "replay/error_text.h"
#include "replay/plot.h"
#include "replay/replay.h"
#include "report_paths.h"

namespace pagedmha::tools {
namespace {

// Option check "> lo" (or ">= lo") with a readable message.
CLI::Validator above(double lo, bool inclusive) {
  const std::string want = std::string(inclusive ? ">= " : "> ") + CLI::detail::to_string(lo);
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(s, v) || !(inclusive ? v >= lo : v > lo)) return "expected " + want + ", got " + s;
        return {};
      },
      want);
}

// A decimal integer in [0, 2^64): CLI11 alone wraps "-1" and saturates "1e23".
CLI::Validator uint64_decimal() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || ec != std::errc() ||
            p != s.data() + s.size())
          return "expected an integer in [0, 2^64), got " + escape_bytes(s);
        return {};
      },
      "");
}

// A probability; NaN passes CLI::Range, so the comparison is written to fail for it.
CLI::Validator probability() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(s, v) || !(v >= 0.0 && v <= 1.0))
          return "expected a probability in [0, 1], got " + escape_bytes(s);
        return {};
      },
      "");
}

// An integer in [lo, hi] ("ranks": the unit in the message); -1, the "not given" value of
// the options, is rejected like any other value outside.
CLI::Validator int_range(int lo, int hi, const std::string& unit) {
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        int v = 0;
        if (!CLI::detail::lexical_cast(s, v) || v < lo || v > hi)
          return "expected " + std::to_string(lo) + ".." + std::to_string(hi) + " " + unit + ", got " + escape_bytes(s);
        return {};
      },
      "");
}

// A file name: '' would silently mean "none" (the built-in workload, no report).
CLI::Validator non_empty(const std::string& what) {
  return CLI::Validator(
      [what](std::string& s) -> std::string { return s.empty() ? "expected " + what + ", got ''" : std::string(); },
      "");
}

// An image file for plot: matplotlib picks the format by the extension and appends
// ".png" to a name without one (the report said it wrote the name given).
CLI::Validator image_file() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const std::string want = "expected an image file name ending in .png, .svg or .pdf, got ";
        const auto dot = s.rfind('.'), slash = s.rfind('/');
        const std::string ext = dot == std::string::npos || (slash != std::string::npos && dot < slash) ? "" : s.substr(dot);
        if (ext != ".png" && ext != ".svg" && ext != ".pdf") return want + (s.empty() ? "''" : escape_bytes(s));
        if (std::filesystem::is_directory(s)) return "expected a file, got the directory " + escape_bytes(s);
        return {};
      },
      "");
}

void add_replay(CLI::App& app, ReplayOptions& o) {
  CLI::App* c = app.add_subcommand(
      "replay",
      "Serve a request trace through the MhaBackend (continuous batching, chunked prefill, paged KV, prefix "
      "cache, sliding-window cache groups, preemption, optional speculative verify) and report attention "
      "time, TB/s and TFLOP/s. Every token's q/k/v is a deterministic function of (seed, request, position, "
      "layer); --check-every recomputes sampled rows with the CPU reference ops. Requests are served as fast "
      "as the scheduler admits them (arrival times order the queue). CPU defaults are small so the default run "
      "takes well under 2 minutes on 2 cores: llama3-8b geometry with 2 layers, 8 built-in requests, "
      "--pages 2048, --token-budget 2048, --max-running 16, --check-every 16. CUDA defaults: llama3-8b "
      "(32 layers), 1000 built-in requests, --kv-memory 40, --token-budget 8192, --max-running 256, "
      "--check-every 200. --gpus N with --tp N or --dcp N serves the trace on N GPUs, one rank each, through "
      "NCCL (docs/multi-gpu.md).");
  c->add_option("--trace", o.trace, "Trace file: Azure LLM inference CSV or Mooncake JSONL (default: the built-in "
                                    "seeded workload shaped like the Azure conversation trace)")
      ->check(non_empty("a trace file name"));
  c->add_option("--format", o.format, "Trace format of --trace: azure | mooncake | auto (auto: '{' first = mooncake)")
      ->check(CLI::IsMember({"azure", "mooncake", "auto"}))
      ->capture_default_str();
  c->add_option("--requests", o.requests, "Use the first N rows of the trace, queued by arrival time (built-in: "
                                          "generate N) [requests]")
      ->check(CLI::Range(int64_t{1}, kMaxReplayRequests));
  c->add_option("--model", o.model, "Attention geometry: llama3-8b | llama3-70b | qwen2.5-7b | gpt-oss-20b | custom "
                                    "(default llama3-8b; on the CPU with 2 layers)");
  c->add_option("--layers", o.overrides.layers, "Override / custom: layers")->check(int_range(1, 4096, "layers"));
  c->add_option("--q-heads", o.overrides.q_heads, "Override / custom: query heads Hq")
      ->check(int_range(1, 4096, "heads"));
  c->add_option("--kv-heads", o.overrides.kv_heads, "Override / custom: KV heads Hkv")
      ->check(int_range(1, 4096, "heads"));
  c->add_option("--head-dim", o.overrides.head_dim, "Override / custom: head dim D (64, 128, 256)");
  c->add_option("--window", o.overrides.window, "Override / custom: window_left on every layer [tokens before the "
                                                "query]; -1 disables (HF sliding_window S = window_left + 1)");
  c->add_option("--sinks", o.overrides.sinks, "Override / custom: 1 = one sink logit per query head, 0 = none")
      ->check(int_range(0, 1, "(1: a sink per query head, 0: none)"));
  c->add_option("--tp", o.overrides.tp, "Tensor-parallel ranks: with --gpus N (then --tp N), N ranks serve Hq / N "
                                        "query heads and Hkv / N KV heads (or the 1 they need) each; alone, one rank's "
                                        "heads on one device");
  c->add_option("--gpus", o.gpus, "Ranks in one process, one thread and one CUDA device each (cuda:0..N-1, NCCL "
                                  "between them; with --device cpu, N host threads, for tests), with --tp N or "
                                  "--dcp N; --pages / --kv-memory are per device [ranks]")
      ->check(int_range(1, kMaxRanks, "ranks"));
  c->add_option("--dcp", o.dcp, "Decode context parallelism over the --gpus N ranks (--dcp N): each request's KV "
                                "pages are dealt round-robin to the ranks, each attends its keys, and (o, lse) are "
                                "all-gathered and merged (merge_attention_states) [ranks]")
      ->check(int_range(1, kMaxRanks, "ranks"));
  c->add_option("--baseline-json", o.baseline_json, "With --gpus: a one-device replay report (--json) of the same "
                                                    "trace and options; the report adds the scaling efficiency "
                                                    "T1 / (N x TN)")
      ->check(non_empty("a report file name"));
  c->add_option("--device", o.device, "auto | cpu | cuda (auto: the GPU when one is available)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  c->add_option("--kv-dtype", o.kv_dtype, "KV cache dtype: bf16 | fp16 | fp8 (fp8 e4m3, per-layer scale 1/32; "
                                          "queries bf16)")
      ->check(CLI::IsMember({"bf16", "fp16", "fp8"}))
      ->capture_default_str();
  c->add_option("--page-size", o.page_size, "Tokens per page (a divisor of 512 to use the prefix cache)")
      ->capture_default_str();
  c->add_option("--pages", o.pages, "Pages per cache group, including the reserved page 0 [pages]");
  c->add_option("--kv-memory", o.kv_memory_gb, "K/V memory of all layers when --pages is not given [GB = 1e9 bytes]")
      ->check(above(0, false));
  c->add_option("--token-budget", o.token_budget, "Query tokens per step: decode rows + prefill chunks; "
                                                  "2147483647: no limit [tokens]");
  c->add_option("--max-running", o.max_running, "Requests in flight (batch rows per step); 2147483647: no "
                                                "limit [requests]");
  c->add_option("--spec-tokens", o.spec_tokens, "Speculative verify: N queries per decode row (1 = off) [1..8 tokens]")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  c->add_option("--accept-rate", o.accept_rate, "Probability each draft token is accepted (seeded) [0..1]")
      ->check(probability())
      ->capture_default_str();
  c->add_flag("!--no-prefix-cache", o.prefix_cache, "Disable the prefix cache (Mooncake hash ids)");
  c->add_flag("!--no-cuda-graphs", o.cuda_graphs, "Run decode steps eagerly on the GPU");
  c->add_flag("--dry-run", o.dry_run, "Schedule only, with the GPU defaults: run no attention and no checks; reports the steps, "
              "bytes, flops and roofline floor of the trace (ceilings: the H200's)");
  c->add_option("--check-every", o.check_every, "Check sampled rows of every K-th step against the CPU reference "
                                                "ops; 0 = off [steps]");
  c->add_option("--check-rows", o.check_rows, "Batch rows checked per checked step [rows]")->capture_default_str();
  c->add_option("--max-steps", o.max_steps, "Stop after this many steps (-1: run to completion) [steps]");
  c->add_option("--time-limit", o.time_limit_s, "Wall-clock limit: stop starting steps after this many seconds, "
                 "finish cleanly and write a report marked \"truncated\" [s]")
      ->check(above(0, true));
  c->add_option("--seed", o.seed, "Seed of the workload, the token data and the acceptance model")
      ->check(uint64_decimal())
      ->capture_default_str();
  c->add_option("--ceiling-read-tbps", o.ceiling_read_tbps, "Read-bandwidth ceiling of the roofline figures "
                 "(default on a GPU: the H200's measured 4.6; CPU: none) [TB/s]");
  c->add_option("--ceiling-tflops", o.ceiling_tflops, "Tensor-core ceiling of the roofline figures (default on a "
                 "GPU: the H200's measured bf16 GEMM 760; CPU: none) [TFLOP/s]");
  c->add_option("--json-steps", o.json_steps, "Per-step records kept in --json (evenly strided; the summary "
                 "covers every step) [records]")
      ->check(int_range(1, std::numeric_limits<int>::max(), "records"))
      ->capture_default_str();
  c->add_option("--json", o.json, "Write the full report (summary and per-step records) to this file")
      ->check(non_empty("a report file name"));
  c->add_flag("!--no-progress", o.progress, "No live progress on stderr");
  c->add_flag("--quiet", o.quiet, "No final table on stdout");
}

// argv joined with spaces, paths relative to the repository (report_paths.h); an argument
// a shell would split or expand is single-quoted, so the recorded command can be pasted back.
std::string joined_command(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    const std::string a = repo_relative_word(argv[i], PAGEDMHA_SOURCE_DIR);
    const bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                         "0123456789-_./=:,+@%") == std::string::npos;
    if (i) out += ' ';
    if (plain) {
      out += a;
      continue;
    }
    out += '\'';
    for (char ch : a) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    out += '\'';
  }
  return out;
}

}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{"pagedmha: paged-KV multi-head attention - trace replay, benchmarks and self-test"};
  app.require_subcommand(1);
  ReplayOptions replay;
  replay.command = joined_command(argc, argv);
  add_replay(app, replay);

  std::string plot_in, plot_out = "replay.png", plot_script;
  CLI::App* plot = app.add_subcommand("plot", "Plot a replay report (step latency vs batch tokens, KV pages in use "
                                              "over time) with scripts/plot_replay.py (Python + matplotlib)");
  plot->add_option("report", plot_in, "Report written by replay --json")->required();
  plot->add_option("-o,--output", plot_out, "Image file (.png, .svg or .pdf)")->check(image_file());
  plot->add_option("--script", plot_script, "Path of plot_replay.py (default: the source tree's scripts/)");

  BenchOptions bench;
  CLI::App* b = app.add_subcommand("bench", "Kernel micro-benchmarks of the standard shapes (docs/performance.md) through "
                                            "the ops; writes JSON (results schema) to --out-dir");
  add_bench_options(*b, bench);
  CheckOptions check;
  CLI::App* k = app.add_subcommand("check", "Self-test: every op on the chosen device against a straightforward "
                                            "reference on random inputs; non-zero exit on a mismatch");
  add_check_options(*k, check);
  k->get_option("--seed")->check(uint64_decimal());  // CLI11 alone wraps "-1", saturates "1e23"

  // Usage errors in the project's form "pagedmha: error: <subcommand>: <flag>: ...",
  // bounded and escaped (they may quote any argument).
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    std::string where;
    for (const CLI::App* sub : a->get_subcommands()) where = sub->get_name() + ": ";
    return "pagedmha: error: " + where + escape_bytes(e.what(), 400) + "\nRun with --help for more information.\n";
  });
  try {
    app.parse(argc, argv);
    CLI::App* r = app.get_subcommand("replay");
    if (r->parsed() && r->count("--format") && !r->count("--trace"))
      throw CLI::ValidationError("--format", "expected a --trace file to read with it, got --format " +
                                                 escape_bytes(replay.format) + " without --trace");
  } catch (const CLI::ParseError& e) {
    // CLI11 reports "A subcommand is required" for a misspelt one: name it instead.
    const std::vector<std::string> rest = app.remaining();
    if (app.get_subcommands().empty() && !rest.empty() && !rest.front().empty() && rest.front()[0] != '-') {
      std::string names;
      for (const CLI::App* sub : app.get_subcommands({})) names += (names.empty() ? "" : ", ") + sub->get_name();
      std::fprintf(stderr, "pagedmha: error: unknown subcommand '%s' (expected %s)\nRun with --help for more information.\n",
                   rest.front().c_str(), names.c_str());
      return 2;
    }
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (app.got_subcommand("replay")) return replay_main(replay);
    if (app.got_subcommand("bench")) return bench_main(bench);
    if (app.got_subcommand("check")) return check_main(check);
    if (app.got_subcommand("plot")) return plot_main(plot_in, plot_out, plot_script);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagedmha: error: %s\n", e.what());
    return 1;
  }
  return 2;
}

}  // namespace pagedmha::tools
