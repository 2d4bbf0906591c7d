// Tile sizes, stage counts and the dispatch condition of the Hopper decode kernel
// (kernel.cuh), with their reasons. Plain C++ (host and device). The split of a
// request's keys into work items is decode/policy.h's, shared with the portable decode.
#pragma once

// PAGEDMHA_DECODE_SM90=1 routes the decodes this kernel takes (decode_sm90_rows_ok and a
// TMA layout) to it. Off by default: on the H200 it is 5-50% slower than the portable
// decode on every standard shape (sixth session, runs 2 and 3: the per-item and per-tile
// latency chains of a warp that issues its own loads, docs/perf-notes/decode.md, "The
// Hopper decode"). It passes the GPU suite and the sanitizers when on (98acff5) and is
// the base for the producer-warp version. Experiment knobs (bench/decode_variants.sh):
// PAGEDMHA_DECODE_SM90_WARPS=w warps per CTA, PAGEDMHA_DECODE_SM90_KW=k keys per warp
// tile, PAGEDMHA_DECODE_SM90_STAGES=s stages (per warp, or of the ring),
// PAGEDMHA_DECODE_SM90_RING=1 one ring of kWarps x KW-key stages that a producer warp
// fills and every consumer warp reads its KW-key slice of, PAGEDMHA_DECODE_SM90_CTAS=c
// c CTAs per SM (each with 1 / c of the shared memory; with c = 2 four warps each),
// PAGEDMHA_DECODE_SM90_Q_AHEAD=1 the ring's producer loading each item's Q into a shared
// slot ahead of its stages.
#ifndef PAGEDMHA_DECODE_SM90_WARPS
#define PAGEDMHA_DECODE_SM90_WARPS 8
#endif
#ifndef PAGEDMHA_DECODE_SM90_KW
#define PAGEDMHA_DECODE_SM90_KW 0
#endif
#ifndef PAGEDMHA_DECODE_SM90_STAGES
#define PAGEDMHA_DECODE_SM90_STAGES 0
#endif
#ifndef PAGEDMHA_DECODE_SM90_RING
#define PAGEDMHA_DECODE_SM90_RING 0
#endif
#ifndef PAGEDMHA_DECODE_SM90_CTAS
#define PAGEDMHA_DECODE_SM90_CTAS 1
#endif
#ifndef PAGEDMHA_DECODE_SM90_Q_AHEAD
#define PAGEDMHA_DECODE_SM90_Q_AHEAD 0
#endif
#ifndef PAGEDMHA_DECODE_SM90
#define PAGEDMHA_DECODE_SM90 0
#endif

namespace pagedmha::cuda::sm90 {

/// One CTA per SM (kCtasPerSm); its kWarps warps share each work item (request, KV head, split) and
/// each streams a contiguous share of the item's key tiles through a ring of its own
/// (TMA boxes per page, an mbarrier per stage). A warp refills the stage it has just
/// used with the next tile of its stream, which crosses into the CTA's next item without
/// draining: the loads of the next item run during this item's last tiles and epilogue
/// (the portable decode refilled and drained its pipeline per item and kept one 32 KB
/// stage in flight per CTA: docs/perf-notes/decode.md, "What is in the way").
template <int D>
struct DecodePolicy {
  static constexpr int kHeadDim = D;
  // Eight warps, two per SMSP: with one warp per SMSP (four) every dependent step of a
  // tile (ldmatrix -> mma chains, the softmax's shuffles and ex2) is exposed; eight gained
  // 20-26% on gpt-oss over four and lost 3-8% on llama3-8b (H200, sixth session runs 2
  // and 3, docs/perf-notes/decode.md).
  static constexpr int kWarps = PAGEDMHA_DECODE_SM90_WARPS;  // consumer warps
  // One CTA-wide ring (experiment, off): a producer warp loads stages of kWarps x KW keys
  // (64 KB of K and V), one full barrier and one empty barrier (kWarps arrivals) per
  // stage, the boxes of a stage issued by its lanes in parallel, page ids a stage ahead;
  // consumer warp w reads keys [w KW, w KW + KW) of every stage of an item. A producer
  // warp issuing every warp's 16-key tiles one at a time lost 20-35% (3524b1d); the ring
  // beats the per-warp streams everywhere (+3 to +39%) and the portable decode on large
  // items only (gpt-oss +5-9%; windows -28%, the TP-8 rank -6 to -11%: H200 s11run1,
  // docs/perf-notes/decode.md), so it stays off.
  static constexpr bool kRing = PAGEDMHA_DECODE_SM90_RING != 0;
  // CTAs per SM: one. Two (experiment, prepared in the twelfth session and not yet run on
  // a GPU; with four warps each: 2 x 160 threads fit the consumers' 167 registers) would
  // overlap one CTA's item boundaries (Q load, the epilogue's CTA barriers) with the
  // other's loads, as the portable decode's three CTAs per SM do; the ring lost 6-28% to
  // it on small items (s11run1).
  static constexpr int kCtasPerSm = PAGEDMHA_DECODE_SM90_CTAS;
  static constexpr int kConsumerThreads = 32 * kWarps;
  static constexpr int kThreads = kConsumerThreads + (kRing ? 32 : 0);
  // The G * q_len query rows of a KV head in one m16 tile (mma.sync m16n8k16): decode
  // rows are few (G = 4..8), so wgmma's 64-row minimum would waste 3/4 or more of it.
  static constexpr int kRows = 16;
  // Keys per warp tile: 32 (S in 16 registers: half the per-tile costs of 16 keys, the
  // barrier wait, row maxima and rescale test); 16 at D = 128 with eight warps, whose
  // 8 KB tiles keep three stages per warp in shared memory (with two CTAs per SM, two
  // 32 KB ring stages per CTA).
  static constexpr int KW = PAGEDMHA_DECODE_SM90_KW > 0 ? PAGEDMHA_DECODE_SM90_KW
                            : (D == 128 && (kWarps > 4 || kCtasPerSm > 1) ? 16 : 32);
  static constexpr int kPanels = D / 64;  // 128-byte swizzled panels of a 16-bit row
  static constexpr int kChunks = D / 8;   // 16-byte chunks of a row
  // Keys of a stage (decode_split's tile, a.split_tile): a warp tile, or with the ring
  // every consumer warp's.
  static constexpr int kTileKeys = kRing ? kWarps * KW : KW;
  static constexpr int kTileBytes = kTileKeys * D * 2;  // K or V of one stage
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kRings = kRing ? 1 : kWarps;
  // Q by the ring's producer (experiment, prepared in the twelfth session, not yet run):
  // it copies each item's kRows query rows into one of two shared slots ahead of the
  // item's stages, and the consumer warps read their fragments from there, where each
  // warp had loaded the same rows from global memory at the item's start (~1,000 cycles
  // exposed per item, against ~6,000 of loads for a two-stage item of the TP-8 rank).
  // Holding the next item's Q in registers instead spills at D = 128 (ptxas's 168: nine
  // warps, three on one SM sub-partition).
  static constexpr bool kQAhead = PAGEDMHA_DECODE_SM90_Q_AHEAD != 0;
  static_assert(!kQAhead || kRing, "PAGEDMHA_DECODE_SM90_Q_AHEAD needs the ring (PAGEDMHA_DECODE_SM90_RING=1)");
  static constexpr int kQSlots = kQAhead ? 2 : 0;
  static constexpr int kQPitch = D * 2 + 16;  // bytes per row: fragment loads free of bank conflicts
  static constexpr int kQBytes = kQSlots * kRows * kQPitch;
  // Epilogue: two fp32 [kRows][D + 8] buffers (warps 0 and 1 write, then each further
  // pair adds, 2 and 3 first: a fixed order, so results do not depend on timing), then
  // (m, l) per warp and row and the row scales.
  static constexpr int kOStride = D + 8;
  static constexpr int kEpiBytes = 2 * kRows * kOStride * 4;
  static constexpr int kStatBytes = (2 * kWarps * kRows + kRows) * 4;
  static constexpr int kMaxStages = 8;
  static constexpr int kBarrierBytes = 2 * kWarps * kMaxStages * 8;  // full; the ring's empty
  // Stages per warp: as many as the SM's shared memory holds (eight warps: 3 at D = 64
  // and D = 128, 192 KB of K / V per SM); with kCtasPerSm CTAs, the CTA's share (228 KB
  // per SM, 1 KB of it reserved per CTA).
  static constexpr int kSmemPerCta = kCtasPerSm == 1 ? 227 * 1024 : 228 * 1024 / kCtasPerSm - 1024;
  static constexpr int kStagesFit =
      (kSmemPerCta - 1024 - kEpiBytes - kStatBytes - kBarrierBytes - kQBytes) / (kRings * kStageBytes);
  static constexpr int kStages = PAGEDMHA_DECODE_SM90_STAGES > 0 ? PAGEDMHA_DECODE_SM90_STAGES
                                 : kStagesFit < kMaxStages      ? kStagesFit
                                                                : kMaxStages;
  static constexpr int kSmemBytes =
      1024 /* alignment */ + kRings * kStages * kStageBytes + kEpiBytes + kStatBytes + kBarrierBytes + kQBytes;

  static_assert(D == 64 || D == 128, "head dims of the Hopper decode (D = 256 stays portable)");
  static_assert(KW % 16 == 0 && KW <= 64, "whole k16 steps of P V");
  static_assert(kWarps % 2 == 0 && kWarps <= 8, "warp pairs in the epilogue");
  static_assert(kStages >= 2 && kStages <= kMaxStages, "stages");
  // The ring's producer: one lane per (box, panel) of a stage, boxes of at least 8 keys
  // (paged_kv.cuh kv_tma_ok).
  static_assert(!kRing || kTileKeys / 8 * kPanels <= 32, "one lane per box of a stage");
  static_assert(kSmemBytes <= kSmemPerCta, "shared memory");
  static_assert(kCtasPerSm == 1 || kThreads * kCtasPerSm <= 320, "registers for the consumers (~170 each)");
};

/// The switch: batch_decode (decode.cu) tries this kernel only when it is on.
constexpr bool kDecodeSm90 = PAGEDMHA_DECODE_SM90 != 0;

/// Whether a decode call fits here: G * q_len_per_req rows in one m16 tile, 16-bit queries
/// (fp8 caches and queries stay on the portable kernel). The K / V layout test (TMA boxes
/// per page) is paged_kv.cuh's kv_tma_ok.
inline bool decode_sm90_rows_ok(int group, int q_len_per_req, bool q_fp8) {
  return !q_fp8 && group * q_len_per_req <= 16;
}

}  // namespace pagedmha::cuda::sm90
