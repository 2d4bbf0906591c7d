// Page pool, prefix cache and scheduler invariants, driven without attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <set>
#include <string>

#include "pagedmha/error.h"
#include "replay/kv_pool.h"
#include "replay/replay.h"
#include "replay/scheduler.h"
#include "replay/token_data.h"

namespace pt = pagedmha::tools;

TEST(PagePool, NeverHandsOutPageZeroAndRefcounts) {
  pt::PagePool pool(5);
  std::set<int32_t> got;
  for (int i = 0; i < 4; ++i) got.insert(pool.allocate());
  EXPECT_EQ(got, (std::set<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(pool.allocate(), 0);  // exhausted
  pool.retain(3);
  pool.release(3);
  EXPECT_EQ(pool.free_pages(), 0);
  pool.release(3);
  EXPECT_EQ(pool.free_pages(), 1);
  EXPECT_THROW(pool.release(3), pagedmha::Error);
  EXPECT_THROW(pool.release(0), pagedmha::Error);
  EXPECT_EQ(pool.allocate(), 3);
}

// Pages only the prefix cache holds are told apart from live ones (a request's).
TEST(PagePool, CountsPagesOnlyTheCacheHolds) {
  pt::PagePool pool(5);
  const int32_t p = pool.allocate();
  EXPECT_EQ(pool.live_pages(), 1);
  pool.retain(p, /*by_cache=*/true);  // the request finished a prompt block
  EXPECT_EQ(pool.cache_only_pages(), 0);
  pool.release(p);  // the request finished
  EXPECT_EQ(pool.used_pages(), 1);
  EXPECT_EQ(pool.cache_only_pages(), 1);
  EXPECT_EQ(pool.live_pages(), 0);
  pool.retain(p);  // another request matched the block
  EXPECT_EQ(pool.cache_only_pages(), 0);
  EXPECT_EQ(pool.live_pages(), 1);
  pool.release(p);
  pool.release(p, /*by_cache=*/true);  // evicted
  EXPECT_EQ(pool.used_pages(), 0);
  EXPECT_EQ(pool.cache_only_pages(), 0);
  const int32_t q = pool.allocate();
  EXPECT_THROW(pool.release(q, /*by_cache=*/true), pagedmha::Error);  // the cache holds no reference
}

TEST(PrefixCache, SharesLeadingBlocksAndEvictsOnlyUnreferencedLeaves) {
  std::vector<pt::PagePool> pools;
  pools.emplace_back(1 + 8 * 4);
  pt::PrefixCache cache(&pools, 128);  // 4 pages per block
  std::vector<std::vector<int32_t>> owner(1);
  for (int i = 0; i < 8; ++i) owner[0].push_back(pools[0].allocate());
  const std::vector<int64_t> ids = {0, 7};
  EXPECT_TRUE(cache.insert(ids, 0, owner, 1));
  EXPECT_TRUE(cache.insert(ids, 1, owner, 1));
  EXPECT_FALSE(cache.insert(ids, 1, owner, 1));                  // already cached
  EXPECT_FALSE(cache.insert(std::vector<int64_t>{5, 7}, 1, owner, 1));  // parent missing
  std::vector<std::vector<int32_t>> got(1);
  EXPECT_EQ(cache.match(std::vector<int64_t>{0, 9}, 2, got, 2), 1);
  EXPECT_EQ(got[0], std::vector<int32_t>(owner[0].begin(), owner[0].begin() + 4));
  EXPECT_EQ(pools[0].refcount(owner[0][0]), 3);  // owner, cache, matcher
  for (int32_t p : owner[0]) pools[0].release(p);
  EXPECT_EQ(cache.evict(0, 100), 4);  // only block 1: block 0 is still referenced by the matcher
  for (int32_t p : got[0]) pools[0].release(p);
  EXPECT_EQ(cache.evict(0, 100), 4);
  EXPECT_EQ(pools[0].used_pages(), 0);
}

// chain_key is a 64-bit hash: chain_key(0, y) = mix(y) and chain_key(p, b) =
// mix(p * golden ^ b), so ids can be chosen whose keys collide with a cached chain's. A
// collision must be a miss: never another prompt's pages.
TEST(PrefixCache, CollidingChainKeysMissInsteadOfSharingPages) {
  using PC = pt::PrefixCache;
  constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  std::vector<pt::PagePool> pools;
  pools.emplace_back(1 + 16);
  PC cache(&pools, 128);  // 4 pages per block
  std::vector<std::vector<int32_t>> owner(1), other(1);
  for (int i = 0; i < 8; ++i) owner[0].push_back(pools[0].allocate());
  for (int i = 0; i < 4; ++i) other[0].push_back(pools[0].allocate());
  const int64_t a = 11, b = 22, c = 33;
  ASSERT_TRUE(cache.insert({a, b}, 0, owner, 1));
  ASSERT_TRUE(cache.insert({a, b}, 1, owner, 1));
  ASSERT_TRUE(cache.insert({c}, 0, other, 1));
  const uint64_t key_ab = PC::chain_key(PC::chain_key(0, a), b);
  // A first block whose key is that of block 1 of {a, b}.
  const auto y = static_cast<int64_t>(PC::chain_key(0, a) * kGolden ^ static_cast<uint64_t>(b));
  ASSERT_EQ(PC::chain_key(0, y), key_ab) << "chain_key changed: rebuild the collision";
  // A second block after c whose key is that of block 1 of {a, b}.
  const auto z = static_cast<int64_t>((PC::chain_key(0, c) * kGolden) ^ (PC::chain_key(0, a) * kGolden) ^
                                      static_cast<uint64_t>(b));
  ASSERT_EQ(PC::chain_key(PC::chain_key(0, c), z), key_ab) << "chain_key changed: rebuild the collision";
  ASSERT_NE(y, a);
  std::vector<std::vector<int32_t>> got(1);
  EXPECT_EQ(cache.match({y, 5}, 2, got, 2), 0);
  EXPECT_TRUE(got[0].empty());
  EXPECT_EQ(cache.match({c, z}, 2, got, 2), 1);  // c is cached; {c, z} is not {a, b}
  EXPECT_EQ(got[0], other[0]);
  // A colliding insert caches nothing, so the lookup still misses.
  EXPECT_FALSE(cache.insert({y}, 0, other, 3));
  EXPECT_FALSE(cache.insert({c, z}, 1, owner, 3));
  got[0].clear();
  EXPECT_EQ(cache.match({y}, 1, got, 4), 0);
  EXPECT_EQ(cache.num_blocks(), 3);
  // The real chain still hits, with its own pages.
  EXPECT_EQ(cache.match({a, b}, 2, got, 5), 2);
  EXPECT_EQ(got[0], owner[0]);
}

namespace {

pt::ModelSpec small_model(int window) {
  pt::ModelOverrides o;
  o.layers = 2, o.q_heads = 4, o.kv_heads = 2, o.head_dim = 64;
  return pt::make_model(window >= 0 ? "gpt-oss-20b" : "custom", o);
}

// Runs the scheduler to completion, checking invariants every step; returns the plans.
std::vector<pt::StepPlan> drive(pt::Scheduler& s) {
  std::vector<pt::StepPlan> plans;
  while (!s.done()) {
    pt::StepPlan p = s.schedule();
    EXPECT_FALSE(p.empty());
    for (const auto& locs : p.out_cache_loc)
      for (int32_t slot : locs) EXPECT_GE(slot, s.config().page_size);  // never the dummy page
    EXPECT_LE(p.num_tokens(), s.config().token_budget);
    s.complete(p);
    s.check_invariants();
    plans.push_back(std::move(p));
    if (plans.size() > 100000) break;
  }
  return plans;
}

}  // namespace

TEST(Scheduler, PreemptionUnderPagePressureLosesNoTokens) {
  std::vector<pt::Request> reqs = pt::default_workload(24, 3);
  for (auto& r : reqs) r.hash_ids.clear();
  pt::SchedulerConfig c;
  c.page_size = 16;
  c.num_pages = 1 + 420;  // a few requests' worth: forces preemption
  c.token_budget = 512;
  c.max_running = 16;
  pt::Scheduler s(small_model(-1), c, reqs);
  const auto plans = drive(s);
  ASSERT_TRUE(s.done());
  EXPECT_GT(s.stats().preemptions, 0);
  int64_t out = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(s.states()[i].generated, reqs[i].output_len);
    out += reqs[i].output_len;
  }
  EXPECT_EQ(s.stats().generated_tokens, out);
  EXPECT_EQ(s.used_pages()[0], 0);  // no prefix cache: nothing left held
  // Every decode row writes exactly the position after the tokens already cached.
  for (const auto& p : plans)
    for (int i = p.num_extend; i < static_cast<int>(p.rows.size()); ++i) EXPECT_EQ(p.rows[i].q_len, 1);
}

TEST(Scheduler, PrefixCacheSkipsSharedBlocks) {
  pt::Request a{0.0, 1100, 4, {10, 11, 12}}, b{0.1, 1300, 4, {10, 11, 13}};
  pt::SchedulerConfig c;
  c.page_size = 64;
  c.num_pages = 200;
  c.token_budget = 4096;
  c.max_running = 1;  // b is admitted after a finished
  pt::Scheduler s(small_model(-1), c, {a, b});
  const auto plans = drive(s);
  int b_prefix = -1;
  for (const auto& p : plans)
    for (const auto& r : p.rows)
      if (r.request == 1 && b_prefix < 0) b_prefix = r.prefix_len;
  EXPECT_EQ(b_prefix, 1024);  // two shared full blocks
  EXPECT_EQ(s.stats().prefix_hit_tokens, 1024);
  EXPECT_EQ(s.used_pages()[0], 2 * 512 / 64);  // the cache holds a's two full blocks
}

// a's two full prompt blocks (16 pages of 64 tokens) stay in the cache while b, which
// shares none of them, runs: they count as in use but not as live.
TEST(Scheduler, PeakPagesSplitLiveAndPrefixCacheOnly) {
  pt::Request a{0.0, 1100, 4, {10, 11, 12}}, b{0.1, 1100, 4, {20, 21, 22}};
  pt::SchedulerConfig c;
  c.page_size = 64;
  c.num_pages = 200;
  c.token_budget = 4096;
  c.max_running = 1;  // b is admitted after a finished
  pt::Scheduler s(small_model(-1), c, {a, b});
  drive(s);
  const pt::SchedulerStats& st = s.stats();
  EXPECT_EQ(st.peak_live_pages[0], 18);          // ceil(1103 / 64): one request's KV at its last step
  EXPECT_EQ(st.peak_prefix_cache_pages[0], 16);  // a's blocks while b runs
  EXPECT_EQ(st.peak_pages[0], 18 + 16);
  EXPECT_EQ(s.live_pages()[0], 0);               // both finished: only the cache holds pages
  EXPECT_EQ(s.used_pages()[0], 32);
}

TEST(Scheduler, SlidingGroupReleasesPagesBehindTheWindow) {
  std::vector<pt::Request> reqs = {{0.0, 3000, 200, {}}};
  pt::SchedulerConfig c;
  c.page_size = 16;
  c.num_pages = 400;
  c.token_budget = 512;
  pt::Scheduler s(small_model(127), c, reqs);
  int64_t max_sliding_after = 0;
  while (!s.done()) {
    const auto p = s.schedule();
    s.complete(p);
    s.check_invariants();
    if (!s.done()) max_sliding_after = std::max(max_sliding_after, s.used_pages()[1]);
  }
  EXPECT_LE(max_sliding_after, (127 + 16) / 16 + 1);  // the window's pages, not the whole sequence
}

TEST(Scheduler, SpeculativeVerifyAdvancesByAcceptedTokens) {
  std::vector<pt::Request> reqs = {{0.0, 40, 50, {}}, {0.0, 70, 33, {}}};
  pt::SchedulerConfig c;
  c.page_size = 16;
  c.num_pages = 64;
  c.spec_tokens = 4;
  c.accept_rate = 0.6;
  pt::Scheduler s(small_model(-1), c, reqs);
  const auto plans = drive(s);
  EXPECT_EQ(s.states()[0].generated, 50);
  EXPECT_EQ(s.states()[1].generated, 33);
  EXPECT_GT(s.stats().accepted_draft_tokens, 0);
  int decode_steps = 0;
  for (const auto& p : plans) decode_steps += p.num_extend == 0;
  EXPECT_LT(decode_steps, 49);  // fewer steps than one token at a time
}

TEST(Scheduler, RejectsARequestThatCanNeverFit) {
  pt::SchedulerConfig c;
  c.page_size = 16;
  c.num_pages = 10;
  EXPECT_THROW(pt::Scheduler(small_model(-1), c, {{0.0, 1000, 10, {}}}), pagedmha::Error);
  // The message names the --pages value that fits: ceil(1011 / 16) = 64 pages + page 0.
  try {
    pt::Scheduler(small_model(-1), c, {{0.0, 1000, 10, {}}});
  } catch (const pagedmha::Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 64 pages"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--pages >= 65"), std::string::npos) << e.what();
  }
  c.num_pages = 65;
  EXPECT_NO_THROW(pt::Scheduler(small_model(-1), c, {{0.0, 1000, 10, {}}}));
}

TEST(TokenData, DeterministicPerStreamPositionLayer) {
  using pagedmha::Device;
  using pagedmha::DType;
  std::vector<float> a(3 * 2 * 64), b(a.size()), c(a.size());
  const std::vector<pt::TokenRef> toks = {{7, 0, 0}, {7, 1, 0}, {9, 0, 0}};
  auto view = [](std::vector<float>& v) { return pagedmha::TensorView(v.data(), DType::fp32, Device::cpu(), {3, 2, 64}); };
  pt::fill_tokens_host(view(a), toks.data(), 3, 1, 0, pt::TokenTensor::k);
  pt::fill_tokens_host(view(b), toks.data(), 3, 1, 0, pt::TokenTensor::k);
  pt::fill_tokens_host(view(c), toks.data(), 3, 1, 1, pt::TokenTensor::k);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(std::vector<float>(a.begin(), a.begin() + 128), std::vector<float>(a.begin() + 128, a.begin() + 256));
  for (float x : a) EXPECT_TRUE(x >= -1.0f && x < 1.0f);
}

TEST(Accounting, VisiblePairsMatchBruteForce) {
  for (int L : {1, 5, 130, 300})
    for (int n : {1, 4, L})
      for (int w : {-1, 0, 3, 127}) {
        int64_t pairs = 0;
        std::set<int64_t> keys;
        for (int i = 0; i < n; ++i)
          for (int j = 0; j < L; ++j) {
            const int p = L - n + i;
            if (j <= p && (w < 0 || j >= p - w)) ++pairs, keys.insert(j);
          }
        EXPECT_EQ(pt::visible_pairs(L, n, w), pairs) << L << " " << n << " " << w;
        EXPECT_EQ(pt::keys_read(L, n, w), static_cast<int64_t>(keys.size())) << L << " " << n << " " << w;
      }
}

// The queue is by arrival time, file order among equal times, in both trace formats.
TEST(Scheduler, QueuesByArrivalTimeStableForEqualTimes) {
  // Arrivals in file order: 3 s, 0, 2, 0, 1 -> served 1, 3, 4, 2, 0 (1 before 3: file order).
  const std::vector<int> want = {1, 3, 4, 2, 0};
  const char* seconds[] = {"49", "46", "48", "46", "47"};
  std::string azure = "TIMESTAMP,ContextTokens,GeneratedTokens\n", mooncake;
  for (int i = 0; i < 5; ++i) {
    azure += "2023-11-16 18:15:" + std::string(seconds[i]) + ".0," + std::to_string(40 + i) + ",2\n";
    mooncake += "{\"timestamp\": " + std::to_string((std::stoi(seconds[i]) - 46) * 1000) +
                ", \"input_length\": " + std::to_string(40 + i) + ", \"output_length\": 2, \"hash_ids\": [" +
                std::to_string(i) + "]}\n";
  }
  for (const auto& reqs : {pt::parse_azure_csv(azure, "t.csv"), pt::parse_mooncake_jsonl(mooncake, "t.jsonl")}) {
    ASSERT_EQ(reqs.size(), 5u);
    EXPECT_EQ(reqs[0].prompt_len, 40);  // read in file order
    pt::SchedulerConfig c;
    c.page_size = 16;
    c.num_pages = 64;
    c.max_running = 1;  // one at a time: the admission order is the queue order
    pt::Scheduler s(small_model(-1), c, reqs);
    std::vector<int> served;
    for (const auto& p : drive(s))
      for (const auto& r : p.rows)
        if (std::find(served.begin(), served.end(), r.request) == served.end()) served.push_back(r.request);
    EXPECT_EQ(served, want);
  }
}

// --window 2147483647: window + 1 + budget overflowed int in the fit check (UBSan) and
// let a request that cannot fit through. Such a window is full attention.
TEST(Scheduler, HugeWindowDoesNotOverflowAndActsAsFullAttention) {
  pt::SchedulerConfig c;
  c.page_size = 16;
  c.num_pages = 10;
  pt::ModelOverrides o;
  o.layers = 2, o.q_heads = 4, o.kv_heads = 2, o.head_dim = 64, o.window = INT_MAX;
  const pt::ModelSpec huge = pt::make_model("custom", o);
  ASSERT_EQ(huge.groups.size(), 1u);
  ASSERT_EQ(huge.groups[0].window_left, INT_MAX);
  try {
    pt::Scheduler(huge, c, {{0.0, 1000, 10, {}}});
    ADD_FAILURE() << "a request of 64 pages fit in 9";
  } catch (const pagedmha::Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 64 pages of group sliding_attention"), std::string::npos) << e.what();
  }
  std::vector<pt::Request> reqs = pt::default_workload(6, 4);
  for (auto& r : reqs) r.hash_ids.clear();
  c.num_pages = 400;
  c.token_budget = 700;
  pt::Scheduler full(small_model(-1), c, reqs), windowed(huge, c, reqs);
  const auto a = drive(full), b = drive(windowed);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].rows.size(), b[i].rows.size()) << i;
    for (size_t j = 0; j < a[i].rows.size(); ++j) EXPECT_EQ(a[i].rows[j].seq_len, b[i].rows[j].seq_len) << i;
  }
}

// Library callers get the trace readers' length limit too (the KV length stays int32).
TEST(Scheduler, RejectsRequestsBeyondTheKvLengthLimit) {
  pt::SchedulerConfig c;
  c.num_pages = 1 << 20;
  try {
    pt::Scheduler(small_model(-1), c, {{0.0, 1 << 30, 1 << 30, {}}});
    ADD_FAILURE() << "2^31 tokens accepted";
  } catch (const pagedmha::Error& e) {
    EXPECT_NE(std::string(e.what()).find("request 0: prompt + output tokens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1073741824 + 1073741824"), std::string::npos) << e.what();
  }
}
