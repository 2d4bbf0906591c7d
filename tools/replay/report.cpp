// The replay's report: the JSON document (--json) and the final table.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "pagedmha/error.h"
#include "replay/device_info.h"
#include "replay/replay.h"
#include "report_paths.h"

namespace pagedmha::tools {
namespace {

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// Per-rank totals over the run (several ranks).
struct RankTotals {
  double attention_s = 0.0, combine_s = 0.0;
};

std::vector<RankTotals> rank_totals(const ReplayResult& r) {
  std::vector<RankTotals> t(r.ranks.mode == RankMode::single ? 0 : r.ranks.ranks);
  for (const StepRecord& s : r.steps)
    for (size_t i = 0; i < s.ranks.size() && i < t.size(); ++i) {
      t[i].attention_s += s.ranks[i].attention_s;
      t[i].combine_s += s.ranks[i].combine_s;
    }
  return t;
}

// The ranks' part of the report (null on one device).
nlohmann::json ranks_json(const ReplayResult& r) {
  using nlohmann::json;
  if (r.ranks.mode == RankMode::single) return nullptr;
  const bool dcp = r.ranks.mode == RankMode::dcp;
  const std::vector<RankTotals> totals = rank_totals(r);
  json per = json::array();
  for (int i = 0; i < r.ranks.ranks; ++i) {
    const TpShard& s = r.shards[i];
    const double bytes = i < static_cast<int>(r.rank_bytes.size()) ? r.rank_bytes[i] : 0.0;
    const double att = totals[i].attention_s;
    json pages = json::array();  // DCP: pages of each group in this rank's pool (peak)
    for (const std::vector<int64_t>& g : r.sched.peak_owner_pages)
      pages.push_back(g.size() > 1 ? g[i] : g.empty() ? 0 : g[0]);
    per.push_back({{"rank", i},
                   {"device", r.device.is_cuda() ? Device::cuda(i).str() : r.device.str()},
                   {"q_heads", s.q_heads}, {"q_head_begin", s.q_begin},
                   {"kv_heads", s.kv_heads}, {"kv_head_begin", s.kv_begin},
                   {"attention_time_s", att}, {"combine_time_s", totals[i].combine_s},
                   {"attention_plus_combine_time_s", att + totals[i].combine_s},
                   {"bytes", bytes}, {"achieved_tbps", att > 0 ? json(bytes / att / 1e12) : json(nullptr)},
                   {"peak_pages", pages}});
  }
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  return {{"mode", r.ranks.mode_name()}, {"count", r.ranks.ranks},
          {"combine", dcp ? "per full-attention layer: all-gather of every rank's (o, lse) partial, then "
                            "merge_attention_states with the sinks (sliding-window layers: every rank holds them whole)"
                          : "per layer: all-reduce (sum) of a [T, Hq * D] buffer holding each rank's heads, zeros "
                            "elsewhere (the collective of a row-parallel o_proj)"},
          {"kv_split", dcp ? json("pages round-robin: position p on rank (p / page_size) % ranks") : json(nullptr)},
          {"nccl_nvls_enable", r.device.is_cuda() && nvls ? json(nvls) : json(nullptr)},
          {"per_rank", per}};
}

// Scaling against the one-device baseline (null without --baseline-json).
nlohmann::json scaling_json(const ReplayResult& r, double step_total, double att_total, double dec_step_total,
                            int64_t steps) {
  using nlohmann::json;
  if (!r.baseline) return nullptr;
  const ScalingBaseline& b = *r.baseline;
  const int n = r.ranks.ranks;
  const auto ratio = [](double x, double y) { return x > 0 && y > 0 ? json(x / y) : json(nullptr); };
  const bool same = b.steps == steps && b.prefill_tokens == r.sched.prefill_tokens &&
                    b.decode_tokens == r.sched.decode_tokens && b.generated_tokens == r.sched.generated_tokens;
  return {{"baseline", b.path}, {"baseline_device", b.device}, {"baseline_gpu", b.gpu.empty() ? json(nullptr) : json(b.gpu)},
          {"baseline_commit", b.commit}, {"baseline_truncated", b.truncated},
          {"baseline_attention_time_s", b.attention_s},
          {"baseline_attention_time_decode_steps_s", b.decode_attention_s >= 0 ? json(b.decode_attention_s) : json(nullptr)},
          // Same steps, tokens and acceptances: the runs did the same work step for step.
          {"same_schedule", same},
          // T1 / (N * TN): 1 is perfect scaling; TN counts the slowest rank of every step.
          {"efficiency", ratio(b.attention_s, n * step_total)},
          {"efficiency_attention_only", ratio(b.attention_s, n * att_total)},
          {"time_ratio", ratio(step_total, b.attention_s)},
          {"time_ratio_decode_steps", b.decode_attention_s >= 0 ? ratio(dec_step_total, b.decode_attention_s) : json(nullptr)}};
}

}  // namespace

[[noreturn]] static void bad_baseline(const std::string& expected, const std::string& got) {
  throw_invalid_argument("replay", "--baseline-json", expected, got);
}

ScalingBaseline load_scaling_baseline(const std::string& path, const ReplayOptions& o, const ModelSpec& model) {
  using nlohmann::json;
  const auto bad = bad_baseline;
  std::ifstream f(path);
  if (!f) bad("a readable replay report (--json of a one-device run)", path);
  json j;
  try {
    j = json::parse(f);
  } catch (const std::exception& e) {
    bad("a replay report (JSON)", path + ": " + e.what());
  }
  try {
    if (j.value("tool", "") != "pagedmha replay") bad("a pagedmha replay report", path);
    if (j.contains("ranks") && !j["ranks"].is_null() && j["ranks"].value("count", 1) != 1)
      bad("a one-device report", path + " ran " + std::to_string(j["ranks"].value("count", 1)) + " ranks");
    const json& opt = j.at("options");
    const json& mod = j.at("model");
    const json& sum = j.at("summary");
    if (opt.value("dry_run", false)) bad("a report of a run that timed attention", path + " is a dry run");
    const std::string trace = o.trace.empty() ? "built-in" : repo_relative(o.trace, PAGEDMHA_SOURCE_DIR);
    const auto same = [&](const char* what, const json& got, const json& want) {
      if (got != want) bad(std::string("the same ") + what + " as this run (" + want.dump() + ")", path + " has " + got.dump());
    };
    same("trace", opt.at("trace"), trace);
    same("requests", opt.at("requests"), o.requests);
    same("model", opt.at("model"), o.model);
    same("layers", mod.at("layers"), model.num_layers);
    same("query heads (the whole model: no --tp)", mod.at("q_heads"), model.num_q_heads);
    same("KV heads", mod.at("kv_heads"), model.num_kv_heads);
    same("head dim", mod.at("head_dim"), model.head_dim);
    same("kv_dtype", opt.at("kv_dtype"), o.kv_dtype);
    same("page_size", opt.at("page_size"), o.page_size);
    same("token_budget", opt.at("token_budget"), o.token_budget);
    same("max_running", opt.at("max_running"), o.max_running);
    same("spec_tokens", opt.at("spec_tokens"), o.spec_tokens);
    same("accept_rate", opt.at("accept_rate"), o.accept_rate);
    same("prefix_cache", opt.at("prefix_cache"), o.prefix_cache);
    same("seed", opt.at("seed"), o.seed);
    ScalingBaseline b;
    b.path = repo_relative(path, PAGEDMHA_SOURCE_DIR);
    if (!sum.at("attention_time_s").is_number()) bad("a report with an attention time", path);
    b.attention_s = sum.at("attention_time_s").get<double>();
    if (sum.contains("attention_time_decode_steps_s") && sum["attention_time_decode_steps_s"].is_number())
      b.decode_attention_s = sum["attention_time_decode_steps_s"].get<double>();
    b.steps = sum.at("steps").get<int64_t>();
    b.prefill_tokens = sum.at("prefill_tokens_computed").get<int64_t>();
    b.decode_tokens = sum.at("decode_query_tokens").get<int64_t>();
    b.generated_tokens = sum.at("generated_tokens").get<int64_t>();
    b.truncated = j.value("truncated", false);
    b.device = j.value("device", "");
    b.gpu = j.contains("gpu") && j["gpu"].is_string() ? j["gpu"].get<std::string>() : "";
    b.commit = j.value("commit", "unknown");
    return b;
  } catch (const json::exception& e) {
    bad_baseline("a replay report with options, model and summary", path + ": " + e.what());
  }
}
std::string build_commit() {
  if (const char* env = std::getenv("PAGEDMHA_COMMIT"); env && *env) return env;
#ifdef PAGEDMHA_GIT_SHA
  if (*PAGEDMHA_GIT_SHA) return PAGEDMHA_GIT_SHA;
#endif
  return "unknown";
}

nlohmann::json replay_report_json(const ReplayResult& r) {
  using nlohmann::json;
  const ReplayOptions& o = r.options;
  const double read_bps = o.ceiling_read_tbps * 1e12, flops_ps = o.ceiling_tflops * 1e12;
  const bool roofline = read_bps > 0 && flops_ps > 0;
  // Roofline floor of a step (PERFORMANCE.md: bytes and flops over the ceilings): the
  // slower of streaming its bytes and computing its flops.
  const auto floor_s = [&](const StepRecord& s) { return roofline ? std::max(s.bytes / read_bps, s.flops / flops_ps) : 0.0; };
  double att = 0, meta = 0, prep = 0, sched_s = 0, capture = 0, bytes = 0, flops = 0, floor = 0;
  double dec_att = 0, dec_bytes = 0, dec_floor = 0, ext_att = 0, ext_flops = 0, ext_floor = 0;
  double dec_meta = 0, max_meta = 0, step_total = 0, combine = 0, dec_step = 0;
  int64_t dec_steps = 0;
  for (const StepRecord& s : r.steps) {
    att += s.attention_s, meta += s.metadata_s, prep += s.prepare_s, sched_s += s.schedule_s, capture += s.capture_s;
    step_total += s.step_s, combine += s.combine_s;
    if (s.extend_rows == 0) dec_step += s.step_s;
    bytes += s.bytes, flops += s.flops, floor += floor_s(s);
    max_meta = std::max(max_meta, s.metadata_s);
    if (s.extend_rows == 0) {
      dec_att += s.attention_s, dec_bytes += s.bytes, dec_floor += floor_s(s), dec_meta += s.metadata_s, ++dec_steps;
    } else {
      ext_att += s.attention_s, ext_flops += s.flops, ext_floor += floor_s(s);
    }
  }
  const DeviceCeilings c = device_ceilings_of(r.device);
  // Figures over a measured time are null when nothing was timed (a dry run, no steps of
  // that kind): NaN marks them here and `val` turns it into null.
  const auto rate = [](double x, double t) { return t > 0 ? x / t : std::nan(""); };
  const auto val = [](double x) { return std::isfinite(x) ? json(x) : json(nullptr); };
  const auto ratio = [&](double x) { return roofline ? val(x) : json(nullptr); };
  const double tbps = rate(bytes, att) / 1e12, tflops = rate(flops, att) / 1e12;
  const double dec_tbps = rate(dec_bytes, dec_att) / 1e12, ext_tflops = rate(ext_flops, ext_att) / 1e12;
  const int64_t steps = static_cast<int64_t>(r.steps.size());
  const auto per_step_us = [&](double x, int64_t n) { return n ? x / n * 1e6 : 0.0; };
  json j;
  j["tool"] = "pagedmha replay";
  j["command"] = o.command.empty() ? json(nullptr) : json(o.command);
  j["commit"] = build_commit();
  j["device"] = r.device.str();
  j["gpu"] = c.gpu.empty() ? json(nullptr) : json(c.gpu);
  j["executor"] = r.executor;
  j["truncated"] = r.truncated;  // stopped by --time-limit / --max-steps: the summary covers the steps run
  // Repository-relative, as in the command: never a path of the machine that ran.
  const std::string trace = o.trace.empty() ? "built-in" : repo_relative(o.trace, PAGEDMHA_SOURCE_DIR);
  j["options"] = {{"trace", trace}, {"format", o.format}, {"requests", o.requests},
                  {"model", o.model}, {"kv_dtype", o.kv_dtype}, {"page_size", o.page_size},
                  {"pages_per_group", r.pages_per_group}, {"token_budget", o.token_budget},
                  {"max_running", o.max_running}, {"spec_tokens", o.spec_tokens}, {"accept_rate", o.accept_rate},
                  {"prefix_cache", o.prefix_cache}, {"cuda_graphs", o.cuda_graphs}, {"check_every", o.check_every},
                  {"seed", o.seed}, {"max_steps", o.max_steps}, {"dry_run", o.dry_run},
                  {"gpus", o.gpus >= 1 ? json(o.gpus) : json(nullptr)}, {"tp", o.overrides.tp},
                  {"dcp", o.dcp >= 1 ? json(o.dcp) : json(nullptr)},
                  {"time_limit_s", o.time_limit_s >= 0 ? json(o.time_limit_s) : json(nullptr)}};
  json groups = json::array();
  for (const CacheGroupSpec& g : r.model.groups) groups.push_back({{"name", g.name}, {"window_left", g.window_left}});
  j["model"] = {{"name", r.model.name}, {"layers", r.model.num_layers}, {"q_heads", r.model.num_q_heads},
                {"kv_heads", r.model.num_kv_heads}, {"head_dim", r.model.head_dim}, {"sinks", r.model.sinks},
                {"cache_groups", groups}};
  const SchedulerStats& s = r.sched;
  // Why no prefix-cache hit rate applies: the cache is off, or no prompt was looked up.
  const std::string prefix_na = !s.prefix_cache_off.empty() ? s.prefix_cache_off
                                : s.prefix_lookup_tokens == 0 ? "no request admitted"
                                                              : "";
  // A dry run measures no time at all: its time figures are null.
  const auto timed = [&](double x) { return o.dry_run ? json(nullptr) : json(x); };
  j["summary"] = {
      {"requests", r.requests}, {"finished", r.finished}, {"truncated", r.truncated}, {"steps", steps}, {"decode_steps", dec_steps},
      {"prompt_tokens", r.prompt_tokens}, {"output_tokens", r.output_tokens},
      {"prefill_tokens_computed", s.prefill_tokens}, {"decode_query_tokens", s.decode_tokens},
      {"generated_tokens", s.generated_tokens}, {"accepted_draft_tokens", s.accepted_draft_tokens},
      {"attention_time_s", timed(att)}, {"attention_time_decode_steps_s", timed(dec_att)},
      {"attention_time_per_step_us", timed(per_step_us(att, steps))},
      {"attention_time_per_generated_token_us", timed(s.generated_tokens ? att / s.generated_tokens * 1e6 : 0.0)},
      {"generated_tokens_per_s", val(rate(double(s.generated_tokens), att))},
      {"backend_metadata_host_time_per_step_us", timed(per_step_us(meta, steps))},
      {"backend_metadata_host_time_per_decode_step_us", timed(per_step_us(dec_meta, dec_steps))},
      {"backend_metadata_host_time_max_us", timed(max_meta * 1e6)},
      {"tool_prepare_host_time_per_step_us", timed(per_step_us(prep, steps))},
      {"tool_scheduler_host_time_per_step_us", per_step_us(sched_s, steps)},
      {"graph_capture_host_time_s", timed(capture)},
      {"bytes", bytes}, {"flops", flops}, {"achieved_tbps", val(tbps)}, {"achieved_tflops", val(tflops)},
      {"decode_steps_tbps", val(dec_tbps)}, {"extend_steps_tflops", val(ext_tflops)},
      {"ceilings", roofline ? json{{"read_tbps", o.ceiling_read_tbps}, {"tflops", o.ceiling_tflops}} : json(nullptr)},
      {"roofline_floor_s", roofline ? json(floor) : json(nullptr)},
      {"roofline_floor_decode_steps_s", roofline ? json(dec_floor) : json(nullptr)},
      {"roofline_floor_extend_steps_s", roofline ? json(ext_floor) : json(nullptr)},
      {"ratio_roofline", ratio(rate(floor, att))},
      {"ratio_roofline_decode_steps", ratio(rate(dec_floor, dec_att))},
      {"ratio_roofline_extend_steps", ratio(rate(ext_floor, ext_att))},
      {"ratio_read_ceiling", ratio(tbps * 1e12 / read_bps)},
      {"ratio_decode_read_ceiling", ratio(dec_tbps * 1e12 / read_bps)},
      {"ratio_tflops_ceiling", ratio(tflops * 1e12 / flops_ps)},
      {"ratio_extend_tflops_ceiling", ratio(ext_tflops * 1e12 / flops_ps)},
      {"peak_pages", s.peak_pages},  // pages in use, prefix-cache-only ones included
      {"peak_live_pages", s.peak_live_pages}, {"peak_prefix_cache_pages", s.peak_prefix_cache_pages},
      // null with the reason when no prompt could hit (0.0 would read as a cold cache).
      {"prefix_hit_rate", prefix_na.empty() ? json(double(s.prefix_hit_tokens) / s.prefix_lookup_tokens) : json(nullptr)},
      {"prefix_hit_rate_na", prefix_na.empty() ? json(nullptr) : json(prefix_na)},
      {"prefix_hit_tokens", s.prefix_hit_tokens}, {"preemptions", s.preemptions},
      {"wall_time_s", r.wall_s}};
  if (r.ranks.mode != RankMode::single) {
    // The slowest rank of each step, summed: what the step costs the deployment.
    j["summary"]["combine_time_s"] = combine;
    j["summary"]["attention_plus_combine_time_s"] = step_total;
    j["summary"]["attention_plus_combine_time_decode_steps_s"] = dec_step;
  }
  j["ranks"] = ranks_json(r);
  j["scaling"] = scaling_json(r, step_total, att, dec_step, steps);
  j["check"] = {{"steps_checked", r.check.steps_checked}, {"rows_checked", r.check.rows_checked},
                {"max_rel_err", r.check.max_rel_err}, {"ok", r.check.ok}, {"failure", r.check.failure}};
  // Per-step records as columns, every stride-th step (the last one too), so a full trace
  // stays a few hundred kB; the summary above is over every step.
  const int64_t keep = std::max(1, o.json_steps);
  const int64_t stride = std::max<int64_t>(1, (steps + keep - 1) / keep);
  json cols = {{"stride", stride}};
  const bool multi = r.ranks.mode != RankMode::single;
  if (multi) cols["combine_us"] = json::array(), cols["step_us"] = json::array();
  const char* names[] = {"step", "rows", "extend_rows", "decode_rows", "tokens", "kv_tokens", "attention_us",
                         "metadata_us", "prepare_us", "schedule_us", "floor_us", "bytes", "flops", "running",
                         "waiting"};
  for (const char* n : names) cols[n] = json::array();
  cols["extend"] = json::array();        // per step, [q_len, seq_len] of each extend row
  cols["pages_in_use"] = json::array();  // per group, prefix-cache-only pages included
  cols["live_pages"] = json::array();    // per group, pages running requests reference
  for (size_t g = 0; g < r.model.groups.size(); ++g) {
    cols["pages_in_use"].push_back(json::array());
    cols["live_pages"].push_back(json::array());
  }
  const auto round2 = [](double x) { return std::round(x * 100.0) / 100.0; };
  for (int64_t i = 0; i < steps; ++i) {
    if (i % stride != 0 && i != steps - 1) continue;
    const StepRecord& st = r.steps[i];
    cols["step"].push_back(st.step), cols["rows"].push_back(st.rows), cols["extend_rows"].push_back(st.extend_rows);
    cols["decode_rows"].push_back(st.decode_rows), cols["tokens"].push_back(st.tokens);
    cols["kv_tokens"].push_back(st.kv_tokens), cols["attention_us"].push_back(round2(st.attention_s * 1e6));
    cols["metadata_us"].push_back(round2(st.metadata_s * 1e6)), cols["prepare_us"].push_back(round2(st.prepare_s * 1e6));
    cols["schedule_us"].push_back(round2(st.schedule_s * 1e6)), cols["floor_us"].push_back(round2(floor_s(st) * 1e6));
    cols["bytes"].push_back(st.bytes), cols["flops"].push_back(st.flops);
    cols["running"].push_back(st.running), cols["waiting"].push_back(st.waiting);
    cols["extend"].push_back(st.extend);
    if (multi) cols["combine_us"].push_back(round2(st.combine_s * 1e6)), cols["step_us"].push_back(round2(st.step_s * 1e6));
    for (size_t g = 0; g < st.pages_in_use.size(); ++g) cols["pages_in_use"][g].push_back(st.pages_in_use[g]);
    for (size_t g = 0; g < st.live_pages.size(); ++g) cols["live_pages"][g].push_back(st.live_pages[g]);
  }
  j["steps"] = std::move(cols);
  return j;
}

std::string replay_summary(const ReplayResult& r) {
  const nlohmann::json j = replay_report_json(r);
  const auto& s = j["summary"];
  std::ostringstream out;
  auto line = [&](const std::string& k, const std::string& v) {
    out << "  " << k << std::string(k.size() < 34 ? 34 - k.size() : 1, ' ') << v << "\n";
  };
  // A row that does not apply says why instead of a bare "-".
  const bool cpu = r.device.is_cpu(), dry = r.options.dry_run, roofline = !s["ceilings"].is_null();
  const int64_t steps = s["steps"].get<int64_t>(), dec_steps = s["decode_steps"].get<int64_t>();
  // The roofline figures need both ceilings (a step's floor is the slower of the two).
  const std::string no_roofline =
      cpu ? "n/a on CPU (no roofline ceilings: needs both --ceiling-read-tbps and --ceiling-tflops)"
          : "n/a (no roofline ceilings)";
  auto why = [&](bool needs_roofline, int64_t kind_steps, const char* kind) -> std::string {
    if (needs_roofline && !roofline) return no_roofline;
    if (dry) return "n/a (dry run: nothing is timed)";
    if (kind_steps == 0) return std::string("n/a (no ") + kind + ")";
    return "n/a";
  };
  auto num = [](const nlohmann::json& v, const char* f, const std::string& na) {
    return v.is_null() ? na : fmt(f, v.get<double>());
  };
  const std::string na_time = why(false, steps, "steps"), na_dec = why(false, dec_steps, "decode-only steps"),
                    na_ext = why(false, steps - dec_steps, "extend steps");
  out << "pagedmha replay: " << r.model.describe() << "\n";
  line("executor", r.executor);
  const bool multi = r.ranks.mode != RankMode::single;
  if (multi) {
    // Per step the slowest rank counts; each rank's own totals follow.
    const auto& s2 = j["summary"];
    line("attention + combine (slowest rank)",
         num(s2["attention_plus_combine_time_s"], "%.4f s", na_time) + " (combine " +
             num(s2["combine_time_s"], "%.4f s", na_time) + ")");
    for (const auto& pr : j["ranks"]["per_rank"])
      line("rank " + std::to_string(pr["rank"].get<int>()) + " (" + pr["device"].get<std::string>() + ")",
           "attention " + fmt("%.4f s", pr["attention_time_s"].get<double>()) + ", combine " +
               fmt("%.4f s", pr["combine_time_s"].get<double>()) + ", " +
               num(pr["achieved_tbps"], "%.4f TB/s", "n/a TB/s"));
    const auto& sc = j["scaling"];
    line("scaling efficiency (vs 1 device)",
         sc.is_null() ? std::string("n/a (no --baseline-json)")
                      : num(sc["efficiency"], "%.3f", "n/a") + " (attention only " +
                            num(sc["efficiency_attention_only"], "%.3f", "n/a") + ", decode-step time ratio " +
                            num(sc["time_ratio_decode_steps"], "%.3f", "n/a") +
                            (sc["same_schedule"].get<bool>() ? ")" : "; NOT the same schedule)"));
  }
  line("requests (finished / total)", std::to_string(r.finished) + " / " + std::to_string(r.requests) +
                                          (r.truncated ? "  TRUNCATED (--time-limit / --max-steps)" : ""));
  line("steps", std::to_string(r.steps.size()));
  // The requests' own totals; a truncated run produced fewer (per-token figures divide by
  // what was produced).
  line(r.truncated ? "prompt / output tokens (all requests)" : "prompt / output tokens",
       std::to_string(r.prompt_tokens) + " / " + std::to_string(r.output_tokens));
  line("prefill tokens computed", std::to_string(r.sched.prefill_tokens));
  line("attention time total", num(s["attention_time_s"], "%.4f s", na_time));
  line("attention time per step", num(s["attention_time_per_step_us"], "%.1f us", na_time));
  line("attention time per output token", num(s["attention_time_per_generated_token_us"], "%.2f us", na_time));
  line("backend metadata host per step",
       num(s["backend_metadata_host_time_per_step_us"], "%.1f us", na_time) +
           (dry || dec_steps == 0 ? ""
                                  : " (decode steps " +
                                        num(s["backend_metadata_host_time_per_decode_step_us"], "%.1f us", na_dec) +
                                        ")"));
  line("tool host per step (prep / sched)", num(s["tool_prepare_host_time_per_step_us"], "%.1f us", na_time) +
                                                " / " + num(s["tool_scheduler_host_time_per_step_us"], "%.1f us", ""));
  line("graph capture (one-off)", dry                      ? "n/a (dry run: nothing is timed)"
                                  : cpu                    ? "n/a on CPU (CUDA graphs run on the GPU only)"
                                  : !r.options.cuda_graphs ? "n/a (--no-cuda-graphs)"
                                                           : num(s["graph_capture_host_time_s"], "%.2f s", na_time));
  line("achieved bandwidth (all steps)", num(s["achieved_tbps"], "%.4f TB/s", na_time));
  line("achieved bandwidth (decode steps)", num(s["decode_steps_tbps"], "%.4f TB/s", na_dec));
  line("achieved compute (all steps)", num(s["achieved_tflops"], "%.4f TFLOP/s", na_time));
  line("achieved compute (extend steps)", num(s["extend_steps_tflops"], "%.4f TFLOP/s", na_ext));
  line("ratio to read ceiling (decode)",
       num(s["ratio_decode_read_ceiling"], "%.3f", why(true, dec_steps, "decode-only steps")));
  line("ratio to TFLOP/s ceiling (extend)",
       num(s["ratio_extend_tflops_ceiling"], "%.3f", why(true, steps - dec_steps, "extend steps")));
  line("K/V + Q + O bytes / flops", fmt("%.4g TB", s["bytes"].get<double>() / 1e12) + " / " +
                                        fmt("%.4g PFLOP", s["flops"].get<double>() / 1e15));
  line("roofline floor (decode / extend)", !roofline ? no_roofline
                                                     : num(s["roofline_floor_s"], "%.3f s", "") + " (" +
                                                           num(s["roofline_floor_decode_steps_s"], "%.3f s", "") +
                                                           " / " +
                                                           num(s["roofline_floor_extend_steps_s"], "%.3f s", "") + ")");
  line("roofline ratio (whole trace)",
       !roofline || dry ? why(true, steps, "steps")
                        : num(s["ratio_roofline"], "%.3f", na_time) + " (decode steps " +
                              num(s["ratio_roofline_decode_steps"], "%.3f", na_dec) + ", extend steps " +
                              num(s["ratio_roofline_extend_steps"], "%.3f", na_ext) + ")");
  // Pages in use include prompt blocks only the prefix cache still holds (it gives them up
  // on demand): the live pages, those running requests reference, are the pool pressure.
  auto per_group = [&](const std::vector<int64_t>& v) {
    std::string text;
    for (size_t g = 0; g < v.size(); ++g) text += (g ? ", " : "") + r.model.groups[g].name + " " + std::to_string(v[g]);
    return text;
  };
  // DCP: the pages of a full-attention group lie on every rank (each pool of pages_per_group).
  const bool dcp = r.ranks.mode == RankMode::dcp;
  line("peak pages live (of " + std::to_string(r.pages_per_group - 1) + (dcp ? " per rank)" : ")"),
       per_group(r.sched.peak_live_pages) + (dcp ? " (full attention: all ranks together)" : ""));
  line("peak pages, prefix cache only", per_group(r.sched.peak_prefix_cache_pages));
  line("peak pages in use (live + cache)", per_group(r.sched.peak_pages));
  if (dcp) {
    std::string text;
    for (size_t g = 0; g < r.sched.peak_owner_pages.size(); ++g) {
      text += (g ? ", " : "") + r.model.groups[g].name;
      for (size_t o = 0; o < r.sched.peak_owner_pages[g].size(); ++o)
        text += (o ? " / " : " ") + std::to_string(r.sched.peak_owner_pages[g][o]);
      if (r.sched.peak_owner_pages[g].size() == 1) text += " (whole on each rank)";
    }
    line("peak pages in use per rank", text);
  }
  line("prefix-cache hit rate", s["prefix_hit_rate"].is_null()
                                    ? "n/a (" + s["prefix_hit_rate_na"].get<std::string>() + ")"
                                    : num(s["prefix_hit_rate"], "%.4f", ""));
  line("preemptions", std::to_string(r.sched.preemptions));
  line("checks (steps / rows, max rel err)",
       dry                          ? "n/a (dry run: no attention to check)"
       : r.options.check_every == 0 ? "n/a (--check-every 0)"
                                    : std::to_string(r.check.steps_checked) + " / " +
                                          std::to_string(r.check.rows_checked) + ", " +
                                          fmt("%.3g", r.check.max_rel_err) + (r.check.ok ? " ok" : " MISMATCH"));
  line("wall time", fmt("%.2f s", r.wall_s));
  return out.str();
}


}  // namespace pagedmha::tools
