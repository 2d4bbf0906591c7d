// The TMA box rule for paged K / V (src/cuda/hopper/kv_boxes.h, plain C++), against the
// rule as the Hopper kernels were first written for tiles of a power of two (boxes of a
// page, or of a tile where a page holds several; pages of 8 rows or more that divide the
// tile or are a multiple of it), and against tables worked out by hand for the tiles that
// are not a power of two (80 keys at D = 256, 96 with six decode warps).
#include <gtest/gtest.h>

#include "cuda/hopper/kv_boxes.h"

namespace {

using pagedmha::cuda::sm90::kv_box_layout_ok;
using pagedmha::cuda::sm90::kv_box_rows;

TEST(KvBoxes, PowerOfTwoTilesKeepTheOriginalRule) {
  for (int tile = 16; tile <= 256; tile *= 2) {
    for (int page = 1; page <= 1024; ++page) {
      const bool want = page % 8 == 0 && (tile % page == 0 || page % tile == 0);
      EXPECT_EQ(kv_box_layout_ok(page, tile), want) << "tile " << tile << " page " << page;
      if (want) EXPECT_EQ(kv_box_rows(page, tile), page < tile ? page : tile) << "tile " << tile << " page " << page;
    }
  }
}

struct Case {
  int page, rows;  // rows 0: no TMA
};

void expect_table(int tile, std::initializer_list<Case> cases) {
  for (const Case& c : cases) {
    EXPECT_EQ(kv_box_layout_ok(c.page, tile), c.rows > 0) << "tile " << tile << " page " << c.page;
    if (c.rows > 0) EXPECT_EQ(kv_box_rows(c.page, tile), c.rows) << "tile " << tile << " page " << c.page;
  }
}

TEST(KvBoxes, EightyKeyTilesTakeSixteenRowBoxes) {
  // 80 = 16 x 5: boxes of at most 16 rows, and pages those boxes tile.
  expect_table(80, {{8, 8}, {16, 16}, {32, 16}, {48, 16}, {64, 16}, {80, 16}, {256, 16}, {4096, 16},
                    {1, 0}, {12, 0}, {24, 0}, {40, 0}, {72, 0}, {120, 0}});
}

TEST(KvBoxes, NinetySixKeyTilesTakeThirtyTwoRowBoxes) {
  // 96 = 32 x 3.
  expect_table(96, {{8, 8}, {16, 16}, {32, 32}, {64, 32}, {96, 32}, {128, 32}, {24, 0}, {48, 0}, {80, 0}});
}

TEST(KvBoxes, NonsenseSizesAreRefused) {
  EXPECT_FALSE(kv_box_layout_ok(0, 64));
  EXPECT_FALSE(kv_box_layout_ok(-16, 64));
  EXPECT_FALSE(kv_box_layout_ok(16, 0));
}

}  // namespace

// Boxes of two adjacent KV heads (the Hopper decode's fp8 D = 64 items): the strides of
// the test oracle's layouts (tests/oracle/paged_problem.h make_paged_kv), at D = 64 with
// 8 KV heads and pages of 16: NHD and the interleaved K / V buffer have head stride D,
// head-major pages P D; an odd head count, or V alone strided otherwise, takes one head.
TEST(KvBoxes, HeadPairsOnlyWhereTheHeadsAreAdjacent) {
  using pagedmha::cuda::sm90::kv_heads_adjacent;
  const int D = 64, P = 16;
  EXPECT_TRUE(kv_heads_adjacent(8, D, D, D, 2));           // nhd3 / nhd4 / interleaved
  EXPECT_FALSE(kv_heads_adjacent(8, P * D, P * D, D, 2));  // hnd4
  EXPECT_FALSE(kv_heads_adjacent(8, D, P * D, D, 2));      // V head-major only
  EXPECT_FALSE(kv_heads_adjacent(8, 2 * D, 2 * D, D, 2));  // padded heads
  EXPECT_FALSE(kv_heads_adjacent(3, D, D, D, 2));          // odd count
  EXPECT_FALSE(kv_heads_adjacent(1, D, D, D, 2));
  EXPECT_TRUE(kv_heads_adjacent(2, D, D, D, 2));
  EXPECT_TRUE(kv_heads_adjacent(3, P * D, P * D, D, 1));  // one head per item: any layout
  EXPECT_FALSE(kv_heads_adjacent(8, D, D, D, 0));
}
