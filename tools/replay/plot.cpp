#include "replay/plot.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "pagedmha/error.h"
#include "replay/error_text.h"

namespace pagedmha::tools {
namespace {

using nlohmann::json;

// "an array of 3", "a string", ...: what a field holds, never its (unbounded) value.
std::string describe(const json* v) {
  if (!v) return "nothing";
  if (v->is_array()) return "an array of " + std::to_string(v->size());
  if (v->is_object()) return "an object";
  if (v->is_string()) return "a string";
  if (v->is_boolean()) return "a boolean";
  if (v->is_null()) return "null";
  return "a number";
}

class ReportCheck {
 public:
  explicit ReportCheck(const std::string& source) : source_(escape_bytes(source, 200)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& want, const json* got) const {
    throw_invalid_argument("plot", "report", "a replay --json report with " + field + " " + want,
                           describe(got) + " in " + source_);
  }
  const json& object(const json& parent, const char* key, const std::string& field) const {
    const json* v = find(parent, key);
    if (!v || !v->is_object()) fail(field, "an object", v);
    return *v;
  }
  const json& number(const json& parent, const char* key, const std::string& field, bool nullable = false) const {
    const json* v = find(parent, key);
    if (!v || !(v->is_number() || (nullable && v->is_null())))
      fail(field, nullable ? "a number or null" : "a number", v);
    return *v;
  }
  // An array of n numbers (n < 0: any length, returned).
  size_t numbers(const json& parent, const char* key, const std::string& field, int64_t n) const {
    const json* v = find(parent, key);
    const std::string want =
        n < 0 ? "an array of numbers" : "an array of " + std::to_string(n) + " numbers (one per step)";
    if (!v || !v->is_array() || (n >= 0 && static_cast<int64_t>(v->size()) != n)) fail(field, want, v);
    for (const json& x : *v)
      if (!x.is_number()) fail(field, want, &x);
    return v->size();
  }
  static const json* find(const json& parent, const char* key) {
    const auto it = parent.find(key);
    return it == parent.end() ? nullptr : &*it;
  }

 private:
  std::string source_;
};

}  // namespace

void check_replay_report(const json& r, const std::string& source) {
  const ReportCheck c(source);
  if (!r.is_object()) c.fail("its fields", "in an object", &r);
  const json& options = c.object(r, "options", "options");
  const json* dry = ReportCheck::find(options, "dry_run");
  if (dry && !dry->is_boolean()) c.fail("options.dry_run", "a boolean", dry);
  c.number(options, "pages_per_group", "options.pages_per_group");
  const json& model = c.object(r, "model", "model");
  const json* name = ReportCheck::find(model, "name");
  if (!name || !name->is_string()) c.fail("model.name", "a string", name);
  const json* groups = ReportCheck::find(model, "cache_groups");
  if (!groups || !groups->is_array() || groups->empty()) c.fail("model.cache_groups", "a non-empty array", groups);
  for (const json& g : *groups) {
    const json* gname = g.is_object() ? ReportCheck::find(g, "name") : nullptr;
    if (!gname || !gname->is_string()) c.fail("model.cache_groups[].name", "a string", gname);
  }
  const json* device = ReportCheck::find(r, "device");
  if (!device || !device->is_string()) c.fail("device", "a string", device);
  const json* truncated = ReportCheck::find(r, "truncated");
  if (truncated && !truncated->is_boolean()) c.fail("truncated", "a boolean", truncated);

  const json& s = c.object(r, "summary", "summary");
  for (const char* k : {"requests", "steps", "preemptions"})
    c.number(s, k, std::string("summary.") + k);
  c.number(s, "prefix_hit_rate", "summary.prefix_hit_rate", true);  // null: no prompt could hit
  if (truncated && truncated->get<bool>()) c.number(s, "finished", "summary.finished");
  const bool dry_run = dry && dry->get<bool>();
  for (const char* k : dry_run ? std::vector<const char*>{"roofline_floor_s"}
                               : std::vector<const char*>{"achieved_tbps", "achieved_tflops", "ratio_roofline"})
    if (ReportCheck::find(s, k)) c.number(s, k, std::string("summary.") + k, true);

  // Per-step columns: one entry per kept step in each (a cut or edited report has fewer).
  const json& st = c.object(r, "steps", "steps");
  c.number(st, "stride", "steps.stride");
  const int64_t n = static_cast<int64_t>(c.numbers(st, "step", "steps.step", -1));
  for (const char* k : {"extend_rows", "tokens", dry_run ? "floor_us" : "attention_us"})
    c.numbers(st, k, std::string("steps.") + k, n);
  // Pages per cache group; live_pages is absent from reports written before it existed.
  for (const char* key : {"pages_in_use", "live_pages"}) {
    const json* pages = ReportCheck::find(st, key);
    if (!pages && std::string(key) == "live_pages") continue;
    const std::string name = std::string("steps.") + key;
    if (!pages || !pages->is_array() || pages->size() != groups->size())
      c.fail(name, "an array of " + std::to_string(groups->size()) + " (one per cache group)", pages);
    for (size_t g = 0; g < pages->size(); ++g) {
      const std::string field = name + "[" + std::to_string(g) + "]";
      const json& col = (*pages)[g];
      if (!col.is_array() || static_cast<int64_t>(col.size()) != n)
        c.fail(field, "an array of " + std::to_string(n), &col);
      for (const json& x : col)
        if (!x.is_number()) c.fail(field, "numbers", &x);
    }
  }
}

// Runs scripts/plot_replay.py through fork/execvp with an argv array: file names reach
// Python verbatim, never a shell.
int plot_main(const std::string& report, const std::string& image, const std::string& script_arg) {
  const std::string script =
      script_arg.empty() ? std::string(PAGEDMHA_SOURCE_DIR) + "/scripts/plot_replay.py" : script_arg;
  const std::string shown = escape_bytes(report, 200);
  std::error_code ec;
  if (std::filesystem::is_directory(report, ec))
    throw_invalid_argument("plot", "report", "a readable replay --json report", "a directory: " + shown);
  std::ifstream in(report, std::ios::binary);
  if (!in) throw_invalid_argument("plot", "report", "a readable replay --json report", shown);
  if (!std::ifstream(script))
    throw_invalid_argument("plot", "--script", "a readable plot_replay.py", escape_bytes(script, 200));
  // The report is checked here so that a cut or edited one is a one-line error, not a
  // Python traceback.
  {
    std::ostringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    json j;
    try {
      j = json::parse(text);
    } catch (const json::parse_error& e) {
      throw_invalid_argument("plot", "report", "a replay --json report (JSON)",
                             "a parse error at byte " + std::to_string(e.byte) + " of " + std::to_string(text.size()) +
                                 " in " + shown);
    }
    check_replay_report(j, report);
  }
  // "--": a report named like an option ("-h") is still the report.
  std::vector<std::string> args = {"python3", script, "-o", image, "--", report};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int err_pipe[2];
  if (pipe(err_pipe) != 0) throw Error(std::string("plot: pipe failed: ") + std::strerror(errno));
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) throw Error(std::string("plot: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    close(err_pipe[0]);
    dup2(err_pipe[1], STDERR_FILENO);
    close(err_pipe[1]);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "pagedmha: error: plot: cannot run python3: %s\n", std::strerror(errno));
    _exit(127);
  }
  // The script's stderr (its own errors are one line): a traceback is cut to its last
  // line, which names the exception.
  close(err_pipe[1]);
  std::string err;
  char buf[4096];
  for (;;) {
    const ssize_t got = read(err_pipe[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    err.append(buf, static_cast<size_t>(got));
    if (err.size() > (1u << 20)) err.erase(0, err.size() - (1u << 19));  // keep the tail
  }
  close(err_pipe[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw Error(std::string("plot: waitpid failed: ") + std::strerror(errno));
  if (err.find("Traceback (most recent call last):") != std::string::npos) {
    while (!err.empty() && (err.back() == '\n' || err.back() == '\r')) err.pop_back();
    const size_t nl = err.rfind('\n');
    const std::string last = nl == std::string::npos ? err : err.substr(nl + 1);
    std::fprintf(stderr, "pagedmha: error: plot: plot_replay.py failed on %s: %s\n", shown.c_str(),
                 escape_bytes(last, 300).c_str());
    return 1;
  }
  std::fputs(err.c_str(), stderr);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

}  // namespace pagedmha::tools
