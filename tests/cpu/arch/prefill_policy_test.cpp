// The Hopper prefill kernel's shared-memory and register layout (src/cuda/prefill_sm90/
// policy.h, plain C++), against layouts worked out by hand from the rules stated there:
// 227 KB per CTA less 1 KB of alignment slack and 256 bytes of barriers; two query-tile
// buffers where two K and three V stages still fit, else one; up to four K and four V
// stages, an odd tile to V; setmaxnreg splits within the CTA's launch registers.
#include <gtest/gtest.h>

#include "cuda/prefill_sm90/policy.h"

namespace {

using pagedmha::cuda::sm90::PrefillPolicy;
using pagedmha::cuda::sm90::d256_tma_block_n;
using pagedmha::cuda::sm90::kD256ShortQ;

struct Layout {
  int warpgroups, producers, q_slots, k_stages, v_stages, smem_bytes, producer_regs, consumer_regs;
};

template <class P>
Layout layout_of() {
  return {P::kConsumerWarpgroups, P::kProducerWarpgroups, P::kQSlots,       P::kKStages,
          P::kVStages,            P::kSmemBytes,          P::kProducerRegs, P::kConsumerRegs};
}

void expect_layout(const Layout& got, const Layout& want, const char* what) {
  EXPECT_EQ(got.warpgroups, want.warpgroups) << what;
  EXPECT_EQ(got.producers, want.producers) << what;
  EXPECT_EQ(got.q_slots, want.q_slots) << what;
  EXPECT_EQ(got.k_stages, want.k_stages) << what;
  EXPECT_EQ(got.v_stages, want.v_stages) << what;
  EXPECT_EQ(got.smem_bytes, want.smem_bytes) << what;
  EXPECT_EQ(got.producer_regs, want.producer_regs) << what;
  EXPECT_EQ(got.consumer_regs, want.consumer_regs) << what;
}

// Room for K / V tiles: 227 * 1024 - 1024 - 256 = 231,168 bytes less Q and fp8 staging.
TEST(PrefillSm90Policy, LayoutsWorkedOutByHand) {
  // D = 128, 16-bit: Q 128 x 128 x 2 = 32 KB, tiles 32 KB; two Q leave 165,632 B = 5
  // tiles -> Q 2, K 2, V 3 (1024 + 64 KB + 5 x 32 KB + 256 = 230,656).
  expect_layout(layout_of<PrefillPolicy<128, false, true>>(), {2, 1, 2, 2, 3, 230656, 72, 216}, "D128 bf16 tma");
  expect_layout(layout_of<PrefillPolicy<128, false, false>>(), {2, 1, 2, 2, 3, 230656, 72, 216}, "D128 bf16 gather");
  // D = 128, fp8 by TMA: two producer warpgroups converting in place (no staging slots),
  // so the bf16 layout: Q 2, K 2, V 3. 512 threads: 256 x 56 + 256 x 200 = 65,536
  // registers.
  expect_layout(layout_of<PrefillPolicy<128, true, true>>(), {2, 2, 2, 2, 3, 230656, 56, 200}, "D128 fp8");
  EXPECT_TRUE((PrefillPolicy<128, true, true>::kFp8InPlace));
  EXPECT_EQ((PrefillPolicy<128, true, true>::kRawSlots), 0);
  // The fp8 gather keeps one producer warpgroup (its row addresses need 72 registers) and
  // four 16 KB staging slots: two Q leave 3 tiles (< 5) -> Q 1, 4 tiles.
  expect_layout(layout_of<PrefillPolicy<128, true, false>>(), {2, 1, 1, 2, 2, 230656, 72, 216}, "D128 fp8 gather");
  // D = 64, 16-bit, TMA: three warpgroups (192 rows), Q 24 KB, tiles 16 KB: two Q leave
  // 11 tiles -> 4 and 4 (1024 + 48 KB + 8 x 16 KB + 256 = 181,504); 32 / 160 registers.
  expect_layout(layout_of<PrefillPolicy<64, false, true>>(), {3, 1, 2, 4, 4, 181504, 32, 160}, "D64 bf16 tma");
  // D = 64, fp8: two consumer and two producer warpgroups, Q 16 KB, staging 4 x 8 KB (a
  // raw row is half a panel row: no conversion in place): two Q leave 10 tiles -> 4, 4.
  expect_layout(layout_of<PrefillPolicy<64, true, true>>(), {2, 2, 2, 4, 4, 197888, 56, 200}, "D64 fp8");
  // Its 192-row form: three consumer warpgroups and one producer warpgroup in two teams,
  // Q 24 KB, the same staging: two Q leave 9 tiles -> 4, 4 (1024 + 48 KB + 8 x 16 KB +
  // 32 KB + 256 = 214,272); 32 / 160 registers as bf16's three warpgroups.
  expect_layout(layout_of<PrefillPolicy<64, true, true, 0, 192>>(), {3, 1, 2, 4, 4, 214272, 32, 160}, "D64 fp8 192");
  EXPECT_EQ((PrefillPolicy<64, true, true, 0, 192>::kProducerRoles), 2);
  EXPECT_EQ((PrefillPolicy<64, true, true, 0, 192>::kRoleThreads), 64);
  // D = 256, 16-bit by TMA: Q 64 KB, tiles of 80 keys 40 KB; two Q leave 2 tiles -> one
  // Q, 165,632 B = 4 tiles: K 2, V 2 (1024 + 64 KB + 4 x 40 KB + 256 = 230,656). 384
  // threads x 168 = 64,512 registers: 128 x 56 for the producer, 256 x 224.
  expect_layout(layout_of<PrefillPolicy<256, false, true>>(), {2, 1, 1, 2, 2, 230656, 56, 224}, "D256 bf16 tma");
  // The gather keeps tiles of 64 keys, 32 KB: one Q, 5 tiles: K 2, V 3 (1024 + 64 KB +
  // 5 x 32 KB + 256 = 230,656), 72 / 216 registers.
  expect_layout(layout_of<PrefillPolicy<256, false, false>>(), {2, 1, 1, 2, 3, 230656, 72, 216}, "D256 bf16 gather");
  // Short launches by TMA (kD256ShortQ) take the same 64-key layout.
  EXPECT_EQ(d256_tma_block_n(1), 64);
  EXPECT_EQ(d256_tma_block_n(kD256ShortQ), 64);
  EXPECT_EQ(d256_tma_block_n(kD256ShortQ + 1), 80);
  EXPECT_EQ((PrefillPolicy<256, false, true>::kBlockN), 80);
  EXPECT_EQ((PrefillPolicy<256, false, true, 64>::kBlockN), 64);
  expect_layout(layout_of<PrefillPolicy<256, false, true, 64>>(), {2, 1, 1, 2, 3, 230656, 72, 216}, "D256 bf16 tma 64");
  // D = 256, fp8: two 16 KB staging slots (one producer warpgroup): one Q leaves 4 tiles.
  expect_layout(layout_of<PrefillPolicy<256, true, true>>(), {2, 1, 1, 2, 2, 230656, 72, 216}, "D256 fp8");
  // Its producer warpgroup as one team, or (PAGEDMHA_SM90_FP8_D256_TEAMS=1) two teams of
  // two warps with a staging slot each: the same layout.
  EXPECT_EQ((PrefillPolicy<256, true, true>::kRoleThreads), PAGEDMHA_SM90_FP8_D256_TEAMS != 0 ? 64 : 128);
}

// Every layout fits the CTA's 227 KB, and the setmaxnreg split stays within the registers
// the launch gives the CTA (threads x 64K / threads rounded down to 8): asking for more
// never returns.
template <class P>
void expect_fits(const char* what) {
  EXPECT_LE(P::kSmemBytes, 227 * 1024) << what;
  EXPECT_GE(P::kKStages, 2) << what;
  EXPECT_GE(P::kVStages, P::kKStages) << what;
  const int launch_regs = P::kThreads * (65536 / P::kThreads / 8 * 8);
  EXPECT_EQ(P::kThreads, 128 * (P::kProducerWarpgroups + P::kConsumerWarpgroups)) << what;
  EXPECT_LE(128 * P::kProducerWarpgroups * P::kProducerRegs + 128 * P::kConsumerWarpgroups * P::kConsumerRegs,
            launch_regs)
      << what;
  // Each producer team its own staging slots; none when converting in place, and
  // only at D = 128 (a raw row is then exactly a panel row of the stage).
  EXPECT_EQ(P::kRawSlots % P::kProducerRoles, 0) << what;
  EXPECT_EQ(P::kRoleThreads * P::kProducerRoles, 128 * P::kProducerWarpgroups) << what;
  if (P::kFp8InPlace) {
    EXPECT_EQ(P::kRawSlots, 0) << what;
    EXPECT_EQ(P::kHeadDim, 128) << what;
    EXPECT_EQ(P::kRawBytes * 2, P::kTileBytes) << what;
  } else if (P::kFp8Kv) {
    EXPECT_GT(P::kRawSlots, 0) << what;
  }
}

TEST(PrefillSm90Policy, EveryInstantiationFitsSharedMemoryAndRegisters) {
  expect_fits<PrefillPolicy<64, false, true>>("D64 bf16 tma");
  expect_fits<PrefillPolicy<64, false, false>>("D64 bf16 gather");
  expect_fits<PrefillPolicy<64, true, true>>("D64 fp8 tma");
  expect_fits<PrefillPolicy<64, true, true, 0, 192>>("D64 fp8 tma 192");
  expect_fits<PrefillPolicy<64, true, false>>("D64 fp8 gather");
  expect_fits<PrefillPolicy<128, false, true>>("D128 bf16 tma");
  expect_fits<PrefillPolicy<128, false, false>>("D128 bf16 gather");
  expect_fits<PrefillPolicy<128, true, true>>("D128 fp8 tma");
  expect_fits<PrefillPolicy<128, true, false>>("D128 fp8 gather");
  expect_fits<PrefillPolicy<256, false, true>>("D256 bf16 tma");
  expect_fits<PrefillPolicy<256, false, false>>("D256 bf16 gather");
  expect_fits<PrefillPolicy<256, false, true, 64>>("D256 bf16 tma 64");
  expect_fits<PrefillPolicy<256, true, true>>("D256 fp8 tma");
  expect_fits<PrefillPolicy<256, true, false>>("D256 fp8 gather");
}

// fp8 KV at D = 64: 192-row tiles where their rounds of the grid, at 4/3 a 128-row
// round's time, take no longer (policy.h fp8_rows192_pays), worked out by hand for 132
// CTAs. The one-KV-head TP-8 rank (pack 8: 24 or 16 tokens per tile, one head unit): a
// 2k chunk is 84 tiles (one round) against 125 (one): not taken; two 3k chunks are 250
// (two rounds: 4 x 2 = 8) against 376 (three: 3 x 3 = 9), taken; an 8k extend 342
// (three: 12) against 512 (four: 12), taken. gpt-oss's eight KV heads at 1 x 16k: 5,464
// tiles (42 rounds) against 8,192 (63); at 4 x 4k 4 x 171 x 8 = 5,472 (42) against 8,192.
// 200 requests of 16 tokens are a tile each either way (1,600 tiles, 13 rounds): not
// taken, though their total rows alone would count 134 tiles against 200.
TEST(PrefillSm90Policy, Fp8Rows192WhereTheirRoundsPay) {
  using pagedmha::cuda::sm90::fp8_rows192_pays;
  if (PAGEDMHA_SM90_FP8_WG3 != 1) GTEST_SKIP() << "PAGEDMHA_SM90_FP8_WG3=" << PAGEDMHA_SM90_FP8_WG3;
  EXPECT_FALSE(fp8_rows192_pays(2000, 1, 2000, 8, 1, 132));
  EXPECT_TRUE(fp8_rows192_pays(6000, 2, 3000, 8, 1, 132));
  EXPECT_TRUE(fp8_rows192_pays(8192, 1, 8192, 8, 1, 132));
  EXPECT_TRUE(fp8_rows192_pays(16384, 1, 16384, 8, 8, 132));
  EXPECT_TRUE(fp8_rows192_pays(16384, 4, 4096, 8, 8, 132));
  EXPECT_FALSE(fp8_rows192_pays(3200, 200, 16, 8, 8, 132));
  EXPECT_FALSE(fp8_rows192_pays(100, 1, 100, 8, 1, 132));  // one tile either way
  EXPECT_FALSE(fp8_rows192_pays(0, 1, 1, 8, 1, 132));
  EXPECT_FALSE(fp8_rows192_pays(16384, 1, 16384, 8, 8, 0));
}

// The plan workspace (PlanLayout) against the size include/pagedmha/ops.h documents for
// prefill_workspace_size: 16 + 16 * ceil((batch + 1) / 4) + 16 * (total_q + batch) bytes,
// the entries (16 bytes each, hopper/schedule.cuh) 16-byte aligned after the count and the
// per-request prefix, and room for the most entries a step can have (one token per tile,
// each request's tiles in pairs, an odd count's last pair with an empty partner:
// total_q + batch).
TEST(PrefillSm90Policy, PlanWorkspaceMatchesTheDocumentedSize) {
  using pagedmha::cuda::sm90::PlanLayout;
  for (const int64_t batch : {1, 2, 3, 4, 5, 255, 256, 1000}) {
    for (const int64_t total_q : {int64_t{1}, batch, 4 * batch + 3, int64_t{1} << 20}) {
      const int64_t documented = 16 + 16 * ((batch + 1 + 3) / 4) + 16 * (total_q + batch);
      EXPECT_EQ(PlanLayout::bytes(batch, total_q), documented) << batch << " " << total_q;
      const int64_t list = PlanLayout::list_offset(batch);
      EXPECT_EQ(list % 16, 0) << batch;
      EXPECT_GE(list, 16 + 4 * (batch + 1)) << batch;  // count, then prefix[batch + 1]
      EXPECT_GE((PlanLayout::bytes(batch, total_q) - list) / 16, total_q + batch) << batch << " " << total_q;
    }
  }
}

}  // namespace
