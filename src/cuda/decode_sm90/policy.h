// Tile sizes, stage counts and the dispatch condition of the Hopper decode kernel
// (kernel.cuh), with their reasons. Plain C++ (host and device). The split of a
// request's keys into work items is decode/policy.h's, shared with the portable decode.
#pragma once

// The decodes this kernel takes (decode_sm90_rows_ok and a TMA layout) go to it by
// default on sm_90; PAGEDMHA_DECODE_SM90=0 sends them to the portable decode. The
// default shape is the ring (a producer warp filling one ring of stages per CTA) with two
// CTAs of four consumer warps per SM: against the portable decode +4 to +9% at 64 x 4k,
// window 127 and the TP-8 rank's 256 x 2k and 64 x 8k, level at 1 x 32k (llama3-8b) and
// 32 x 2k, -2% at llama3-8b 128 x 32k (H200 s13run2, docs/perf-notes/decode.md). Calls
// of up to 8 rows (G q_len <= 8: every plain decode of llama3-8b, gpt-oss and the TP-8
// rank) run the operand-swapped 8-row tile: fp8 -5 to -13%, the TP-8 rank -4 to -5%,
// others within +-1% (s18run1, docs/perf-notes/decode-swap.md).
// Experiment knobs (bench/prefill_variants.sh with KERNEL=decode):
// PAGEDMHA_DECODE_SM90_WARPS=w consumer warps per CTA, PAGEDMHA_DECODE_SM90_KW=k keys per
// warp tile, PAGEDMHA_DECODE_SM90_STAGES=s ring stages, PAGEDMHA_DECODE_SM90_CTAS=c CTAs
// per SM (each with 1 / c of the shared memory).
#ifndef PAGEDMHA_DECODE_SM90_WARPS
#define PAGEDMHA_DECODE_SM90_WARPS 4
#endif
#ifndef PAGEDMHA_DECODE_SM90_KW
#define PAGEDMHA_DECODE_SM90_KW 0
#endif
#ifndef PAGEDMHA_DECODE_SM90_STAGES
#define PAGEDMHA_DECODE_SM90_STAGES 0
#endif
#ifndef PAGEDMHA_DECODE_SM90_CTAS
#define PAGEDMHA_DECODE_SM90_CTAS 2
#endif
#ifndef PAGEDMHA_DECODE_SM90
#define PAGEDMHA_DECODE_SM90 1
#endif
// PAGEDMHA_DECODE_SM90_FP8=0 keeps fp8 e4m3 caches on the portable decode;
// PAGEDMHA_DECODE_SM90_FP8_QK_F16=0 computes their S = Q K^T in the query's dtype.
#ifndef PAGEDMHA_DECODE_SM90_FP8
#define PAGEDMHA_DECODE_SM90_FP8 1
#endif
#ifndef PAGEDMHA_DECODE_SM90_FP8_QK_F16
#define PAGEDMHA_DECODE_SM90_FP8_QK_F16 1
#endif
// PAGEDMHA_DECODE_SM90_ORDER=0 walks a request's items KV head by KV head (each head's
// splits in a row) instead of split by split (policy below).
// PAGEDMHA_DECODE_SM90_FP8_CTAS=c and PAGEDMHA_DECODE_SM90_FP8_KW=k: CTAs per SM and
// keys per warp tile of the fp8 D = 64 kernel (the others follow
// PAGEDMHA_DECODE_SM90_CTAS and PAGEDMHA_DECODE_SM90_KW).
#ifndef PAGEDMHA_DECODE_SM90_ORDER
#define PAGEDMHA_DECODE_SM90_ORDER 1
#endif
#ifndef PAGEDMHA_DECODE_SM90_FP8_CTAS
#define PAGEDMHA_DECODE_SM90_FP8_CTAS 2
#endif
#ifndef PAGEDMHA_DECODE_SM90_FP8_KW
#define PAGEDMHA_DECODE_SM90_FP8_KW 0
#endif
// PAGEDMHA_DECODE_SM90_SWAP=0 runs calls of up to 8 rows (G q_len <= 8) on the 16-row
// tiles too, instead of the operand-swapped 8-row tiles (kRows below).
#ifndef PAGEDMHA_DECODE_SM90_SWAP
#define PAGEDMHA_DECODE_SM90_SWAP 1
#endif
// PAGEDMHA_DECODE_SM90_Q_PREFETCH=0: each item's Q loaded at its start (not an item
// ahead).
#ifndef PAGEDMHA_DECODE_SM90_Q_PREFETCH
#define PAGEDMHA_DECODE_SM90_Q_PREFETCH 1
#endif
// Experiment knobs of the 8-row kernels: CTAs per SM and keys per warp tile (0: the
// defaults below), applied to each 8-row kernel where two stages of that shape fit (so a
// variant changes only some kernels: compare the shapes it is for). Not here: eight
// consumer warps (fp8 D = 64: half the gain of 64-key tiles, -6% at 1 x 32k), two
// accumulator chains for Q K^T where a warp tile has one m16 key block (16-bit D = 128:
// within 0.7%; both H200 s18run2).
#ifndef PAGEDMHA_DECODE_SM90_CTAS8
#define PAGEDMHA_DECODE_SM90_CTAS8 0
#endif
#ifndef PAGEDMHA_DECODE_SM90_KW8
#define PAGEDMHA_DECODE_SM90_KW8 0
#endif
// PAGEDMHA_DECODE_SM90_ROWS32=0 leaves calls of 17-32 rows at D = 64 (gpt-oss verify at
// q_len 3 or 4) to the portable decode; PAGEDMHA_DECODE_SM90_KW32=k: keys per warp tile
// of those 32-row kernels (0: the default below).
#ifndef PAGEDMHA_DECODE_SM90_ROWS32
#define PAGEDMHA_DECODE_SM90_ROWS32 1
#endif
#ifndef PAGEDMHA_DECODE_SM90_KW32
#define PAGEDMHA_DECODE_SM90_KW32 0
#endif
// PAGEDMHA_DECODE_SM90_PAIRS=0 gives fp8 D = 64 caches one KV head per work item
// (DecodePolicy kItemHeads below) where the heads of a token are adjacent.
#ifndef PAGEDMHA_DECODE_SM90_PAIRS
#define PAGEDMHA_DECODE_SM90_PAIRS 1
#endif
// PAGEDMHA_DECODE_SM90_PAIRS16=1: two KV heads per item for 16-bit D = 64 caches too
// (experiment: fewer, larger items; no line is shared there).
#ifndef PAGEDMHA_DECODE_SM90_PAIRS16
#define PAGEDMHA_DECODE_SM90_PAIRS16 0
#endif

namespace pagedmha::cuda::sm90 {

/// Row stride (floats) of the epilogue buffers of a `rows`-row tile: D + 8 spreads the
/// 16-row tile's float2 stores of rows g and g + 8 over the banks; the 8-row tile stores
/// rows 2t and 2t + 1, which D + 4 spreads.
constexpr int decode_sm90_o_stride(int D, int rows) { return rows == 8 ? D + 4 : D + 8; }

/// Most ring stages: each has a full and an empty mbarrier (8 bytes each).
constexpr int kDecodeSm90MaxStages = 8;

/// Ring stages that fit a CTA's share of the SM's shared memory (228 KB per SM, 1 KB of it
/// reserved per CTA) after the alignment slack, the two epilogue buffers, the statistics
/// and the barriers (DecodePolicy's layout, DecodeSmem in kernel.cuh).
/// `rows`: the item's rows (row_tile per KV head, times its KV heads); `row_bytes`: the
/// item's K or V bytes of one key.
constexpr int decode_sm90_stages_fit(int D, int row_bytes, int rows, int row_tile, int ctas, int warps, int kw) {
  const int smem_per_cta = ctas == 1 ? 227 * 1024 : 228 * 1024 / ctas - 1024;
  const int epilogue = 2 * rows * decode_sm90_o_stride(D, row_tile) * 4, stats = (2 * warps * rows + rows) * 4;
  return (smem_per_cta - 1024 - epilogue - stats - 2 * kDecodeSm90MaxStages * 8) / (2 * warps * kw * row_bytes);
}

/// kCtasPerSm CTAs per SM; the kWarps consumer warps of a CTA share each work item
/// (request, KV head, split), warp w taking keys [w KW, w KW + KW) of every stage of the
/// item. A producer warp fills the CTA's ring (TMA boxes per page, a full and an empty
/// mbarrier per stage) across item boundaries without draining: the loads of the next
/// item run during this item's last tiles and epilogue (the portable decode refills and
/// drains its pipeline per item: docs/perf-notes/decode.md, "What is in the way").
template <int D, bool kFp8Kv = false, int kRowTile = 16, int kHeadsPerItem = 1>
struct DecodePolicy {
  static constexpr int kHeadDim = D;
  // fp8 e4m3 caches: the raw bytes go through the ring (half the bytes of a 16-bit stage)
  // in the swizzle the portable fp8 fragments read (common/fp8_fragments.cuh: K converted
  // in registers for Q K^T in T, V for P V in fp16), Q loaded in that dim order.
  static constexpr bool kFp8 = kFp8Kv;
  // KV heads of a work item. Two for fp8 at D = 64 where a token's heads are adjacent
  // (NHD): a head's 64-byte row is half a 128-byte line, and items of one head each read
  // the lines' halves at different times. ncu at gpt-oss fp8 128 x 32k counted 1.47x the
  // cache's bytes from DRAM (H100 s32run4; 1.7x on the H200 with heads walked one by one,
  // s17run4). An item of two adjacent heads loads whole 128-byte rows (one TMA box of
  // both heads), and each head keeps its own 8-row tile over its half of the row
  // (row_tile.cuh RowTileN): no padding, the same mma and conversions per byte.
  static constexpr int kItemHeads = kHeadsPerItem;
  static constexpr int kRowBytes = kItemHeads * D * (kFp8 ? 1 : 2);  // one key of K or V in the ring
  // fp8: S = Q K^T in fp16 whatever the query dtype, as the Hopper prefill
  // (prefill_sm90/policy.h kMmaF16): each K pair converts with one F2FP where bf16 takes
  // ~4 integer / HMUL2 instructions per value; a bf16 query is rounded to fp16 once per
  // item (saturating past 65504: docs/semantics.md section 2).
  static constexpr bool kQkF16 = kFp8 && PAGEDMHA_DECODE_SM90_FP8_QK_F16 != 0;
  // Item order within a request: split by split, the KV heads of a split next to each
  // other, so that CTAs running at the same time read neighbouring rows. With fp8 at
  // D = 64 a head's row is half a 128-byte line shared with the next head: walked head by
  // head, the two halves were read from DRAM at different times and the kernel read 1.7x
  // the cache's bytes (ncu, H200 s17run4: gpt-oss fp8 128 x 32k 2105 -> 1447 us); other
  // shapes within -0.7% to +3% (s17run5).
  static constexpr bool kHeadsFastest = PAGEDMHA_DECODE_SM90_ORDER == 1;
  // The consumers of the 8-row kernels load the next item's Q (D / 8 registers) while
  // this item runs: an item's start no longer waits for its global loads. (The 16-row
  // kernels at D = 128 would spill.)
  static constexpr bool kQPrefetch = PAGEDMHA_DECODE_SM90_Q_PREFETCH != 0 && kRowTile == 8;
  // The defaults (reasons below), then the 8-row kernels' experiment knobs where two
  // stages of their shape fit.
  static constexpr int kCtas0 = kFp8 && D == 64 ? PAGEDMHA_DECODE_SM90_FP8_CTAS : PAGEDMHA_DECODE_SM90_CTAS;
  static constexpr int kKwKnob = kFp8 && D == 64 ? PAGEDMHA_DECODE_SM90_FP8_KW : PAGEDMHA_DECODE_SM90_KW;
  static constexpr int kKw0 = kKwKnob > 0 ? kKwKnob
                              : kFp8 && kRowBytes == 64 && kRowTile == 8 && PAGEDMHA_DECODE_SM90_WARPS <= 4 ? 64
                              : kRowBytes > 128 && (PAGEDMHA_DECODE_SM90_WARPS > 4 || kCtas0 > 1)            ? 16
                                                                                                              : 32;
  static constexpr int kCtas8 = PAGEDMHA_DECODE_SM90_CTAS8 > 0 ? PAGEDMHA_DECODE_SM90_CTAS8 : kCtas0;
  static constexpr int kKw8 = PAGEDMHA_DECODE_SM90_KW8 > 0 ? PAGEDMHA_DECODE_SM90_KW8 : kKw0;
  // 32 rows (two m16 tiles: twice the S, O and Q registers of 16): 16 keys per warp tile
  // for 16-bit rows (five 16 KB stages instead of two 32 KB ones), 32 for fp8 (five 16 KB
  // stages). gpt-oss 64 x 4k q_len 4 against the portable decode: bf16 -7% time (32
  // keys: -3%), fp8 -35% (16 keys: -30%; H100 s32run2). fp8 with 32 keys exceeds two CTAs'
  // 168 registers by a few (ptxas: 148 bytes spilled, 6 local accesses per tile, L1 hits);
  // 16 keys fit without spills and are 7% slower.
  static constexpr int kKw32 = PAGEDMHA_DECODE_SM90_KW32 > 0 ? PAGEDMHA_DECODE_SM90_KW32 : kFp8 ? 32 : 16;
  static constexpr bool kKnobs8 =
      kRowTile == 8 &&
      decode_sm90_stages_fit(D, kRowBytes, 8 * kItemHeads, 8, kCtas8, PAGEDMHA_DECODE_SM90_WARPS, kKw8) >= 2;
  // Four consumer warps per CTA, with two CTAs: two warps per SMSP, as eight warps in one
  // CTA had (with one warp per SMSP every dependent step of a tile, ldmatrix -> mma chains,
  // the softmax's shuffles and ex2, is exposed; H200 sixth session runs 2 and 3).
  static constexpr int kWarps = PAGEDMHA_DECODE_SM90_WARPS;
  // One CTA-wide ring: a producer warp loads stages of kWarps x KW keys, one full barrier
  // and one empty barrier (kWarps arrivals) per stage, the boxes of a stage issued by its
  // lanes in parallel, page ids a stage ahead. A producer warp issuing every warp's 16-key
  // tiles one at a time lost 20-35% (3524b1d); the ring beat per-warp streams (each warp
  // loading its own tiles, the sixth session's form, removed in the thirteenth)
  // everywhere, +3 to +39% (H200 s11run1).
  // CTAs per SM: two (2 x 160 threads fit the consumers' ~170 registers). One CTA's item
  // boundaries (Q load, the epilogue's CTA barriers) overlap the other's loads, as the
  // portable decode's three CTAs per SM do: one CTA of eight warps lost 6-28% to the
  // portable decode on small items (windows, the TP-8 rank: s11run1), two of four gain
  // 3-10% there (s13run1). Three CTAs of two warps: windows +3 to +11%, 64 x 4k -3 to
  // -5% (s13run3).
  static constexpr int kCtasPerSm = kKnobs8 ? kCtas8 : kCtas0;
  static constexpr int kConsumerThreads = 32 * kWarps;
  static constexpr int kThreads = kConsumerThreads + 32;  // and the producer warp
  // The G * q_len query rows of a KV head in one mma.sync m16n8k16 tile (row_tile.cuh):
  // decode rows are few (G = 4..8), so wgmma's 64-row minimum would waste 3/4 or more of
  // it. 16 rows as the mma's M (S = Q K^T), or up to 8 as its N (S^T = K Q^T: the keys
  // fill M, and at G = 8 nothing is padding where the 16-row tile is half padding); 32
  // rows (G = 8 at q_len 4: gpt-oss verify) as two m16 tiles that share every K and V
  // fragment read, at D = 64 only (D = 128's O would take 128 registers).
  // With two KV heads per item each has its own 8-row tile: kRows counts the item's rows
  // (the epilogue's), kRowTile one head's.
  static constexpr int kTileRows = kRowTile;
  static constexpr int kRows = kRowTile * kItemHeads;
  // Keys per warp tile: 32 (16-row S in 16 registers: half the per-tile costs of 16 keys, the
  // barrier wait, row maxima and rescale test); 16 for 256-byte rows (16-bit D = 128)
  // with eight warps or two CTAs per SM, where 32 would leave room for one 64 KB stage
  // only. fp8 D = 128 rows are 128 bytes: 32 keys in the stages 16-bit rows take 16.
  // fp8 D = 64 with the 8-row tile: 64 (32 KB stages, three; 8-row S in 16 registers):
  // gpt-oss fp8 -10 to -13% at 64 x 4k and 128 x 32k, -3% at 1 x 32k against 32 keys
  // (H200 s18run2). Two heads per item (128-byte rows): 32, in the same 32 KB stages.
  static constexpr int KW = kRowTile == 32 ? kKw32 : kKnobs8 ? kKw8 : kKw0;
  // TMA boxes of a row: 64-column panels of 128 bytes (16-bit), or the whole fp8 row
  // (128-byte swizzle at D = 128, 64-byte swizzle at D = 64: paged_kv.cuh kv_tensor_maps).
  static constexpr int kPanels = kFp8 ? 1 : kRowBytes / 128;
  static constexpr int kBoxRowBytes = kRowBytes / kPanels;
  static constexpr int kChunks = kRowBytes / 16;  // 16-byte chunks of a row
  // Keys of a stage (decode_split's tile, a.split_tile): every consumer warp's tile.
  static constexpr int kTileKeys = kWarps * KW;
  static constexpr int kTileBytes = kTileKeys * kRowBytes;  // K or V of one stage
  static constexpr int kStageBytes = 2 * kTileBytes;
  // Not here: the ring's producer copying each item's Q into shared slots (twelfth
  // session): -6% at 1 x 32k, +1-3% elsewhere with two CTAs per SM (s13run2).
  // Epilogue: two fp32 [kRows][kOStride] buffers (warps 0 and 1 write, then each further
  // pair adds, 2 and 3 first: a fixed order, so results do not depend on timing), then
  // (m, l) per warp and row and the row scales. One buffer added to in W passes (room for
  // a third stage at D = 128) was 0.8% faster at 128 x 32k and 2-14% slower on small items
  // (two more CTA barriers per item: s13run3).
  // A buffer per warp (two CTA barriers per item instead of W / 2 + 1, for 17 KB more at
  // D = 128): -5% to +2%, windows and the TP-8 rank slower (s14run1).
  static constexpr int kEpiBuffers = 2;
  static constexpr int kOStride = decode_sm90_o_stride(D, kRowTile);
  static constexpr int kEpiBytes = kEpiBuffers * kRows * kOStride * 4;
  static constexpr int kStatBytes = (2 * kWarps * kRows + kRows) * 4;
  static constexpr int kMaxStages = kDecodeSm90MaxStages;
  static constexpr int kBarrierBytes = 2 * kMaxStages * 8;  // full, then empty
  // Stages: as many as the CTA's share of the SM's shared memory holds. With two CTAs:
  // 16 rows 2 at D = 128 (16-bit and fp8), 3 at 16-bit D = 64, 6 at fp8 D = 64; 8 rows
  // (smaller epilogue buffers) 3 for each.
  static constexpr int kSmemPerCta = kCtasPerSm == 1 ? 227 * 1024 : 228 * 1024 / kCtasPerSm - 1024;
  static constexpr int kStagesFit = decode_sm90_stages_fit(D, kRowBytes, kRows, kRowTile, kCtasPerSm, kWarps, KW);
  static constexpr int kStages = PAGEDMHA_DECODE_SM90_STAGES > 0 ? PAGEDMHA_DECODE_SM90_STAGES
                                 : kStagesFit < kMaxStages      ? kStagesFit
                                                                : kMaxStages;
  static constexpr int kSmemBytes =
      1024 /* alignment */ + kStages * kStageBytes + kEpiBytes + kStatBytes + kBarrierBytes;

  static_assert(D == 64 || D == 128, "head dims of the Hopper decode (D = 256 stays portable)");
  static_assert(kRowTile == 8 || kRowTile == 16 || (kRowTile == 32 && D == 64), "row tiles (row_tile.cuh)");
  static_assert(kItemHeads == 1 || (kItemHeads == 2 && D == 64 && kRowTile == 8),
                "two KV heads per item: D = 64 on 8-row tiles (one box row of both)");
  static_assert(KW % 16 == 0 && KW <= 64, "whole k16 steps of P V");
  static_assert(kWarps % 2 == 0 && kWarps <= 8, "warp pairs in the epilogue");
  static_assert(kStages >= 2 && kStages <= kMaxStages, "stages");
  // The ring's producer: one lane per (box, panel) of a stage, boxes of at least 8 keys
  // (paged_kv.cuh kv_tma_ok).
  static_assert(kTileKeys / 8 * kPanels <= 32, "one lane per box of a stage");
  static_assert(kSmemBytes <= kSmemPerCta, "shared memory");
  // ptxas fits the registers to the warps an SMSP holds (16384 each): 168 with two CTAs
  // of five warps (the consumers take 121-168), 128 with three (s18run2's three CTAs: no
  // spills before the 8-row Q prefetch, which takes D = 128 to 159).
  static_assert(kCtasPerSm == 1 || kThreads * kCtasPerSm <= 480, "registers for the consumers");
};

/// The switch: batch_decode (decode.cu) tries this kernel only when it is on, and for fp8
/// caches only when kDecodeSm90Fp8 is on too.
constexpr bool kDecodeSm90 = PAGEDMHA_DECODE_SM90 != 0;
constexpr bool kDecodeSm90Fp8 = PAGEDMHA_DECODE_SM90_FP8 != 0;

/// The row tile of a call (DecodePolicy's kRowTile): 8 for up to 8 rows, 16 for up to
/// 16, else 32.
inline int decode_sm90_row_tile(int group, int q_len_per_req) {
  const int rows = group * q_len_per_req;
  return PAGEDMHA_DECODE_SM90_SWAP != 0 && rows <= 8 ? 8 : rows <= 16 ? 16 : 32;
}

/// Whether a call of up to 8 rows per KV head may take items of two KV heads (DecodePolicy
/// kItemHeads; the cache's layout is kv_tensor_maps' test): fp8 at D = 64, an even count.
inline bool decode_sm90_pairs_ok(int head_dim, bool kv_fp8, int num_kv_heads) {
  return PAGEDMHA_DECODE_SM90_PAIRS != 0 && (kv_fp8 || PAGEDMHA_DECODE_SM90_PAIRS16 != 0) && head_dim == 64 &&
         num_kv_heads % 2 == 0;
}
constexpr bool kDecodeSm90Pairs16 = PAGEDMHA_DECODE_SM90_PAIRS16 != 0;

/// Whether a decode call fits here: G * q_len_per_req rows in one row tile (<= 16, or
/// <= 32 at D = 64), 16-bit queries (fp8 queries stay on the portable kernel). The K / V
/// layout test (TMA boxes per page) is paged_kv.cuh's kv_tma_ok.
inline bool decode_sm90_rows_ok(int head_dim, int group, int q_len_per_req, bool q_fp8) {
  const int rows = group * q_len_per_req;
  return !q_fp8 && (rows <= 16 || (PAGEDMHA_DECODE_SM90_ROWS32 != 0 && head_dim == 64 && rows <= 32));
}

}  // namespace pagedmha::cuda::sm90
