// The Hopper decode's dispatch and tile shapes (src/cuda/decode_sm90/policy.h, plain C++):
// which row tile a call gets, and the ring's keys per warp tile and stage counts, against
// values worked out by hand from the layout stated there (228 KB of shared memory per SM,
// 1 KB reserved per CTA, two CTAs; 1 KB alignment slack, two fp32 epilogue buffers of
// rows x stride, (m, l) per warp and row plus a scale per row, 8 full + 8 empty barriers).
#include <gtest/gtest.h>

#include "cuda/decode_sm90/policy.h"

namespace {

using namespace pagedmha::cuda::sm90;

// G x q_len rows of a KV head: up to 8 on the operand-swapped tile, 9-16 on the 16-row
// tile (5 x 3 = 15 included), 17-32 on the 32-row tile at D = 64 only, more (or fp8
// queries) not on this kernel.
TEST(DecodeSm90Policy, RowTileFollowsRowsPerKvHead) {
  struct Row {
    int d, group, q_len, tile;
    bool ok;
  };
  const Row rows[] = {
      {128, 1, 1, 8, true},   {128, 4, 1, 8, true},   {64, 8, 1, 8, true},   {128, 4, 2, 8, true},
      {64, 1, 8, 8, true},    {64, 8, 2, 16, true},   {128, 4, 4, 16, true}, {128, 16, 1, 16, true},
      {64, 5, 3, 16, true},   {128, 5, 4, 32, false}, {64, 5, 4, 32, true},  {64, 8, 4, 32, true},
      {64, 8, 3, 32, true},   {128, 8, 4, 32, false}, {64, 8, 5, 32, false}, {64, 33, 1, 32, false},
      {128, 71, 1, 32, false},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(decode_sm90_rows_ok(r.d, r.group, r.q_len, /*q_fp8=*/false), r.ok)
        << "D " << r.d << ": " << r.group << " x " << r.q_len;
    if (r.ok) EXPECT_EQ(decode_sm90_row_tile(r.group, r.q_len), r.tile) << r.group << " x " << r.q_len;
  }
  EXPECT_FALSE(decode_sm90_rows_ok(64, 4, 1, /*q_fp8=*/true));
}

// Two KV heads per work item: fp8 caches at D = 64 with an even KV head count only (the
// cache's layout, adjacent heads, is the tensor maps' test).
TEST(DecodeSm90Policy, KvHeadPairsOnlyForFp8AtHeadDim64) {
  EXPECT_TRUE(decode_sm90_pairs_ok(64, /*kv_fp8=*/true, 8));
  EXPECT_TRUE(decode_sm90_pairs_ok(64, true, 2));
  EXPECT_FALSE(decode_sm90_pairs_ok(64, true, 1));
  EXPECT_FALSE(decode_sm90_pairs_ok(64, true, 3));
  EXPECT_FALSE(decode_sm90_pairs_ok(64, /*kv_fp8=*/false, 8));
  EXPECT_FALSE(decode_sm90_pairs_ok(128, true, 8));
}

// Per CTA with two CTAs per SM: 228 KB / 2 - 1 KB = 115712 bytes; minus 1024 (alignment),
// the epilogue 2 x rows x stride x 4, the statistics (2 x 4 warps x rows + rows) x 4 and
// 128 bytes of barriers; stages of 2 x 4 warps x KW keys x row bytes.
TEST(DecodeSm90Policy, TileShapesAndStages) {
  struct Row {
    int d, kw, stride, stages, stage_bytes;
    bool fp8;
    int rows;
    int heads = 1;
  };
  const Row rows[] = {
      // 8 rows: stride D + 4; (115712 - 1024 - 2 x 8 x 68 x 4 - 288 - 128) / 32768 = 3.35
      {64, 32, 68, 3, 32768, false, 8},
      // (115712 - 1024 - 8448 - 288 - 128) / 32768 = 3.23 (16 keys of 256-byte rows)
      {128, 16, 132, 3, 32768, false, 8},
      // fp8 D = 64: 64 keys per warp (64-byte rows): 2 x 256 x 64 = 32768; 3.35
      {64, 64, 68, 3, 32768, true, 8},
      // fp8 D = 128: 32 keys of 128-byte rows; 3.23
      {128, 32, 132, 3, 32768, true, 8},
      // 16 rows: stride D + 8; (115712 - 1024 - 17408 - 576 - 128) / 32768 = 2.95
      {128, 16, 136, 2, 32768, false, 16},
      // fp8 D = 64, 32 keys: (115712 - 1024 - 9216 - 576 - 128) / 16384 = 6.4
      {64, 32, 72, 6, 16384, true, 16},
      // 32 rows, 16 keys of 128-byte rows: (115712 - 1024 - 18432 - 1152 - 128) / 16384 = 5.8
      {64, 16, 72, 5, 16384, false, 32},
      // fp8, 32 keys of 64-byte rows: the same bytes
      {64, 32, 72, 5, 16384, true, 32},
      // fp8 D = 64, two KV heads per item: 128-byte rows (both heads), 32 keys, 16 rows of
      // stride D + 4: (115712 - 1024 - 8704 - 576 - 128) / 32768 = 3.2
      {64, 32, 68, 3, 32768, true, 8, 2},
  };
  const auto check = [](const Row& r, int kw, int stride, int stages, int stage_bytes, int smem, int per_cta) {
    EXPECT_EQ(kw, r.kw) << "D " << r.d << " fp8 " << r.fp8 << " rows " << r.rows;
    EXPECT_EQ(stride, r.stride) << "D " << r.d << " rows " << r.rows;
    EXPECT_EQ(stride % 4, 0) << "float4 reads of the epilogue buffers";
    EXPECT_EQ(stages, r.stages) << "D " << r.d << " fp8 " << r.fp8 << " rows " << r.rows;
    EXPECT_EQ(stage_bytes, r.stage_bytes) << "D " << r.d << " fp8 " << r.fp8 << " rows " << r.rows;
    EXPECT_LE(smem, per_cta);
  };
  for (const Row& r : rows) {
    const auto run = [&](auto pol) {
      using P = decltype(pol);
      check(r, P::KW, P::kOStride, P::kStages, P::kStageBytes, P::kSmemBytes, P::kSmemPerCta);
    };
    if (r.d == 64 && !r.fp8 && r.rows == 8) run(DecodePolicy<64, false, 8>{});
    if (r.d == 128 && !r.fp8 && r.rows == 8) run(DecodePolicy<128, false, 8>{});
    if (r.d == 64 && r.fp8 && r.rows == 8 && r.heads == 1) run(DecodePolicy<64, true, 8>{});
    if (r.d == 64 && r.fp8 && r.rows == 8 && r.heads == 2) run(DecodePolicy<64, true, 8, 2>{});
    if (r.d == 128 && r.fp8 && r.rows == 8) run(DecodePolicy<128, true, 8>{});
    if (r.d == 128 && !r.fp8 && r.rows == 16) run(DecodePolicy<128, false, 16>{});
    if (r.d == 64 && r.fp8 && r.rows == 16) run(DecodePolicy<64, true, 16>{});
    if (r.d == 64 && !r.fp8 && r.rows == 32) run(DecodePolicy<64, false, 32>{});
    if (r.d == 64 && r.fp8 && r.rows == 32) run(DecodePolicy<64, true, 32>{});
  }
}

}  // namespace
