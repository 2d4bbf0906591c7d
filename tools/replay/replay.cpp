#include "replay/replay.h"

#include "pagedmha/variant.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#include "pagedmha/numeric.h"
#include "pagedmha/ops.h"
#include "replay/datagen.h"
#include "replay/device_info.h"
#include "replay/error_text.h"
#include "replay/executor.h"
#include "replay/ranked_executor.h"
#include "replay/token_data.h"
#include "replay/trace.h"
#include "report_paths.h"

namespace pagedmha::tools {
namespace {

DType parse_kv_dtype(const std::string& s) {
  if (s == "bf16") return DType::bf16;
  if (s == "fp16") return DType::fp16;
  if (s == "fp8") return DType::fp8_e4m3;
  throw_invalid_argument("replay", "--kv-dtype", "bf16, fp16 or fp8", s);
}

// fp8 stores x / scale: values in [-1, 1] land in [-32, 32], well inside e4m3's range.
constexpr float kFp8Scale = 1.0f / 32.0f;


// Reference output of one query (request r at position p, KV length p + 1) in `layer`,
// from K/V regenerated for positions [0, p] into a private CPU cache: independent of the
// replay's pages, prefix sharing and window release.
std::vector<float> reference_row(const ModelSpec& m, const Scheduler& sched, int layer, int request, int position,
                                 DType kv_dtype, DType q_dtype, uint64_t seed) {
  const int P = 16;
  const int64_t L = int64_t{position} + 1;
  // Only keys the query can see are generated: a sliding layer costs O(window), not O(L)
  // (pages before the window map to the zero page 0, which the window masks anyway).
  const int w = m.window_left(layer);
  const int64_t lo = w >= 0 ? std::max<int64_t>(0, L - 1 - w) : 0;
  const int64_t pages = (L + P - 1) / P, first_page = lo / P, held = pages - first_page;
  const int64_t n = L - lo;
  const int Hq = m.num_q_heads, Hkv = m.num_kv_heads, D = m.head_dim;
  Buffer kc = Buffer::empty({(held + 1) * P, Hkv, D}, kv_dtype, Device::cpu());
  Buffer vc = Buffer::empty({(held + 1) * P, Hkv, D}, kv_dtype, Device::cpu());
  fill_bytes(kc.data(), Device::cpu(), 0, kc.bytes());
  fill_bytes(vc.data(), Device::cpu(), 0, vc.bytes());
  std::vector<TokenRef> toks(n);
  std::vector<int32_t> slots(n), table(pages, 0);
  for (int64_t c = first_page; c < pages; ++c) table[c] = static_cast<int32_t>(c - first_page + 1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = lo + i;
    toks[i] = {sched.token_stream(request, static_cast<int>(p)), static_cast<int32_t>(p), 0};
    slots[i] = static_cast<int32_t>(table[p / P] * P + p % P);
  }
  Buffer k = Buffer::empty({n, Hkv, D}, q_dtype, Device::cpu());
  Buffer v = Buffer::empty({n, Hkv, D}, q_dtype, Device::cpu());
  fill_tokens_host(k.view({n, Hkv, D}, q_dtype), toks.data(), n, seed, layer, TokenTensor::k);
  fill_tokens_host(v.view({n, Hkv, D}, q_dtype), toks.data(), n, seed, layer, TokenTensor::v);
  const bool fp8 = kv_dtype == DType::fp8_e4m3;
  const float ks = fp8 ? kFp8Scale : 1.0f, vs = fp8 ? kFp8Scale : 1.0f;
  const TensorView kcv = kc.view({(held + 1) * P, Hkv, D}, kv_dtype);
  const TensorView vcv = vc.view({(held + 1) * P, Hkv, D}, kv_dtype);
  append_kv(k.view({n, Hkv, D}, q_dtype), v.view({n, Hkv, D}, q_dtype), kcv, vcv,
            TensorView(slots.data(), DType::int32, Device::cpu(), {n}), P, ks, vs);
  Buffer q = Buffer::empty({1, Hq, D}, q_dtype, Device::cpu());
  const TokenRef qt{sched.token_stream(request, position), position, 0};
  fill_tokens_host(q.view({1, Hq, D}, q_dtype), &qt, 1, seed, layer, TokenTensor::q);
  Buffer out = Buffer::empty({1, Hq, D}, q_dtype, Device::cpu());
  std::vector<float> sinks(Hq);
  for (int h = 0; h < Hq; ++h) sinks[h] = sink_value(seed, layer, h);
  AttentionParams params;
  params.bmm1_scale = ks / std::sqrt(static_cast<float>(D));
  params.bmm2_scale = vs;
  params.window_left = w;
  if (m.sinks) params.sinks = TensorView(sinks.data(), DType::fp32, Device::cpu(), {Hq});
  int32_t seq_len = static_cast<int32_t>(L), cu[2] = {0, 1};
  batch_prefill(q.view({1, Hq, D}, q_dtype), kcv, vcv, TensorView(table.data(), DType::int32, Device::cpu(), {1, pages}),
                TensorView(&seq_len, DType::int32, Device::cpu(), {1}),
                TensorView(cu, DType::int32, Device::cpu(), {2}), P, 1, out.view({1, Hq, D}, q_dtype), params);
  std::vector<float> f(int64_t{Hq} * D);
  for (size_t i = 0; i < f.size(); ++i)
    f[i] = q_dtype == DType::bf16 ? bf16_to_float(static_cast<const uint16_t*>(out.data())[i]) : fp16_to_float(static_cast<const uint16_t*>(out.data())[i]);
  return f;
}

// Capture points of a checked step: up to `rows` batch rows picked by hash, their first
// and last queries, in the first layer of each cache group and the last layer.
std::vector<CapturePoint> pick_checks(const StepPlan& plan, const ModelSpec& m, int rows, uint64_t seed,
                                      std::vector<std::pair<int, int>>* query_of /* (request, position) */) {
  std::vector<int> layers;
  for (size_t g = 0; g < m.groups.size(); ++g)
    for (int l = 0; l < m.num_layers; ++l)
      if (m.layer_group[l] == static_cast<int>(g)) {
        layers.push_back(l);
        break;
      }
  if (std::find(layers.begin(), layers.end(), m.num_layers - 1) == layers.end()) layers.push_back(m.num_layers - 1);
  std::vector<int64_t> row_start(plan.rows.size() + 1, 0);
  for (size_t i = 0; i < plan.rows.size(); ++i) row_start[i + 1] = row_start[i] + plan.rows[i].q_len;
  std::vector<size_t> picked;
  const size_t want = std::min<size_t>(rows, plan.rows.size());
  for (uint64_t salt = 0; picked.size() < want; ++salt) {
    const size_t i = hash_words(seed, 0xC4EC4ull, plan.step, salt) % plan.rows.size();
    if (std::find(picked.begin(), picked.end(), i) == picked.end()) picked.push_back(i);
  }
  std::vector<CapturePoint> points;
  for (size_t i : picked) {
    const RowPlan& r = plan.rows[i];
    std::vector<int> qs = {r.q_len - 1};
    if (r.q_len > 1) qs.push_back(0);
    for (int qi : qs)
      for (int l : layers) {
        points.push_back({row_start[i] + qi, l});
        query_of->push_back({r.request, r.prefix_len + qi});
      }
  }
  return points;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// Bytes one row moves in one layer: K and V of `keys` keys over kv_heads heads, Q and O of
// q_len queries over q_heads heads (element sizes kv_bytes, q_bytes).
double row_layer_bytes(int64_t keys, int64_t q_len, int kv_heads, int q_heads, int head_dim, double kv_bytes,
                       double q_bytes) {
  return double(keys) * kv_heads * head_dim * 2.0 * kv_bytes + double(q_len) * q_heads * head_dim * 2.0 * q_bytes;
}

// Each rank's share of a step's bytes: K/V of the keys it holds and reads + Q + O, every
// layer. TP: its KV and query heads. DCP: all heads; in full-attention layers the keys of
// its pages (DcpLayout), in sliding-window layers (held whole) every visible key.
void add_rank_bytes(ReplayResult& res, const StepPlan& plan, double kv_bytes, double q_bytes) {
  const ModelSpec& m = res.model;
  const int n = res.ranks.ranks;
  if (res.ranks.mode == RankMode::single) return;
  res.rank_bytes.resize(n, 0.0);
  const DcpLayout layout{n, res.options.page_size};
  for (int r = 0; r < n; ++r) {
    const TpShard& s = res.shards[r];
    double bytes = 0.0;
    for (const RowPlan& row : plan.rows)
      for (int l = 0; l < m.num_layers; ++l) {
        const int w = m.window_left(l);
        const int64_t keys = res.ranks.mode == RankMode::dcp && w < 0 ? layout.local_len(r, row.seq_len)
                                                                      : keys_read(row.seq_len, row.q_len, w);
        bytes += row_layer_bytes(keys, row.q_len, s.kv_heads, s.q_heads, m.head_dim, kv_bytes, q_bytes);
      }
    res.rank_bytes[r] += bytes;
  }
}

// --gpus / --tp / --dcp / --baseline-json (-1: not given): one rank per device, and the
// ranks split either the heads (--tp) or the KV (--dcp), not both.
void check_rank_options(const ReplayOptions& o) {
  const auto bad = [](const char* arg, const std::string& expected, const std::string& got) {
    throw_invalid_argument("replay", arg, expected, got);
  };
  if (o.gpus != -1 && (o.gpus < 1 || o.gpus > kMaxRanks))
    bad("--gpus", "1.." + std::to_string(kMaxRanks) + " ranks (one device each)", std::to_string(o.gpus));
  if (o.dcp != -1 && o.dcp < 1) bad("--dcp", ">= 1 ranks", std::to_string(o.dcp));
  if (o.gpus == -1) {
    if (o.dcp != -1)
      bad("--dcp", "--gpus " + std::to_string(o.dcp) + " with it (one device per rank)",
          "--dcp " + std::to_string(o.dcp) + " without --gpus");
    if (!o.baseline_json.empty())
      bad("--baseline-json", "--gpus (the baseline is compared with a multi-rank run)", "no --gpus");
    return;
  }
  const std::string n = std::to_string(o.gpus);
  if (o.dcp != -1) {
    if (o.dcp != o.gpus) bad("--dcp", "--gpus (" + n + "): one rank per device", std::to_string(o.dcp));
    if (o.overrides.tp != 1)
      bad("--tp", "1 with --dcp (tensor and context parallelism together are not implemented)",
          std::to_string(o.overrides.tp));
  } else if (o.overrides.tp != o.gpus) {
    bad("--tp", n + " (= --gpus: one rank per device), or --dcp " + n, std::to_string(o.overrides.tp));
  }
  if (o.dry_run) bad("--dry-run", "no --gpus (a dry run schedules for one device)", "--gpus " + n);
}

}  // namespace

Device parse_device(const std::string& name, const char* cmd) {
  if (name == "cpu") return Device::cpu();
  if (name == "cuda") {
    if (!cuda_available()) throw_invalid_argument(cmd, "--device", "a visible CUDA device (built with CUDA)", "cuda");
    return Device::cuda(0);
  }
  if (name == "auto") return cuda_available() ? Device::cuda(0) : Device::cpu();
  throw_invalid_argument(cmd, "--device", "auto, cpu or cuda", name);
}

ReplayOptions resolve_replay_defaults(const ReplayOptions& in, Device device) {
  ReplayOptions o = in;
  // A dry run plans the GPU run wherever it runs: GPU sizes and the H200's ceilings.
  const bool gpu = device.is_cuda() || o.dry_run;
  if (o.model.empty()) {
    o.model = "llama3-8b";
    if (!gpu && o.overrides.layers < 0) o.overrides.layers = 2;
  }
  if (o.requests < 0 && o.trace.empty()) o.requests = gpu ? 1000 : 8;
  if (o.pages < 0 && o.kv_memory_gb < 0) {
    if (gpu) o.kv_memory_gb = 40.0;
    else o.pages = 2048;
  }
  if (o.token_budget < 0) o.token_budget = gpu ? 8192 : 2048;
  if (o.max_running < 0) o.max_running = gpu ? 256 : 16;
  if (o.check_every < 0) o.check_every = gpu ? 200 : 16;
  if (o.ceiling_read_tbps < 0) o.ceiling_read_tbps = gpu ? 4.6 : 0.0;
  if (o.ceiling_tflops < 0) o.ceiling_tflops = gpu ? 760.0 : 0.0;
  if (o.dry_run) o.check_every = 0;
  return o;
}

int64_t visible_pairs(int64_t L, int64_t n, int w) { return MaskVariant{true, w}.pairs(L, n); }

int64_t keys_read(int64_t L, int64_t n, int w) { return MaskVariant{true, w}.keys_read(L, n); }

void check_replay_options(const ReplayOptions& given) {
  parse_device(given.device);
  parse_kv_dtype(given.kv_dtype);
  parse_trace_format(given.format);
  // The built-in workload has no file format: a format without a trace is a mistake.
  if (given.trace.empty() && given.format != "auto")
    throw_invalid_argument("replay", "--format", "a --trace file to read with it", "--format " +
                           quote_bytes(given.format) + " without --trace");
  // -1 is "not given"; any other value must be meaningful (the CLI checks these too).
  if (given.kv_memory_gb != -1.0 && !(given.kv_memory_gb > 0.0 && std::isfinite(given.kv_memory_gb)))
    throw_invalid_argument("replay", "--kv-memory", "> 0 GB, finite", std::to_string(given.kv_memory_gb));
  const auto not_given_or = [](int64_t v, int64_t lo, const char* arg, const std::string& expected) {
    if (v != -1 && v < lo) throw_invalid_argument("replay", arg, expected, std::to_string(v));
  };
  not_given_or(given.pages, 2, "--pages", ">= 2 pages per cache group (page 0 is reserved)");
  not_given_or(given.token_budget, 1, "--token-budget", ">= 1 tokens");
  not_given_or(given.max_running, 1, "--max-running", ">= 1 requests");
  not_given_or(given.check_every, 0, "--check-every", ">= 0 steps (0: off)");
  not_given_or(given.max_steps, 0, "--max-steps", ">= 0 steps (-1: no limit)");
  if (given.check_rows < 1)
    throw_invalid_argument("replay", "--check-rows", ">= 1 rows", std::to_string(given.check_rows));
  if (given.page_size < 1 || given.page_size > 4096)
    throw_invalid_argument("replay", "--page-size", "1..4096 tokens", std::to_string(given.page_size));
  for (const auto& [arg, v] : {std::pair<const char*, double>{"--ceiling-read-tbps", given.ceiling_read_tbps},
                               std::pair<const char*, double>{"--ceiling-tflops", given.ceiling_tflops}}) {
    if (v != -1.0 && !(v >= 0.0 && std::isfinite(v)))
      throw_invalid_argument("replay", arg, ">= 0 and finite (0: no roofline figures)", std::to_string(v));
  }
  // Written so that NaN fails too.
  if (!(given.accept_rate >= 0.0 && given.accept_rate <= 1.0))
    throw_invalid_argument("replay", "--accept-rate", "a probability in [0, 1]", std::to_string(given.accept_rate));
  if (given.requests != -1 && (given.requests < 1 || given.requests > kMaxReplayRequests))
    throw_invalid_argument("replay", "--requests", "1.." + std::to_string(kMaxReplayRequests),
                           std::to_string(given.requests));
  if (given.spec_tokens < 1 || given.spec_tokens > 8)
    throw_invalid_argument("replay", "--spec-tokens", "1..8 (the backend's limit)", std::to_string(given.spec_tokens));
  check_rank_options(given);
}

RankSetup rank_setup(const ReplayOptions& o) {
  if (o.gpus == -1) return {};
  return {o.dcp != -1 ? RankMode::dcp : RankMode::tp, o.gpus};
}

ReplayResult run_replay(const ReplayOptions& given) {
  const auto wall0 = std::chrono::steady_clock::now();
  check_replay_options(given);
  ReplayResult res;
  res.device = parse_device(given.device);
  const ReplayOptions o = resolve_replay_defaults(given, res.device);
  res.options = o;
  res.ranks = rank_setup(o);
  const int nranks = res.ranks.ranks;
  const bool multi = res.ranks.mode != RankMode::single, dcp = res.ranks.mode == RankMode::dcp;
  ModelOverrides ov = o.overrides;
  if (multi) ov.tp = 1;  // the ranks split the whole model (tp_shard below names a bad --tp)
  res.model = make_model(o.model, ov);
  const ModelSpec& m = res.model;
  for (int r = 0; multi && r < nranks; ++r)
    res.shards.push_back(dcp ? TpShard{0, m.num_q_heads, 0, m.num_kv_heads}
                             : tp_shard(m.num_q_heads, m.num_kv_heads, nranks, r));
  // Each device holds the K/V of its own KV heads.
  const int device_kv_heads = multi ? res.shards[0].kv_heads : m.num_kv_heads;
  if (multi && res.device.is_cuda()) check_rank_devices(nranks);
  if (!o.baseline_json.empty()) res.baseline = load_scaling_baseline(o.baseline_json, o, m);
  const DType kv_dtype = parse_kv_dtype(o.kv_dtype);
  const DType q_dtype = kv_dtype == DType::fp16 ? DType::fp16 : DType::bf16;

  std::vector<Request> reqs = o.trace.empty()
                                  ? default_workload(static_cast<int>(o.requests), o.seed)
                                  : load_trace(o.trace, parse_trace_format(o.format), o.requests);
  if (reqs.empty()) throw_invalid_argument("replay", "--trace", "at least one request", o.trace);
  // 64-bit sums: a request's KV length must fit the backend's int32 context length.
  int64_t context_len = 0, all_tokens = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Request& r = reqs[i];
    const int64_t kv = int64_t{r.prompt_len} + r.output_len + o.spec_tokens;
    if (r.prompt_len < 1 || r.output_len < 1 || int64_t{r.prompt_len} + r.output_len > kMaxRequestTokens)
      throw_invalid_argument("replay", "--trace", "requests of 1..2^30 prompt + output tokens",
                             "request " + std::to_string(i) + " of " + std::to_string(r.prompt_len) + " + " +
                                 std::to_string(r.output_len));
    res.prompt_tokens += r.prompt_len;
    res.output_tokens += r.output_len;
    context_len = std::max(context_len, kv);
    all_tokens += kv;
  }
  res.requests = static_cast<int64_t>(reqs.size());

  // Pages per group: --pages, or --kv-memory spread over every layer's K and V.
  const double bytes_per_page_all_layers = double(o.page_size) * device_kv_heads * m.head_dim * 2.0 *
                                           double(dtype_size(kv_dtype)) * m.num_layers;
  int64_t pages = o.pages;
  if (pages < 0) {
    // Range-checked as a double: a huge --kv-memory must not overflow the cast.
    const double want = std::floor(o.kv_memory_gb * 1e9 / bytes_per_page_all_layers);
    if (!(want >= 2.0 && want <= double(std::numeric_limits<int32_t>::max())))
      throw_invalid_argument("replay", "--kv-memory",
                             "room for 2..2^31-1 pages per cache group (" + fmt("%.0f", bytes_per_page_all_layers) +
                                 " bytes per page over all layers)",
                             fmt("%g GB", o.kv_memory_gb) + " (" + fmt("%.4g", want) + " pages)");
    pages = static_cast<int64_t>(want);
  }
  res.pages_per_group = pages;
  // The KV pool against the device's memory: a pool past it is a usage error here, before
  // the scheduler's per-page state or the pool is allocated (the allocation would succeed,
  // overcommitted, and the process be killed while filling it).
  // CPU ranks (--gpus N on the CPU) each hold a pool in the one host memory.
  const int pools = multi && res.device.is_cpu() ? nranks : 1;
  const double pool_bytes = double(pages) * bytes_per_page_all_layers * pools;
  if (const double have = memory_bytes(res.device); !o.dry_run && have > 0 && pool_bytes > have) {
    throw_invalid_argument("replay", o.pages >= 0 ? "--pages" : "--kv-memory",
                           "a KV pool within " + res.device.str() + "'s " + fmt("%.1f", have / 1e9) + " GB",
                           fmt("%.1f GB", pool_bytes / 1e9) + ": " + std::to_string(pages) + " pages of " +
                               std::to_string(o.page_size) + " tokens over " + std::to_string(m.num_layers) +
                               " layers" + (pools > 1 ? " x " + std::to_string(pools) + " ranks" : ""));
  }

  SchedulerConfig sc;
  sc.page_size = o.page_size;
  sc.num_pages = pages;
  sc.token_budget = o.token_budget;
  sc.max_running = o.max_running;
  sc.spec_tokens = o.spec_tokens;
  sc.accept_rate = o.accept_rate;
  sc.prefix_cache = o.prefix_cache;
  sc.seed = o.seed;
  sc.host_tables = false;  // the executor keeps device tables from the requests' pages
  sc.cp_ranks = dcp ? nranks : 1;
  Scheduler sched(m, sc, std::move(reqs));

  // Buffers hold what a step can use: each query token takes a pool slot and each row at
  // least one token, so a huge --token-budget / --max-running ("no limit") sizes nothing.
  const int64_t pool_tokens = (pages - 1) * o.page_size * (dcp ? nranks : 1);
  const int64_t step_tokens = std::min({int64_t{o.token_budget}, pool_tokens, all_tokens});
  const int64_t step_rows = std::min({int64_t{o.max_running}, res.requests, step_tokens});

  ExecutorConfig ec;
  ec.model = m;
  ec.device = res.device;
  ec.kv_dtype = kv_dtype;
  ec.q_dtype = q_dtype;
  ec.page_size = o.page_size;
  ec.num_pages = pages;
  ec.context_len = static_cast<int>(context_len);
  ec.max_tokens = static_cast<int>(step_tokens);
  ec.max_rows = static_cast<int>(step_rows);
  ec.spec_tokens = o.spec_tokens;
  ec.k_scale = ec.v_scale = kv_dtype == DType::fp8_e4m3 ? kFp8Scale : 1.0f;
  ec.seed = o.seed;
  ec.cuda_graphs = o.cuda_graphs;
  std::unique_ptr<AttentionExecutor> exec;
  try {
    exec = o.dry_run ? make_dry_run_executor() : multi ? make_ranked_executor(ec, res.ranks) : make_backend_executor(ec);
  } catch (const Error& e) {
    if (std::string(e.what()).find("--gpus") != std::string::npos) throw;  // NCCL and its devices
    // Name the flags that size the buffers (a failed allocation names only bytes).
    throw Error("replay: --pages / --token-budget / --max-running: expected buffers that fit on " +
                res.device.str() + " for " + std::to_string(pages) + " pages, " + std::to_string(step_tokens) +
                " tokens and " + std::to_string(step_rows) + " rows per step, got: " + e.what());
  }
  res.executor = exec->name();

  const double q_bytes = double(dtype_size(q_dtype)), kv_bytes = double(dtype_size(kv_dtype));
  const double tokens_total = double(res.prompt_tokens + res.output_tokens);
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count(); };
  // Progress: one line every ~2 s (newline-terminated, so a redirected log shows how far it got).
  double next_progress = 2.0;
  int64_t last_steps = 0;
  double last_t = 0.0;
  const auto progress = [&](bool final_line) {
    const double t = elapsed();
    const int64_t n = static_cast<int64_t>(res.steps.size());
    const double rate = t > last_t ? double(n - last_steps) / (t - last_t) : 0.0;
    // Prompt tokens served from the prefix cache are done without being computed.
    const SchedulerStats& st = sched.stats();
    const double done_tokens = double(st.prefill_tokens + st.prefix_hit_tokens + st.generated_tokens);
    std::fprintf(stderr,
                 "[replay] %7.1f s  steps %lld  finished %lld/%lld  running %lld  waiting %lld  tokens %.0f (%.1f%%)  "
                 "%.1f steps/s%s\n",
                 t, static_cast<long long>(n), static_cast<long long>(sched.finished()),
                 static_cast<long long>(res.requests), static_cast<long long>(sched.running()),
                 static_cast<long long>(sched.waiting()), done_tokens,
                 100.0 * std::min(1.0, done_tokens / std::max(tokens_total, 1.0)), rate, final_line ? "  (end)" : "");
    std::fflush(stderr);
    last_steps = n, last_t = t;
  };
  while (!sched.done() && (o.max_steps < 0 || static_cast<int64_t>(res.steps.size()) < o.max_steps)) {
    if (o.time_limit_s >= 0 && elapsed() >= o.time_limit_s) break;
    const auto ts0 = std::chrono::steady_clock::now();
    const StepPlan plan = sched.schedule();
    double schedule_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts0).count();
    const bool check = o.check_every > 0 && plan.step % o.check_every == 0;
    std::vector<std::pair<int, int>> queries;
    const std::vector<CapturePoint> points =
        check ? pick_checks(plan, m, o.check_rows, o.seed, &queries) : std::vector<CapturePoint>{};
    std::vector<std::vector<float>> got;
    StepRecord rec;
    rec.step = plan.step;
    rec.attention_s = exec->run_step(plan, sched.states(), points, &got);
    rec.step_s = rec.attention_s;
    rec.ranks = exec->take_rank_times();
    for (const RankTimes& t : rec.ranks) {
      rec.combine_s = std::max(rec.combine_s, t.combine_s);
      rec.step_s = std::max(rec.step_s, t.attention_s + t.combine_s);
    }
    const StepHostTimes host = exec->take_host_times();
    rec.metadata_s = host.metadata_s;
    rec.prepare_s = host.prepare_s;
    rec.capture_s = host.capture_s;
    rec.rows = static_cast<int>(plan.rows.size());
    rec.extend_rows = plan.num_extend;
    for (int i = 0; i < plan.num_extend; ++i) rec.extend.push_back({plan.rows[i].q_len, plan.rows[i].seq_len});
    rec.decode_rows = plan.num_decode();
    rec.tokens = plan.num_tokens();
    for (const RowPlan& r : plan.rows) {
      rec.kv_tokens += r.seq_len;
      for (int l = 0; l < m.num_layers; ++l) {
        const int w = m.window_left(l);
        rec.bytes += row_layer_bytes(keys_read(r.seq_len, r.q_len, w), r.q_len, m.num_kv_heads, m.num_q_heads,
                                     m.head_dim, kv_bytes, q_bytes);
        rec.flops += 4.0 * m.num_q_heads * m.head_dim * double(visible_pairs(r.seq_len, r.q_len, w));
      }
    }
    add_rank_bytes(res, plan, kv_bytes, q_bytes);
    rec.pages_in_use = sched.used_pages();
    rec.live_pages = sched.live_pages();
    if (check) {
      ++res.check.steps_checked;
      const int nr = exec->ranks();
      for (size_t i = 0; i < points.size() && res.check.ok; ++i) {
        const std::vector<float> ref = reference_row(m, sched, points[i].layer, queries[i].first, queries[i].second,
                                                     kv_dtype, q_dtype, o.seed);
        // Every rank holds the combined output: each is checked.
        for (int rank = 0; rank < nr; ++rank) {
          const std::vector<float>& row = got[rank * points.size() + i];
          double num = 0, den = 0;
          bool finite = row.size() == ref.size();
          for (size_t j = 0; finite && j < ref.size(); ++j) {
            finite &= std::isfinite(row[j]);
            num += (double(row[j]) - ref[j]) * (double(row[j]) - ref[j]);
            den += double(ref[j]) * ref[j];
          }
          const double rel = std::sqrt(num / std::max(den, 1e-30));
          ++res.check.rows_checked;
          res.check.max_rel_err = std::max(res.check.max_rel_err, finite ? rel : INFINITY);
          // bf16 / fp16 outputs: both sides round once to 8 / 11 mantissa bits.
          const double tol = q_dtype == DType::bf16 ? 1e-2 : 2e-3;
          if (!finite || !(rel <= tol)) {
            res.check.ok = false;
            res.check.failure = (multi ? "rank " + std::to_string(rank) + ", " : std::string()) + "step " +
                                std::to_string(plan.step) + ", request " + std::to_string(queries[i].first) +
                                ", position " + std::to_string(queries[i].second) + ", layer " +
                                std::to_string(points[i].layer) + ": relative L2 error " + fmt("%.3g", rel) +
                                " > " + fmt("%.0e", tol) + (finite ? "" : " (non-finite output)");
            break;
          }
        }
      }
    }
    const auto tc0 = std::chrono::steady_clock::now();
    sched.complete(plan);
    schedule_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - tc0).count();
    rec.schedule_s = schedule_s;
    rec.running = sched.running();
    rec.waiting = sched.waiting();
    res.steps.push_back(rec);
    if (!res.check.ok) break;
    if (o.progress && elapsed() >= next_progress) {
      progress(false);
      next_progress = elapsed() + 2.0;
    }
  }
  if (o.progress) progress(true);
  sched.check_invariants();
  res.sched = sched.stats();
  res.finished = sched.finished();
  res.truncated = !sched.done() && res.check.ok;
  res.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return res;
}

int replay_main(const ReplayOptions& options) {
  check_replay_options(options);  // before --json is touched
  if (!options.json.empty()) {
    // Checked before the run: a long GPU replay must not end in an unwritable report.
    // Appending creates no content; a file created only for this check is removed.
    const bool existed = std::filesystem::exists(options.json);
    if (!std::ofstream(options.json, std::ios::app))
      throw_invalid_argument("replay", "--json", "a writable file", options.json);
    if (!existed) std::filesystem::remove(options.json);
  }
  const ReplayResult r = run_replay(options);
  if (!options.quiet) std::fputs(replay_summary(r).c_str(), stdout);
  if (!options.json.empty()) {
    std::ofstream f(options.json);
    if (!f) throw_invalid_argument("replay", "--json", "a writable file", options.json);
    f << replay_report_json(r).dump() << "\n";  // compact: columns of numbers
  }
  if (!r.check.ok) {
    std::fprintf(stderr, "replay: check failed: %s\n", r.check.failure.c_str());
    return 3;
  }
  return 0;
}

}  // namespace pagedmha::tools
