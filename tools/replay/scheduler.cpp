#include "replay/scheduler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "pagedmha/error.h"
#include "replay/datagen.h"

namespace pagedmha::tools {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t StepPlan::num_tokens() const {
  int64_t t = 0;
  for (const RowPlan& r : rows) t += r.q_len;
  return t;
}

Scheduler::Scheduler(const ModelSpec& model, const SchedulerConfig& config,
                     std::vector<Request> requests)
    : model_(model), config_(config), requests_(std::move(requests)) {
  auto bad = [](const char* arg, const std::string& expected, int64_t v) {
    throw_invalid_argument("replay", arg, expected, std::to_string(v));
  };
  if (config_.page_size < 1) bad("--page-size", ">= 1", config_.page_size);
  if (config_.token_budget < 1) bad("--token-budget", ">= 1", config_.token_budget);
  if (config_.max_running < 1) bad("--max-running", ">= 1", config_.max_running);
  if (config_.spec_tokens < 1 || config_.spec_tokens > 8) bad("--spec-tokens", "1..8 (the backend's limit)", config_.spec_tokens);
  if (config_.token_budget < config_.spec_tokens)
    bad("--token-budget", ">= --spec-tokens (" + std::to_string(config_.spec_tokens) + ")",
        config_.token_budget);
  if (config_.cp_ranks < 1) bad("--dcp", ">= 1 ranks", config_.cp_ranks);
  for (const CacheGroupSpec& g : model_.groups)
    pools_.emplace_back(config_.num_pages, g.window_left < 0 ? config_.cp_ranks : 1);
  bool any_hashes = false;
  for (const Request& r : requests_) any_hashes |= !r.hash_ids.empty();
  if (!config_.prefix_cache) {
    stats_.prefix_cache_off = "--no-prefix-cache";
  } else if (!any_hashes) {
    stats_.prefix_cache_off = "trace has no prefix ids";  // Azure traces, the built-in workload without them
  } else if (kHashBlockTokens % config_.page_size != 0) {
    stats_.prefix_cache_off = "--page-size " + std::to_string(config_.page_size) + " does not divide the trace's " +
                              std::to_string(kHashBlockTokens) + "-token prefix blocks";
  } else {
    cache_ = std::make_unique<PrefixCache>(&pools_, config_.page_size);
  }
  // A request must fit alone: its whole KV in a full group, the window plus one
  // step's chunk in a sliding group (64-bit: --window and --token-budget may be 2^31 - 1).
  for (size_t i = 0; i < requests_.size(); ++i) {
    const Request& req = requests_[i];
    if (!std::isfinite(req.arrival_s))
      throw Error("replay: request " + std::to_string(i) + ": arrival: expected a finite time, got " +
                  std::to_string(req.arrival_s));
    if (req.prompt_len < 1 || req.output_len < 1 || int64_t{req.prompt_len} + req.output_len > kMaxRequestTokens)
      throw Error("replay: request " + std::to_string(i) + ": prompt + output tokens: expected each >= 1 and at "
                  "most 2^30 in all, got " + std::to_string(req.prompt_len) + " + " + std::to_string(req.output_len));
    const int64_t max_kv = int64_t{req.prompt_len} + req.output_len + config_.spec_tokens;
    for (size_t gi = 0; gi < model_.groups.size(); ++gi) {
      const CacheGroupSpec& g = model_.groups[gi];
      int64_t need = ceil_div(max_kv, config_.page_size);
      if (g.window_left >= 0)
        need = std::min(need, ceil_div(int64_t{g.window_left} + 1 + config_.token_budget, config_.page_size) + 2);
      // Round-robin pages: rank 0 holds the most, ceil(need / owners).
      const int owners = pools_[gi].owners();
      need = ceil_div(need, owners);
      const int64_t cap = pools_[gi].owner_capacity();
      if (need > cap)
        throw Error("replay: --pages: request " + std::to_string(i) + " (" +
                    std::to_string(requests_[i].prompt_len) + " + " +
                    std::to_string(requests_[i].output_len) + " tokens) needs " +
                    std::to_string(need) + " pages of group " + g.name +
                    (owners > 1 ? " on one of " + std::to_string(owners) + " ranks" : std::string()) + ", the pool has " +
                    std::to_string(cap) + " usable; give --pages >= " + std::to_string(need + 1) +
                    " (page 0 is reserved), more --kv-memory or fewer tokens");
    }
  }
  block_streams_.resize(requests_.size());
  for (size_t i = 0; i < requests_.size(); ++i) {
    const Request& req = requests_[i];
    uint64_t chain = 0x9A7E5ull;
    for (size_t b = 0; b < req.hash_ids.size() && int64_t(b + 1) * kHashBlockTokens <= req.prompt_len; ++b)
      block_streams_[i].push_back(chain = hash_words(chain, static_cast<uint64_t>(req.hash_ids[b])));
  }
  by_arrival_.resize(requests_.size());
  std::iota(by_arrival_.begin(), by_arrival_.end(), 0);
  std::stable_sort(by_arrival_.begin(), by_arrival_.end(),
                   [&](int a, int b) { return requests_[a].arrival_s < requests_[b].arrival_s; });
  position_.resize(requests_.size());
  states_.resize(requests_.size());
  for (size_t p = 0; p < by_arrival_.size(); ++p) {
    const int i = by_arrival_[p];
    position_[i] = static_cast<int>(p);
    states_[i].pages.resize(pools_.size());
    states_[i].released.assign(pools_.size(), 0);
    waiting_.insert(static_cast<int>(p));
  }
  stats_.peak_pages.assign(pools_.size(), 0);
  stats_.peak_live_pages.assign(pools_.size(), 0);
  stats_.peak_prefix_cache_pages.assign(pools_.size(), 0);
  for (const PagePool& p : pools_) stats_.peak_owner_pages.emplace_back(p.owners(), 0);
}

uint64_t Scheduler::token_stream(int r, int position) const {
  const size_t b = static_cast<size_t>(position / kHashBlockTokens);
  if (b < block_streams_[r].size()) return block_streams_[r][b];
  return hash_words(0x0E0E57ull, static_cast<uint64_t>(r));
}

int Scheduler::target_tokens(int r) const { return requests_[r].prompt_len + states_[r].generated; }

// Decoding continues once every known token but the last has its KV; a recompute after
// preemption switches to decoding at the same point.
bool Scheduler::in_decode(int r) const {
  return states_[r].generated >= 1 && states_[r].computed == target_tokens(r) - 1;
}

std::vector<int64_t> Scheduler::used_pages() const {
  std::vector<int64_t> used;
  for (const PagePool& p : pools_) used.push_back(p.used_pages());
  return used;
}

std::vector<int64_t> Scheduler::live_pages() const {
  std::vector<int64_t> live;
  for (const PagePool& p : pools_) live.push_back(p.live_pages());
  return live;
}

bool Scheduler::ensure_pages(int r, int kv_len) {
  RequestState& st = states_[r];
  const int64_t need = ceil_div(kv_len, config_.page_size);
  for (size_t g = 0; g < pools_.size(); ++g) {
    auto& pages = st.pages[g];
    const int owners = pools_[g].owners();
    while (static_cast<int64_t>(pages.size()) < need) {
      const int owner = static_cast<int>(pages.size() % owners);
      int32_t page = pools_[g].allocate(owner);
      // Least recently used blocks go one at a time until this owner has a free page (a
      // block's pages may lie on every rank).
      while (page == 0 && cache_ && cache_->evict(static_cast<int>(g), 1) > 0) page = pools_[g].allocate(owner);
      if (page == 0) return false;
      pages.push_back(page);
    }
  }
  return true;
}

void Scheduler::release_all(int r) {
  RequestState& st = states_[r];
  for (size_t g = 0; g < pools_.size(); ++g) {
    for (int32_t page : st.pages[g])
      if (page != 0) pools_[g].release(page);
    st.pages[g].clear();
    st.released[g] = 0;
  }
}

void Scheduler::release_window(int r) {
  RequestState& st = states_[r];
  for (size_t g = 0; g < pools_.size(); ++g) {
    const int w = model_.groups[g].window_left;
    if (w < 0) continue;
    // The next queries start at position `computed` and see keys >= computed - w.
    const int64_t first_key = int64_t{st.computed} - w;
    int64_t dead = std::min<int64_t>(first_key / config_.page_size, static_cast<int64_t>(st.pages[g].size()));
    // Prompt blocks still to be cached keep their pages until the cache takes them.
    if (cache_ && st.cached_blocks < static_cast<int>(block_streams_[r].size()))
      dead = std::min<int64_t>(dead, int64_t{st.cached_blocks} * cache_->pages_per_block());
    for (int64_t c = st.released[g]; c < dead; ++c) {
      if (st.pages[g][c] != 0) pools_[g].release(st.pages[g][c]);
      st.pages[g][c] = 0;
    }
    st.released[g] = static_cast<int>(std::max<int64_t>(st.released[g], dead));
  }
}

void Scheduler::preempt(int r) {
  RequestState& st = states_[r];
  release_all(r);
  st.computed = 0;
  st.cached_blocks = 0;
  st.admitted_at = -1;
  st.phase = RequestState::Phase::waiting;
  ++st.preemptions;
  ++stats_.preemptions;
  running_.erase(std::find(running_.begin(), running_.end(), r));
  waiting_.insert(position_[r]);
}

int Scheduler::newest_running() const {
  return running_.empty() ? -1 : running_.back();  // running_ is in admission order
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  plan.step = step_;
  plan.decode_q_len = config_.spec_tokens;
  std::vector<RowPlan> extend, decode;
  int64_t budget = config_.token_budget;
  bool preempted = false;

  auto drop_rows = [&](int r) {
    for (auto* rows : {&extend, &decode})
      for (auto it = rows->begin(); it != rows->end();)
        if (it->request == r) {
          budget += it->q_len;
          it = rows->erase(it);
        } else {
          ++it;
        }
  };
  // Pages for request r up to kv_len, preempting the newest running requests (possibly r
  // itself) until they fit. False when r was preempted.
  auto reserve = [&](int r, int kv_len) {
    while (!ensure_pages(r, kv_len)) {
      const int victim = newest_running();
      drop_rows(victim);
      preempt(victim);
      preempted = true;
      if (victim == r) return false;
    }
    return true;
  };

  // 1. Decode rows (all running requests past their prefill), oldest first.
  for (int r : std::vector<int>(running_)) {
    if (states_[r].phase != RequestState::Phase::running) continue;  // preempted above
    const RequestState& st = states_[r];
    if (!in_decode(r) || budget < config_.spec_tokens) continue;
    const int n = config_.spec_tokens;
    if (!reserve(r, st.computed + n)) continue;
    decode.push_back({r, st.computed, n, st.computed + n});
    budget -= n;
  }
  // 2. Continue chunked prefills of running requests.
  for (int r : std::vector<int>(running_)) {
    if (states_[r].phase != RequestState::Phase::running || budget <= 0) continue;
    const RequestState& st = states_[r];
    if (in_decode(r)) continue;
    const int chunk = static_cast<int>(std::min<int64_t>(target_tokens(r) - st.computed, budget));
    if (!reserve(r, st.computed + chunk)) continue;
    extend.push_back({r, st.computed, chunk, st.computed + chunk});
    budget -= chunk;
  }
  // 3. Admit waiting requests in arrival order while budget, rows and pages allow.
  auto admit = [&]() {
    while (!waiting_.empty() && budget > 0 &&
           static_cast<int64_t>(running_.size()) < config_.max_running) {
      const int r = by_arrival_[*waiting_.begin()];
      RequestState& st = states_[r];
      const Request& req = requests_[r];
      const bool first_admission = st.preemptions == 0;
      st.computed = 0;
      st.cached_blocks = 0;
      if (cache_ && !req.hash_ids.empty()) {
        // Only full prompt blocks, and at least one token left to compute.
        const int max_blocks = std::min(req.prompt_len / kHashBlockTokens,
                                        (target_tokens(r) - 1) / kHashBlockTokens);
        const int hit = cache_->match(req.hash_ids, max_blocks, st.pages, step_);
        st.computed = hit * kHashBlockTokens;
        st.cached_blocks = hit;
      }
      const int chunk = static_cast<int>(std::min<int64_t>(target_tokens(r) - st.computed, budget));
      bool ok = ensure_pages(r, st.computed + chunk);
      if (ok && !running_.empty()) {  // admission control: keep a reserve for decode growth
        for (size_t g = 0; g < pools_.size() && ok; ++g) {
          const auto reserve_pages = static_cast<int64_t>(config_.admit_watermark * pools_[g].capacity());
          if (pools_[g].free_pages() < reserve_pages && cache_)
            cache_->evict(static_cast<int>(g), reserve_pages - pools_[g].free_pages());
          ok = pools_[g].free_pages() >= reserve_pages;
        }
      }
      if (!ok) {
        release_all(r);
        st.computed = 0;
        st.cached_blocks = 0;
        if (running_.empty() && extend.empty() && decode.empty())
          throw Error("replay: request " + std::to_string(r) +
                      " does not fit in an empty page pool; give more --pages / --kv-memory");
        return;
      }
      if (first_admission && cache_ && !req.hash_ids.empty()) {  // only prompts the cache can serve
        stats_.prefix_hit_tokens += st.computed;
        stats_.prefix_lookup_tokens += req.prompt_len;
      }
      waiting_.erase(waiting_.begin());
      running_.push_back(r);
      st.phase = RequestState::Phase::running;
      st.admitted_at = admissions_++;
      extend.push_back({r, st.computed, chunk, st.computed + chunk});
      budget -= chunk;
    }
  };
  if (!preempted || (extend.empty() && decode.empty())) admit();
  if (extend.empty() && decode.empty() && !done())
    throw Error("replay: scheduler made no progress at step " + std::to_string(step_) +
                " (running " + std::to_string(running_.size()) + ", waiting " +
                std::to_string(waiting_.size()) + ")");

  plan.num_extend = static_cast<int>(extend.size());
  plan.rows = std::move(extend);
  plan.rows.insert(plan.rows.end(), decode.begin(), decode.end());
  plan.cols = 1;
  for (const RowPlan& row : plan.rows)
    plan.cols = std::max<int>(plan.cols, static_cast<int>(ceil_div(row.seq_len, config_.page_size)));
  const size_t groups = pools_.size();
  if (config_.host_tables) {
    plan.page_tables.assign(groups, std::vector<int32_t>(plan.rows.size() * plan.cols, 0));
    plan.out_cache_loc.assign(groups, {});
  }
  for (size_t g = 0; g < groups && config_.host_tables; ++g) {
    plan.out_cache_loc[g].reserve(plan.num_tokens());
    for (size_t i = 0; i < plan.rows.size(); ++i) {
      const RowPlan& row = plan.rows[i];
      const auto& pages = states_[row.request].pages[g];
      const int64_t n = ceil_div(row.seq_len, config_.page_size);
      std::copy(pages.begin(), pages.begin() + n, plan.page_tables[g].begin() + i * plan.cols);
      for (int pos = row.prefix_len; pos < row.seq_len; ++pos) {
        const int32_t page = pages[pos / config_.page_size];
        if (page == 0)
          throw Error("replay: internal: write of request " + std::to_string(row.request) +
                      " position " + std::to_string(pos) + " targets the dummy page");
        plan.out_cache_loc[g].push_back(page * config_.page_size + pos % config_.page_size);
      }
    }
  }
  plan.tokens.reserve(plan.num_tokens());
  for (const RowPlan& row : plan.rows)
    for (int pos = row.prefix_len; pos < row.seq_len; ++pos)
      plan.tokens.push_back({token_stream(row.request, pos), pos, 0});
  for (size_t g = 0; g < groups; ++g) {
    stats_.peak_pages[g] = std::max(stats_.peak_pages[g], pools_[g].used_pages());
    stats_.peak_live_pages[g] = std::max(stats_.peak_live_pages[g], pools_[g].live_pages());
    stats_.peak_prefix_cache_pages[g] = std::max(stats_.peak_prefix_cache_pages[g], pools_[g].cache_only_pages());
    for (int o = 0; o < pools_[g].owners(); ++o)
      stats_.peak_owner_pages[g][o] = std::max(stats_.peak_owner_pages[g][o], pools_[g].used_pages(o));
  }
  return plan;
}

void Scheduler::complete(const StepPlan& plan) {
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const RowPlan& row = plan.rows[i];
    const int r = row.request;
    RequestState& st = states_[r];
    const Request& req = requests_[r];
    if (static_cast<int>(i) < plan.num_extend) {
      st.computed = row.seq_len;
      stats_.prefill_tokens += row.q_len;
      if (st.computed == target_tokens(r)) {  // the prefill samples one token
        ++st.generated;
        ++stats_.generated_tokens;
      }
    } else {
      // Verify: the row's first query is the last sampled token, the others drafts;
      // accepted drafts plus one bonus token come out.
      int accepted = 0;
      for (int j = 0; j + 1 < row.q_len; ++j, ++accepted)
        if (uniform01(hash_words(config_.seed, 0xACCE97ull, r, row.prefix_len, j)) >= config_.accept_rate) break;
      const int produced = std::min(accepted + 1, req.output_len - st.generated);
      stats_.decode_tokens += row.q_len;
      stats_.accepted_draft_tokens += produced - 1;
      st.computed += produced;
      st.generated += produced;
      stats_.generated_tokens += produced;
    }
    if (cache_ && !req.hash_ids.empty()) {
      const int done_blocks = std::min<int>(std::min(st.computed, req.prompt_len) / kHashBlockTokens,
                                            static_cast<int>(req.hash_ids.size()));
      for (int b = st.cached_blocks; b < done_blocks; ++b) cache_->insert(req.hash_ids, b, st.pages, step_);
      st.cached_blocks = std::max(st.cached_blocks, done_blocks);
    }
    if (st.generated >= req.output_len) {
      release_all(r);
      st.phase = RequestState::Phase::finished;
      running_.erase(std::find(running_.begin(), running_.end(), r));
      ++finished_;
    } else {
      release_window(r);
    }
  }
  ++stats_.steps;
  ++step_;
}

void Scheduler::check_invariants() const {
  std::vector<std::vector<int64_t>> refs(pools_.size());
  for (size_t g = 0; g < pools_.size(); ++g) refs[g].assign(pools_[g].num_pages(), 0);
  for (size_t r = 0; r < states_.size(); ++r) {
    const RequestState& st = states_[r];
    for (size_t g = 0; g < pools_.size(); ++g) {
      if (st.phase != RequestState::Phase::running && !st.pages[g].empty())
        throw Error("replay: invariant: request " + std::to_string(r) + " holds pages while not running");
      for (size_t c = 0; c < st.pages[g].size(); ++c) {
        const int32_t page = st.pages[g][c];
        ++refs[g][page];
        if (page != 0 && pools_[g].owner_of(page) != static_cast<int>(c % pools_[g].owners()))
          throw Error("replay: invariant: request " + std::to_string(r) + " page " + std::to_string(c) + " of group " +
                      model_.groups[g].name + " is on rank " + std::to_string(pools_[g].owner_of(page)) +
                      ", its position names rank " + std::to_string(c % pools_[g].owners()));
      }
    }
  }
  const std::vector<std::vector<int64_t>> request_refs = refs;
  if (cache_) cache_->count_references(refs);
  for (size_t g = 0; g < pools_.size(); ++g) {
    int64_t used = 0, live = 0;
    for (int64_t p = 1; p < pools_[g].num_pages(); ++p) {
      if (refs[g][p] != pools_[g].refcount(static_cast<int32_t>(p)))
        throw Error("replay: invariant: page " + std::to_string(p) + " of group " +
                    model_.groups[g].name + " has refcount " +
                    std::to_string(pools_[g].refcount(static_cast<int32_t>(p))) + " but " +
                    std::to_string(refs[g][p]) + " holders (leak or double free)");
      used += refs[g][p] > 0;
      live += request_refs[g][p] > 0;
    }
    if (live != pools_[g].live_pages())
      throw Error("replay: invariant: group " + model_.groups[g].name + " counts " +
                  std::to_string(pools_[g].live_pages()) + " live pages, requests reference " +
                  std::to_string(live));
    if (used != pools_[g].used_pages())
      throw Error("replay: invariant: group " + model_.groups[g].name + " counts " +
                  std::to_string(pools_[g].used_pages()) + " used pages, holders reference " +
                  std::to_string(used));
  }
}

}  // namespace pagedmha::tools
