// AttentionParams::sm_margin's rule for the persistent grids (cuda/common/grid.h): the
// SMs (or clusters) a grid keeps, counted by hand.
#include <gtest/gtest.h>

#include <climits>

#include "cuda/common/grid.h"

namespace {

using pagedmha::cuda::units_left;

TEST(PersistentGrid, SmMarginLeavesWholeUnits) {
  // One SM per unit: 132 SMs less the margin, never below one.
  EXPECT_EQ(units_left(132, 0), 132);
  EXPECT_EQ(units_left(132, 16), 116);
  EXPECT_EQ(units_left(132, 131), 1);
  EXPECT_EQ(units_left(132, 132), 1);
  EXPECT_EQ(units_left(132, INT_MAX), 1);
  // Clusters of two SMs (66 on 132 SMs): a margin of 1 or 2 SMs costs one cluster, 3 two.
  EXPECT_EQ(units_left(66, 0, 2), 66);
  EXPECT_EQ(units_left(66, 1, 2), 65);
  EXPECT_EQ(units_left(66, 2, 2), 65);
  EXPECT_EQ(units_left(66, 3, 2), 64);
  EXPECT_EQ(units_left(66, 131, 2), 1);
  EXPECT_EQ(units_left(66, INT_MAX, 2), 1);
}

}  // namespace
