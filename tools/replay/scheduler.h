// Attention-level continuous batching: per-step token budget, chunked prefill, paged
// KV allocation per cache group, prefix cache, sliding-window page release,
// admission control and preemption by recompute (requests are delayed, never dropped).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "replay/kv_pool.h"
#include "replay/model.h"
#include "replay/token_data.h"
#include "replay/trace.h"

namespace pagedmha::tools {

struct SchedulerConfig {
  int page_size = 16;           // tokens per page
  int64_t num_pages = 0;        // pages per cache group, including the dummy page 0
  int token_budget = 8192;      // query tokens per step (prefill chunks + decode rows)
  int max_running = 256;        // concurrent requests (batch rows)
  int spec_tokens = 1;          // N queries per decode row (1: plain decode)
  double accept_rate = 0.7;     // per draft token, while the previous one was accepted
  bool prefix_cache = true;     // used when the requests carry hash ids
  double admit_watermark = 0.01;  // fraction of pages kept free when admitting
  uint64_t seed = 0;
  /// Decode-context-parallel ranks (replay --dcp): the pages of full-attention groups are
  /// dealt round-robin by logical page (DcpLayout: page c of a request on rank c % cp_ranks),
  /// each rank with its own pool of num_pages pages; sliding-window groups stay whole on
  /// every rank (num_pages each).
  int cp_ranks = 1;
  /// Build StepPlan::page_tables / out_cache_loc on the host (O(rows * cols) per step);
  /// the replay reads the requests' pages instead (PageTableMirror).
  bool host_tables = true;
};

/// One batch row: a request's queries at positions [prefix_len, seq_len).
struct RowPlan {
  int request = 0;
  int prefix_len = 0;  // KV tokens already cached before this step
  int q_len = 0;
  int seq_len = 0;     // KV length after this step (prefix_len + q_len)
};

/// One step: extend rows first, then decode rows (each with q_len == decode_q_len).
/// page_tables[g] is [rows, cols] row-major (only with SchedulerConfig::host_tables); entries beyond a row's pages, and pages a
/// sliding group released, are 0. out_cache_loc[g] holds the slot of every query
/// token in row order.
struct StepPlan {
  int64_t step = 0;
  std::vector<RowPlan> rows;
  int num_extend = 0;
  int decode_q_len = 1;
  int cols = 0;
  std::vector<std::vector<int32_t>> page_tables;
  std::vector<std::vector<int32_t>> out_cache_loc;
  std::vector<TokenRef> tokens;  // every query token in row order

  int num_decode() const { return static_cast<int>(rows.size()) - num_extend; }
  int64_t num_tokens() const;
  bool empty() const { return rows.empty(); }
};

struct RequestState {
  enum class Phase { waiting, running, finished };
  Phase phase = Phase::waiting;
  int computed = 0;   // tokens whose KV is in the cache
  int generated = 0;  // output tokens produced
  int64_t admitted_at = -1;  // admission order (preemption takes the newest)
  int cached_blocks = 0;     // leading prompt blocks known to the prefix cache
  std::vector<std::vector<int32_t>> pages;  // [group][logical page] (0: released)
  std::vector<int> released;                // [group] leading pages released by the window
  int preemptions = 0;
};

struct SchedulerStats {
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t prefix_hit_tokens = 0;     // prompt tokens served from the prefix cache
  int64_t prefix_lookup_tokens = 0;  // prompt tokens of admissions that could hit
  std::string prefix_cache_off;      // why no admission can hit ("": the prefix cache is on)
  int64_t prefill_tokens = 0;        // tokens computed by extend rows
  int64_t decode_tokens = 0;         // query tokens of decode rows
  int64_t generated_tokens = 0;
  int64_t accepted_draft_tokens = 0;
  std::vector<int64_t> peak_pages;   // per group: pages in use, prefix-cache-only ones included
  std::vector<int64_t> peak_live_pages;         // per group: pages running requests reference
  std::vector<int64_t> peak_prefix_cache_pages; // per group: pages only the prefix cache holds
  std::vector<std::vector<int64_t>> peak_owner_pages;  // [group][owner]: pages in use per rank's pool
};

class Scheduler {
 public:
  /// Queues requests by arrival time (stable for equal times). Throws Error for a
  /// request that can never fit in the pool, a non-finite arrival or lengths outside
  /// 1.. with prompt + output <= kMaxRequestTokens.
  Scheduler(const ModelSpec& model, const SchedulerConfig& config, std::vector<Request> requests);

  bool done() const { return finished_ == static_cast<int64_t>(requests_.size()); }
  /// Plans the next step and allocates its pages. Never empty unless done().
  StepPlan schedule();
  /// Applies a planned step once its attention ran: advances requests, samples accepted
  /// draft tokens, finishes requests, caches prompt blocks, releases pages behind windows.
  void complete(const StepPlan& plan);

  const std::vector<Request>& requests() const { return requests_; }
  const std::vector<RequestState>& states() const { return states_; }
  const std::vector<PagePool>& pools() const { return pools_; }
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerConfig& config() const { return config_; }
  /// Data stream of request r's token at `position`: the hash chain of its prompt block
  /// when that block is a full, hashed prompt block (shared prefixes share data), else
  /// the request's own stream.
  uint64_t token_stream(int r, int position) const;
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t finished() const { return finished_; }
  /// Pages in use per group (including those only the prefix cache holds).
  std::vector<int64_t> used_pages() const;
  /// Pages running requests reference, per group (used_pages() less the prefix cache's own).
  std::vector<int64_t> live_pages() const;
  /// Ranks that share group g's pages (SchedulerConfig::cp_ranks for a full-attention group
  /// under DCP, else 1); logical page c of a request lives on rank c % owners.
  int owners(size_t group) const { return pools_[group].owners(); }
  /// Pages that running requests and the cache reference, per group: checks that no
  /// page is leaked (used == referenced), that page 0 is nowhere and that every page lies
  /// in the pool of the rank its logical position names. Throws on a violation.
  void check_invariants() const;

 private:
  int target_tokens(int r) const;   // KV tokens needed before decoding continues
  bool in_decode(int r) const;
  bool ensure_pages(int r, int kv_len);
  void release_all(int r);
  void preempt(int r);
  int newest_running() const;
  void release_window(int r);

  ModelSpec model_;
  SchedulerConfig config_;
  std::vector<Request> requests_;
  std::vector<std::vector<uint64_t>> block_streams_;  // [request][full hashed prompt block]
  std::vector<RequestState> states_;
  std::vector<PagePool> pools_;
  std::unique_ptr<PrefixCache> cache_;
  // Queue positions: requests by arrival time, file order among equal times.
  std::vector<int> by_arrival_;  // [position] request
  std::vector<int> position_;    // [request] position
  std::set<int> waiting_;        // positions; preempted requests return here
  std::vector<int> running_;  // in admission order
  int64_t finished_ = 0;
  int64_t admissions_ = 0;
  int64_t step_ = 0;
  SchedulerStats stats_;
};

}  // namespace pagedmha::tools
