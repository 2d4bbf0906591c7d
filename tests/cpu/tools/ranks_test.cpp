// Rank bookkeeping of the multi-GPU replay: tensor-parallel head ranges (KV heads
// replicated when Hkv < tp), decode-context-parallel token ownership (whole pages
// round-robin), per-rank page pools and the scheduler's per-rank page accounting.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "common/error_text.h"
#include "pagedmha/error.h"
#include "replay/kv_pool.h"
#include "replay/model.h"
#include "replay/ranks.h"
#include "replay/scheduler.h"
#include "replay/trace.h"

namespace pt = pagedmha::tools;

namespace {

std::string tp_error(int hq, int hkv, int tp) {
  return testutil::error_of([&] { pt::tp_shard(hq, hkv, tp, 0); });
}

}  // namespace

TEST(TpShard, HandComputedRanges) {
  // llama3-70b (64 / 8 heads) on 4 ranks: rank 2 serves query heads 32..47, KV heads 4..5.
  const pt::TpShard a = pt::tp_shard(64, 8, 4, 2);
  EXPECT_EQ(a.q_begin, 32);
  EXPECT_EQ(a.q_heads, 16);
  EXPECT_EQ(a.kv_begin, 4);
  EXPECT_EQ(a.kv_heads, 2);
  // 16 ranks, 8 KV heads: rank 5 serves query heads 20..23, whose KV head 20 / 8 = 2 it
  // holds alone (replicated on ranks 4 and 5).
  const pt::TpShard b = pt::tp_shard(64, 8, 16, 5);
  EXPECT_EQ(b.q_begin, 20);
  EXPECT_EQ(b.q_heads, 4);
  EXPECT_EQ(b.kv_begin, 2);
  EXPECT_EQ(b.kv_heads, 1);
  // One rank: everything.
  const pt::TpShard c = pt::tp_shard(28, 4, 1, 0);
  EXPECT_EQ(c.q_begin, 0);
  EXPECT_EQ(c.q_heads, 28);
  EXPECT_EQ(c.kv_begin, 0);
  EXPECT_EQ(c.kv_heads, 4);
}

// For every (Hq, Hkv, tp) the rules accept: the ranks' query heads partition [0, Hq), each
// query head's KV head (h / (Hq / Hkv)) is among its rank's KV heads, every KV head is held
// by some rank, and each rank holds the per-rank count make_model gives (--tp alone).
TEST(TpShard, RanksPartitionQueryHeadsAndHoldTheirKvHeads) {
  int cases = 0;
  for (int hkv : {1, 2, 4, 8})
    for (int group : {1, 2, 4, 8})
      for (int tp : {1, 2, 3, 4, 8, 16}) {
        const int hq = hkv * group;
        if (hq % tp != 0 || (hkv % tp != 0 && tp % hkv != 0)) continue;
        ++cases;
        std::vector<int> q_owner(hq, -1);
        std::set<int> kv_held;
        pt::ModelOverrides o;
        o.layers = 1, o.q_heads = hq, o.kv_heads = hkv, o.head_dim = 64, o.tp = tp;
        const pt::ModelSpec rank_model = pt::make_model("custom", o);
        for (int r = 0; r < tp; ++r) {
          const pt::TpShard s = pt::tp_shard(hq, hkv, tp, r);
          EXPECT_EQ(s.q_heads, rank_model.num_q_heads);
          EXPECT_EQ(s.kv_heads, rank_model.num_kv_heads);
          for (int h = s.q_begin; h < s.q_begin + s.q_heads; ++h) {
            ASSERT_GE(h, 0);
            ASSERT_LT(h, hq);
            EXPECT_EQ(q_owner[h], -1) << "query head " << h << " on two ranks";
            q_owner[h] = r;
            const int kv = h / (hq / hkv);
            EXPECT_GE(kv, s.kv_begin) << hq << "/" << hkv << " tp " << tp << " rank " << r;
            EXPECT_LT(kv, s.kv_begin + s.kv_heads) << hq << "/" << hkv << " tp " << tp << " rank " << r;
          }
          for (int kv = s.kv_begin; kv < s.kv_begin + s.kv_heads; ++kv) kv_held.insert(kv);
        }
        EXPECT_EQ(std::count(q_owner.begin(), q_owner.end(), -1), 0);
        EXPECT_EQ(static_cast<int>(kv_held.size()), hkv);
      }
  EXPECT_GT(cases, 30);
}

TEST(TpShard, BadTpNamesTheFlag) {
  EXPECT_EQ(tp_error(32, 8, 3), "replay: --tp: expected >= 1 and dividing the query heads (32), got 3");
  EXPECT_EQ(tp_error(48, 6, 16), "replay: --tp: expected a divisor or multiple of the KV heads (6), got 16");
  EXPECT_EQ(tp_error(32, 8, 0), "replay: --tp: expected >= 1 and dividing the query heads (32), got 0");
}

TEST(DcpLayout, HandComputedOwnership) {
  // 2 ranks, pages of 4: positions 0-3 and 8-9 on rank 0, 4-7 on rank 1.
  const pt::DcpLayout d{2, 4};
  EXPECT_EQ(d.owner(3), 0);
  EXPECT_EQ(d.owner(4), 1);
  EXPECT_EQ(d.owner(9), 0);
  EXPECT_EQ(d.local_position(9), 5);  // rank 0's local page 1, offset 1
  EXPECT_EQ(d.local_position(6), 2);
  EXPECT_EQ(d.local_len(0, 10), 6);
  EXPECT_EQ(d.local_len(1, 10), 4);
  EXPECT_EQ(d.local_len(1, 5), 1);
  EXPECT_EQ(d.local_len(1, 4), 0);
  EXPECT_EQ(d.local_pages(0, 10), 2);
  EXPECT_EQ(d.local_pages(1, 10), 1);
  EXPECT_EQ(d.local_pages(1, 4), 0);
  EXPECT_EQ(d.local_len(0, 0), 0);
}

// Each rank's key set, read back from its local sequence [0, local_len) through the inverse
// of the layout (local page k is logical page k * ranks + rank), is exactly the positions
// it owns; the sets are disjoint and their union is the request's keys [0, L).
TEST(DcpLayout, RankKeySetsPartitionTheRequest) {
  for (int ranks : {1, 2, 3, 8})
    for (int P : {1, 4, 16})
      for (int64_t L = 0; L <= 200; ++L) {
        const pt::DcpLayout d{ranks, P};
        std::vector<int> seen(L, 0);
        int64_t total = 0;
        for (int r = 0; r < ranks; ++r) {
          const int64_t n = d.local_len(r, L);
          total += n;
          EXPECT_EQ(d.local_pages(r, L), (n + P - 1) / P) << ranks << " " << P << " " << L << " rank " << r;
          for (int64_t j = 0; j < n; ++j) {
            const int64_t p = (j / P * ranks + r) * P + j % P;
            ASSERT_LT(p, L) << "rank " << r << " local " << j << " maps past the request";
            EXPECT_EQ(d.owner(p), r);
            EXPECT_EQ(d.local_position(p), j);
            ++seen[p];
          }
        }
        EXPECT_EQ(total, L);
        for (int64_t p = 0; p < L; ++p) ASSERT_EQ(seen[p], 1) << "position " << p << " ranks " << ranks << " P " << P;
      }
}

TEST(PagePool, OwnersHoldDisjointIdRanges) {
  pt::PagePool pool(5, 3);  // 4 usable pages on each of 3 ranks
  EXPECT_EQ(pool.capacity(), 12);
  EXPECT_EQ(pool.owners(), 3);
  EXPECT_EQ(pool.owner_capacity(), 4);
  EXPECT_EQ(pool.allocate(1), 5);
  EXPECT_EQ(pool.allocate(1), 6);
  EXPECT_EQ(pool.owner_of(6), 1);
  EXPECT_EQ(pool.local_id(6), 2);
  EXPECT_EQ(pool.local_id(12), 4);
  EXPECT_EQ(pool.owner_of(12), 2);
  EXPECT_EQ(pool.free_pages(1), 2);
  EXPECT_EQ(pool.used_pages(1), 2);
  EXPECT_EQ(pool.free_pages(), 10);
  EXPECT_EQ(pool.allocate(1), 7);
  EXPECT_EQ(pool.allocate(1), 8);
  EXPECT_EQ(pool.allocate(1), 0);  // rank 1 is full while the others are not
  EXPECT_EQ(pool.free_pages(0), 4);
  pool.release(6);
  EXPECT_EQ(pool.free_pages(1), 1);
  EXPECT_EQ(pool.allocate(1), 6);
  EXPECT_EQ(pool.allocate(0), 1);
  EXPECT_EQ(pool.local_id(0), 0);
}

namespace {

pt::ModelSpec dcp_model(bool sliding) {
  pt::ModelOverrides o;
  o.layers = 2, o.q_heads = 4, o.kv_heads = 2, o.head_dim = 64;
  return pt::make_model(sliding ? "gpt-oss-20b" : "custom", o);
}

}  // namespace

// A scheduler whose full-attention pages are dealt to 3 ranks: logical page c of every
// request on rank c % 3 (check_invariants verifies it), each rank's use within its own
// pool, the sliding group whole; under page pressure with the prefix cache all requests
// finish, and at every step each request holds on each rank the pages DcpLayout gives that
// rank for the request's length.
TEST(Scheduler, DecodeContextParallelPagesPerRank) {
  for (bool sliding : {false, true}) {
    const int ranks = 3, P = 16;
    std::vector<pt::Request> reqs = pt::default_workload(24, 3);
    pt::SchedulerConfig c;
    c.page_size = P;
    // Per rank: forces preemption. The sliding group (whole on each rank) holds a request's
    // prefix-cache hits besides its window, so it needs more than its window alone.
    const int64_t per_rank = sliding ? 200 : 140;
    c.num_pages = 1 + per_rank;
    c.token_budget = 512;
    c.max_running = 12;
    c.cp_ranks = ranks;
    pt::Scheduler s(dcp_model(sliding), c, reqs);
    const size_t full = 0;  // gpt-oss layout too: group 0 is full attention
    ASSERT_EQ(s.owners(full), ranks);
    ASSERT_EQ(s.pools()[full].capacity(), 3 * per_rank);
    if (sliding) {
      ASSERT_EQ(s.owners(1), 1);  // the sliding group: whole on every rank
      ASSERT_EQ(s.pools()[1].capacity(), per_rank);
    }
    const pt::DcpLayout d{s.owners(full), P};
    int64_t steps = 0;
    while (!s.done() && steps < 100000) {
      const pt::StepPlan plan = s.schedule();
      s.complete(plan);
      s.check_invariants();
      ++steps;
      std::vector<std::set<int32_t>> held(ranks);  // distinct pages of running requests per rank
      for (size_t r = 0; r < reqs.size(); ++r) {
        const pt::RequestState& st = s.states()[r];
        if (st.phase != pt::RequestState::Phase::running) continue;
        const int64_t pages = static_cast<int64_t>(st.pages[full].size());
        std::vector<int64_t> mine(ranks, 0);
        for (int32_t page : st.pages[full]) {
          ASSERT_NE(page, 0);
          const int o = s.pools()[full].owner_of(page);
          ++mine[o];
          held[o].insert(page);
        }
        for (int o = 0; o < ranks; ++o) EXPECT_EQ(mine[o], d.local_pages(o, pages * P)) << "request " << r;
      }
      for (int o = 0; o < ranks; ++o)
        EXPECT_LE(static_cast<int64_t>(held[o].size()), s.pools()[full].used_pages(o)) << "rank " << o;
    }
    ASSERT_TRUE(s.done());
    EXPECT_GT(s.stats().preemptions, 0) << "the pool was meant to be tight";
    for (int o = 0; o < s.owners(full); ++o) EXPECT_LE(s.stats().peak_owner_pages[full][o], per_rank);
  }
}

// The up-front fit check counts the rank holding the most of a request's pages.
TEST(Scheduler, DecodeContextParallelFitIsPerRank) {
  pt::SchedulerConfig c;
  c.page_size = 16;
  c.num_pages = 1 + 10;  // 10 pages per rank
  c.cp_ranks = 2;
  c.token_budget = 4096;
  // 20 pages fit on 2 ranks (10 each); 21 need 11 on rank 0.
  pt::Scheduler ok(dcp_model(false), c, {pt::Request{0.0, 20 * 16 - 2, 1, {}}});
  try {
    pt::Scheduler bad(dcp_model(false), c, {pt::Request{0.0, 20 * 16, 1, {}}});
    ADD_FAILURE() << "a request of 21 pages fit 2 ranks of 10";
  } catch (const pagedmha::Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 11 pages of group full_attention on one of 2 ranks"),
              std::string::npos)
        << e.what();
  }
}
