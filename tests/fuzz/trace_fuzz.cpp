// libFuzzer targets of the replay's trace readers and the scheduler behind them (run by
// scripts/fuzz.sh from the seed corpus in tests/fuzz/corpus). Built three times with
// -DPAGEDMHA_FUZZ_TARGET=1 (Azure csv), 2 (Mooncake jsonl), 3 (either, then the scheduler
// to completion with its invariants checked every step). Readers may reject input with
// pagedmha::Error; anything else (a crash, a sanitizer report, an exception of another
// type, a broken invariant) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "pagedmha/error.h"
#include "replay/model.h"
#include "replay/scheduler.h"
#include "replay/trace.h"

using namespace pagedmha;
using namespace pagedmha::tools;

namespace {

[[noreturn]] void finding(const char* what) {
  __builtin_trap();  // libFuzzer reports the input
  (void)what;
}

void check(bool ok, const char* what) {
  if (!ok) finding(what);
}

// Every request is either rejected up front (Error) or finishes; every step respects the
// budget, the batch limit and the pool.
void run_scheduler(std::vector<Request> reqs) {
  if (reqs.empty() || reqs.size() > 64) return;
  ModelOverrides o;
  o.layers = 1;
  o.tp = 8;
  const ModelSpec m = make_model("gpt-oss-20b", o);  // a sliding-window group too
  SchedulerConfig c;
  c.page_size = 16;
  c.num_pages = 512;
  c.token_budget = 256;
  c.max_running = 8;
  try {
    Scheduler s(m, c, std::move(reqs));
    for (int64_t step = 0; !s.done(); ++step) {
      check(step < 200000, "scheduler made no progress");
      const StepPlan plan = s.schedule();
      check(!plan.empty(), "empty step before done");
      check(plan.num_tokens() <= c.token_budget, "step over the token budget");
      check(static_cast<int64_t>(plan.rows.size()) <= c.max_running, "step over max_running");
      for (const RowPlan& r : plan.rows) check(r.q_len >= 1 && r.seq_len == r.prefix_len + r.q_len, "bad row");
      for (int64_t used : s.used_pages()) check(used <= c.num_pages, "pool overcommitted");
      s.complete(plan);
      s.check_invariants();
    }
  } catch (const Error&) {
    // a request that can never fit, or out-of-range lengths: rejected with a message
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
#if PAGEDMHA_FUZZ_TARGET == 1
    (void)parse_azure_csv(text, "fuzz.csv");
#elif PAGEDMHA_FUZZ_TARGET == 2
    (void)parse_mooncake_jsonl(text, "fuzz.jsonl");
#else
    const bool mooncake = !text.empty() && text.find('{') < text.find('\n');
    run_scheduler(mooncake ? parse_mooncake_jsonl(text, "fuzz.jsonl", 64) : parse_azure_csv(text, "fuzz.csv", 64));
#endif
  } catch (const Error& e) {
    check(std::string(e.what()).size() < 2048, "unbounded error text");
  }
  return 0;
}
