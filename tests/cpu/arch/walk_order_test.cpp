// The persistent grid's serpentine order over the plan's units (src/cuda/hopper/walk_order.h,
// plain C++) and the plan's choice of pairs or single tiles (prefill_sm90/policy.h), against
// the definitions: every unit goes to exactly one walker, one per round, walker c taking
// unit k S + c in even rounds and k S + S - 1 - c in odd ones; and against a makespan
// worked out by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "cuda/hopper/walk_order.h"
#include "cuda/prefill_sm90/policy.h"

namespace {

using pagedmha::cuda::sm90::kPlanPairRounds;
using pagedmha::cuda::sm90::plan_min_pairs;
using pagedmha::cuda::sm90::serpentine_next;

// Walker c's units below `units`, as params.cuh Walk steps through them.
std::vector<int> walk(int c, int S, int units) {
  std::vector<int> got;
  for (int q = c; q < units; q = serpentine_next(q, q / S, c, S)) got.push_back(q);
  return got;
}

TEST(WalkOrder, EveryUnitOnceOnePerRoundSerpentine) {
  for (int S : {1, 2, 3, 7, 64, 66, 132}) {
    for (int units : {0, 1, S - 1, S, S + 1, 2 * S + 3, 7 * S, 7 * S + 5}) {
      std::vector<int> seen(static_cast<size_t>(std::max(units, 0)), 0);
      for (int c = 0; c < S; ++c) {
        const std::vector<int> got = walk(c, S, units);
        for (size_t k = 0; k < got.size(); ++k) {
          const int want = static_cast<int>(k) * S + (k % 2 == 0 ? c : S - 1 - c);
          ASSERT_EQ(got[k], want) << "S " << S << " walker " << c << " round " << k;
          ++seen[static_cast<size_t>(got[k])];
        }
        // A walker stops only when its next unit is past the end: no unit of a later
        // round is left to it.
        const int k = static_cast<int>(got.size());
        EXPECT_GE(k * S + (k % 2 == 0 ? c : S - 1 - c), units) << "S " << S << " walker " << c;
      }
      for (int q = 0; q < units; ++q) EXPECT_EQ(seen[static_cast<size_t>(q)], 1) << "S " << S << " unit " << q;
    }
  }
}

// Four walkers, eight units of costs 8..1 sorted longest first: round-robin gives walker 0
// units 8 + 4 = 12 against an ideal 9; serpentine gives every walker 9.
TEST(WalkOrder, SerpentineBalancesARamp) {
  const int S = 4;
  const int cost[] = {8, 7, 6, 5, 4, 3, 2, 1};
  for (int c = 0; c < S; ++c) {
    int load = 0;
    for (int q : walk(c, S, 8)) load += cost[q];
    EXPECT_EQ(load, 9) << "walker " << c;
  }
}

// Pairs from kPlanPairRounds rounds of units on (0 with the knob at 0: always pairs): at three
// rounds 66 clusters of one KV head (a TP-8 rank) need 198 pairs, 132 CTAs of 8 units per
// pair (gpt-oss fp8) 50.
TEST(WalkOrder, PairsFromThreeRounds) {
  if (kPlanPairRounds == 0) {
    EXPECT_EQ(plan_min_pairs(66, 1), 0);
    EXPECT_EQ(plan_min_pairs(132, 8), 0);
    return;
  }
  ASSERT_EQ(kPlanPairRounds, 3) << "the worked numbers below are for three rounds";
  EXPECT_EQ(plan_min_pairs(66, 1), 198);
  EXPECT_EQ(plan_min_pairs(132, 8), 50);
  EXPECT_EQ(plan_min_pairs(66, 8), 25);  // 24.75 rounds up
  EXPECT_EQ(plan_min_pairs(1, 1), 3);
}

}  // namespace
