// Every tile size, stage count and heuristic of the Hopper prefill kernel, with its
// reason. Plain C++ (host and device): the launcher, the workspace bound and the kernel
// read the same numbers.
#pragma once

#include <algorithm>
#include <cstdint>

#include "pagedmha/variant.h"  // PAGEDMHA_HD

// Experiment knobs for bench/prefill_sm90_variants.cu (the library builds the defaults):
// PAGEDMHA_SM90_PINGPONG=1 makes the warpgroups take turns issuing, PAGEDMHA_SM90_STAGES=k
// forces k K / V stages, PAGEDMHA_SM90_DIAG=1 leaves the softmax out (P = S), =2 the
// consumers' GEMMs (softmax, waits and releases remain) and =3 both (the consumers only
// wait and release: the rate at which the producer delivers K / V), PAGEDMHA_SM90_FTZ=0
// the plain ex2, PAGEDMHA_SM90_FORCE_GATHER=1 the cp.async gather where TMA could load
// K / V, PAGEDMHA_SM90_WG3=0 two consumer warpgroups at D = 64 and
// PAGEDMHA_SM90_WG3_PRODUCER_REGS=r the producer's registers with three,
// PAGEDMHA_SM90_FP8_UNROLL=u the fp8 conversion loop's unroll, PAGEDMHA_SM90_FP8_BLOCK_N
// and PAGEDMHA_SM90_FP8_RAW_SLOTS the fp8 tile's keys (D <= 128) and staging slots,
// PAGEDMHA_SM90_Q_SLOTS=k forces k query-tile buffers (where two K and two V stages
// remain), PAGEDMHA_SM90_K_STAGES / _V_STAGES the K and V ring depths (within what shared
// memory holds), PAGEDMHA_SM90_FP8_MMA_F16=0 runs fp8 KV's GEMMs in the query dtype,
// PAGEDMHA_SM90_PRODUCER_REGS=r the producer's registers with two consumer warpgroups and
// 16-bit TMA loads (the consumers get the rest, at most 240), PAGEDMHA_SM90_FP8_PRODUCERS=1
// one producer warpgroup converting both K and V of an fp8 cache (default 2) and
// PAGEDMHA_SM90_FP8_PRODUCER_REGS=r their registers with two, PAGEDMHA_SM90_FP8_IN_PLACE=0
// the staging slots instead of converting in place (D = 128, two producer warpgroups),
// PAGEDMHA_SM90_FP8_DIAG=1 leaves the fp8 conversion out (a stage counts as full once its
// raw tile has landed) and =2 its stores (loads and conversions remain): diagnostics of
// what the conversion costs the consumers, wrong results. PAGEDMHA_SM90_SPEC_SOFTMAX=1
// exponentiates against the current reference while the row maxima are found
// (consumer.cuh softmax) wherever two consumer warpgroups run, =3 with three too, =0
// nowhere (the default: fp8 KV at D = 64 and 16-bit KV at D = 128), =2 recomputes S for
// every tile instead (its rare path, slow). PAGEDMHA_SM90_D256_SHORT_Q=n: launches at
// D = 256 with 16-bit KV by TMA and max_q_len <= n take 64-key tiles, the others 80
// (kD256ShortQ; 0: always 80). PAGEDMHA_SM90_PLAN_PAIR_ROUNDS=n: single tiles for grids
// of fewer than n rounds of pairs, and a serpentine walk (kPlanPairRounds, default 3; 0:
// always pairs, round-robin). PAGEDMHA_SM90_FP8_WG3: fp8 KV at D = 64 in 192-row tiles
// on three consumer warpgroups (BlockM 192, kFp8Wg3) where the launch's rounds say so
// (fp8_rows192_pays; 1, the default), never (0) or always (2).
// PAGEDMHA_SM90_FP8_D256_TEAMS: fp8 KV at D = 256 by TMA with the producer warpgroup in
// two teams, Q and K, and V (kFp8Teams; 1, the default), or as one (0).
// PAGEDMHA_SM90_PRED_RELEASE=0:
// the consumers release stages in a branch around the arrives (kPredRelease; default 1,
// predicated arrives).
#ifndef PAGEDMHA_SM90_PINGPONG
#define PAGEDMHA_SM90_PINGPONG 0
#endif
#ifndef PAGEDMHA_SM90_STAGES
#define PAGEDMHA_SM90_STAGES 0
#endif
#ifndef PAGEDMHA_SM90_DIAG
#define PAGEDMHA_SM90_DIAG 0
#endif
#ifndef PAGEDMHA_SM90_FORCE_GATHER
#define PAGEDMHA_SM90_FORCE_GATHER 0
#endif
#ifndef PAGEDMHA_SM90_FTZ
#define PAGEDMHA_SM90_FTZ 1
#endif
#ifndef PAGEDMHA_SM90_WG3
#define PAGEDMHA_SM90_WG3 1
#endif
#ifndef PAGEDMHA_SM90_FP8_WG3
#define PAGEDMHA_SM90_FP8_WG3 1
#endif
#ifndef PAGEDMHA_SM90_FP8_D256_TEAMS
#define PAGEDMHA_SM90_FP8_D256_TEAMS 1
#endif
#ifndef PAGEDMHA_SM90_PRED_RELEASE
#define PAGEDMHA_SM90_PRED_RELEASE 1
#endif
#ifndef PAGEDMHA_SM90_FP8_UNROLL
#define PAGEDMHA_SM90_FP8_UNROLL 0
#endif
#ifndef PAGEDMHA_SM90_FP8_BLOCK_N
#define PAGEDMHA_SM90_FP8_BLOCK_N 128
#endif
#ifndef PAGEDMHA_SM90_FP8_RAW_SLOTS
#define PAGEDMHA_SM90_FP8_RAW_SLOTS 4
#endif
#ifndef PAGEDMHA_SM90_WG3_PRODUCER_REGS
#define PAGEDMHA_SM90_WG3_PRODUCER_REGS 32
#endif
#ifndef PAGEDMHA_SM90_FP8_MMA_F16
#define PAGEDMHA_SM90_FP8_MMA_F16 1
#endif
#ifndef PAGEDMHA_SM90_PRODUCER_REGS
#define PAGEDMHA_SM90_PRODUCER_REGS 72
#endif
#ifndef PAGEDMHA_SM90_FP8_PRODUCERS
#define PAGEDMHA_SM90_FP8_PRODUCERS 2
#endif
#ifndef PAGEDMHA_SM90_FP8_PRODUCER_REGS
#define PAGEDMHA_SM90_FP8_PRODUCER_REGS 56
#endif
#ifndef PAGEDMHA_SM90_FP8_IN_PLACE
#define PAGEDMHA_SM90_FP8_IN_PLACE 1
#endif
#ifndef PAGEDMHA_SM90_FP8_DIAG
#define PAGEDMHA_SM90_FP8_DIAG 0
#endif
#ifndef PAGEDMHA_SM90_Q_SLOTS
#define PAGEDMHA_SM90_Q_SLOTS 0
#endif
#ifndef PAGEDMHA_SM90_K_STAGES
#define PAGEDMHA_SM90_K_STAGES 0
#endif
#ifndef PAGEDMHA_SM90_V_STAGES
#define PAGEDMHA_SM90_V_STAGES 0
#endif
#ifndef PAGEDMHA_SM90_SPEC_SOFTMAX
#define PAGEDMHA_SM90_SPEC_SOFTMAX -1
#endif
#ifndef PAGEDMHA_SM90_D256_SHORT_Q
#define PAGEDMHA_SM90_D256_SHORT_Q 1024
#endif

namespace pagedmha::cuda::sm90 {

/// Compile-time shape of one instantiation: head dim D, fp8 or 16-bit cache, whether
/// K / V come by TMA (else the producer's cp.async gather), the keys per KV tile
/// (0: kBlockN's default; 64 only for D = 256's 16-bit TMA path, kD256ShortQ) and the
/// query rows per tile (0: kBlockM's default; 192 only for fp8 KV at D = 64 by TMA,
/// kFp8Wg3).
template <int D, bool Fp8Kv, bool KvTma, int BlockN = 0, int BlockM = 0>
struct PrefillPolicy {
  static_assert(BlockN == 0 || (BlockN == 64 && D == 256 && KvTma && !Fp8Kv), "the one key-tile alternative");
  static_assert(BlockM == 0 || (BlockM == 192 && D == 64 && KvTma && Fp8Kv), "the one query-tile alternative");
  static constexpr int kHeadDim = D;
  static constexpr bool kFp8Kv = Fp8Kv;
  // fp8 KV: the GEMMs run in fp16 whatever the query dtype. e4m3 converts to fp16 in one
  // F2FP per pair (cvt.rn.f16x2.e4m3x2), where bf16 has no such instruction and took ~4
  // integer / HMUL2 instructions per value in the producer, the fp8 path's limit
  // (docs/perf-notes/prefill-sm90.md). K, V and P are exact or more precise in fp16; a
  // bf16 query is converted once per query tile (exact for |q| in fp16's normal range,
  // saturating beyond 65504: docs/semantics.md).
  static constexpr bool kMmaF16 = Fp8Kv && PAGEDMHA_SM90_FP8_MMA_F16 != 0;
  static constexpr bool kKvTma = KvTma;
  // BlockM 192 (fp8_rows192_pays): fp8 KV at D = 64 by TMA with three consumer
  // warpgroups, the producer warpgroup split into two halves of two warps, one loading Q
  // and converting the K tiles, the other the V tiles, each through its own staging
  // slots and named barrier, as the two producer warpgroups do at D = 128 (which gained
  // 22-30% over one warpgroup walking K and V in turn). Three consumer warpgroups fed by
  // one warpgroup walking both were no faster than two, with or without the conversion
  // (H200 s10run2-3: a V stage's release held up the K conversions behind it;
  // docs/perf-notes/prefill-sm90-fp8.md sections 8, 9, 12 and 13). Registers as bf16's
  // three warpgroups: 32 / 160 (the consumers' 128-key tiles need 160, at 152 ptxas
  // serializes their wgmmas; the converting producer fits 32 with its teams' loops in
  // uniform control flow, producer.cuh run()). +8-20% over two warpgroups where the
  // launch's rounds pay (H100 s30run2).
  static constexpr bool kFp8Wg3 = BlockM == 192;
  // Consumer warpgroups of 64 query rows each (wgmma's M): two (128 rows), three at
  // D = 64 (192 rows, FA3's shape there): a D = 64 tile's GEMMs take about as long as its
  // 128 x 128 exponentials on the MUFU unit, so a third warpgroup's softmax fills the
  // tensor cores' idle time (docs/perf-notes/prefill-sm90.md). Only with TMA loads: the gather
  // producer does not fit the 32 registers three consumer warpgroups leave it.
  // Not with fp8 KV either (but kFp8Wg3): its conversion does not fit those 32 registers.
  static constexpr int kConsumerWarpgroups = (D == 64 && KvTma && !Fp8Kv && PAGEDMHA_SM90_WG3) || kFp8Wg3 ? 3 : 2;
  static constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;  // arrivals on an empty barrier
  static constexpr int kBlockM = 64 * kConsumerWarpgroups;
  // Producer warpgroups: one; two for fp8 caches, one converting K and one V, each with
  // its own staging slots. One warpgroup converting both was fp8's limit (its serial
  // wait-convert-arrive chain per tile against two tiles per KV step:
  // docs/perf-notes/prefill-sm90.md): +22-30% at llama3-8b and gpt-oss, 1 x 16k and 4 x 4k
  // (H200, 2026-12-02 eighth session, run 2). Only with TMA loads (the gather's row
  // addresses do not fit the 56 registers two producer warpgroups leave each thread), and
  // not at D = 256, whose two staging slots would leave each warpgroup one (no load in
  // flight while it converts).
  static constexpr int kProducerWarpgroups =
      Fp8Kv && KvTma && D <= 128 && PAGEDMHA_SM90_FP8_PRODUCERS == 2 && !kFp8Wg3 ? 2 : 1;
  static constexpr int kThreads = 128 * (kProducerWarpgroups + kConsumerWarpgroups);
  // fp8 KV at D = 256 by TMA: its one producer warpgroup in two teams of two warps, Q and
  // the K tiles, and the V tiles, each with one of the two staging slots, as kFp8Wg3 at
  // D = 64. One warpgroup walking both keeps one tile in flight while it converts the
  // other; two teams convert side by side: gemma fp8 +10% at 4 x 4k, +15% at 1 x 16k,
  // +1.5% at 16 x 1k, bitwise the same (H100 s31run1; docs/perf-notes/prefill-sm90-fp8.md
  // section 14). Two producer warpgroups do not fit D = 256's consumers' registers
  // (section 11); two teams keep its 72 / 216 split.
  static constexpr bool kFp8Teams =
      kFp8Wg3 || (Fp8Kv && D == 256 && KvTma && PAGEDMHA_SM90_FP8_D256_TEAMS != 0);
  // Producer teams (producer.cuh Role): one, or two (Q and K, and V) of kRoleThreads
  // threads each: the two fp8 producer warpgroups, or kFp8Teams' two halves of one.
  static constexpr int kProducerRoles = kProducerWarpgroups == 2 || kFp8Teams ? 2 : 1;
  static constexpr int kRoleThreads = 128 * kProducerWarpgroups / kProducerRoles;
  // Keys per tile: 128 (S = 64 x 128 per warpgroup: 64 registers) up to D = 128. At
  // D = 256, whose O accumulator alone is 128 registers per thread, 80 for 16-bit KV by
  // TMA (FA3's tile there; two K and two V stages of 40 KB; boxes of 16 rows, kv_boxes.h
  // kv_box_rows): +5-7% at gemma 1x16k and 4x4k over 64 keys, but -6-13% at 16x1k, whose
  // causal items end mid-tile, so short launches take 64 (kD256ShortQ). The gather and
  // the fp8 conversion keep 64.
  static constexpr int kBlockN = BlockN > 0 ? BlockN
                                 : D == 256 ? (KvTma && !Fp8Kv ? 80 : 64)
                                            : (Fp8Kv ? PAGEDMHA_SM90_FP8_BLOCK_N : 128);
  // fp8 caches at D = 128 with two producer warpgroups: the raw tile (BN x 128 bytes)
  // lands by TMA in the upper half of its own 16-bit stage, where raw row r is exactly
  // the bytes of the stage's second panel's row r, and is converted in place (each warp
  // reads a row's 128 bytes before it writes them). The 64 KB of staging slots go to the
  // rings: a second query-tile buffer and a third V stage, the bf16 kernel's layout. As
  // fast as the staging slots (H200, 2026-12-03 s9run1: docs/perf-notes/prefill-sm90-fp8.md)
  // with one pipeline fewer per warpgroup. Elsewhere the staging slots below.
  static constexpr bool kFp8InPlace = Fp8Kv && kProducerWarpgroups == 2 && D == 128 && PAGEDMHA_SM90_FP8_IN_PLACE != 0;
  // fp8 caches land raw (BN x D bytes) in staging slots the producer warpgroup(s) convert
  // from into the 16-bit stages: 4 (3 tiles in flight while one converts: a tile's load
  // latency is ~3 conversions; two each with two producer warpgroups) where shared memory
  // allows, 2 at D = 256 (one each); none when converting in place.
  static constexpr int kRawSlots = !Fp8Kv || kFp8InPlace ? 0 : (D == 256 ? 2 : PAGEDMHA_SM90_FP8_RAW_SLOTS);
  static_assert(kRawSlots == 0 || kRawSlots % kProducerRoles == 0 && kRawSlots >= kProducerRoles,
                "staging slots of their own for each producer team");
  // 16-byte raw chunks each producer thread loads before converting them (loads in flight
  // per thread): 4 (+2% over 2 at llama3-8b 1 x 16k, H200 run 13), 2 at D = 256, where 4
  // spills in the producer's 72 registers.
  // Two producer warpgroups (or teams): 1 (more spills in their 56 registers; the other
  // team's conversion fills the latency).
  static constexpr int kFp8ConvertUnroll =
      PAGEDMHA_SM90_FP8_UNROLL > 0 ? PAGEDMHA_SM90_FP8_UNROLL : (kProducerRoles == 2 ? 1 : D == 256 ? 2 : 4);
  // setmaxnreg: 384 threads start with 168 registers (64K / 384, rounded down to 8);
  // the producer warpgroup gives some up and the consumers take them: 128 x 72 +
  // 256 x 216 = 64,512. The consumers need ~185 (D <= 128) to ~200 (D = 256, O alone is
  // 128); the producer's TMA paths ~60 (fp8: the staging and the conversion). Three
  // consumer warpgroups (512 threads, 128 each): 128 x 32 + 384 x 160 = 65,536 (FA3's
  // split); at D = 64 S, P and O take 128 of the 160, and the producer's TMA path fits
  // in 22 (ptxas allocates each setmaxnreg region within its count: no spills in either).
  // Two producer warpgroups (fp8, 512 threads of 128): 256 x 56 + 256 x 200 = 65,536.
  static constexpr int kProducerRegs = kConsumerWarpgroups == 3 ? PAGEDMHA_SM90_WG3_PRODUCER_REGS
                                       : kProducerWarpgroups == 2 ? PAGEDMHA_SM90_FP8_PRODUCER_REGS
                                       : kBlockN == 80 ? 56  // S of 80 keys: the consumers spill at 216
                                       : (KvTma && !Fp8Kv ? PAGEDMHA_SM90_PRODUCER_REGS : 72);
  // The pool setmaxnreg moves registers within is what the launch gave the CTA: kThreads
  // x (64K / kThreads rounded down to 8). Asking the consumers for more than the producer
  // freed never returns (an H200 run hung on 32 / 240 with two consumer warpgroups).
  static constexpr int kRegPool = kThreads * (65536 / kThreads / 8 * 8);
  static constexpr int kProducerThreads = 128 * kProducerWarpgroups;
  static constexpr int kConsumerRegs = (kRegPool - kProducerThreads * kProducerRegs) / (128 * kConsumerWarpgroups) / 8 * 8;
  static_assert(kConsumerRegs <= 256 &&
                    kProducerThreads * kProducerRegs + 128 * kConsumerWarpgroups * kConsumerRegs <= kRegPool,
                "setmaxnreg within the CTA's registers");
  // Within a warpgroup, QK of tile j + 1 is issued before the softmax of tile j. Making
  // the warpgroups also take turns issuing (FA3's ping-pong, named barriers) costs 2-6%
  // here: without it every shape of bench/prefill_variants.sh was faster in two runs on
  // the H200 (2026-12-02 runs 6 and 7, docs/perf-notes/prefill-sm90.md), so it is off by default and
  // kept as an experiment.
  static constexpr bool kPingPong = PAGEDMHA_SM90_PINGPONG != 0;
  // The softmax's ex2 flushes subnormal results (ex2.approx.ftz): one MUFU.EX2 per
  // probability instead of MUFU plus a compare and two multiplies, which roughly halves
  // the softmax's instructions (the wgmma consumers' critical path between their GEMMs;
  // docs/perf-notes/prefill-sm90.md). No split-KV here, so nothing is compared bitwise across key
  // ranges. PAGEDMHA_SM90_FTZ=0 restores the plain ex2 (experiment).
  static constexpr bool kFtzExp2 = PAGEDMHA_SM90_FTZ != 0;
  // The softmax speculates that a tile leaves the row's reference where it is: the
  // exponentials start from it at once and the maxima are found beside them, off their
  // chain; a moved reference costs one exact power-of-two multiply, a jump past 64 (or
  // the 2^20 range) a recomputed S from the cache (consumer.cuh softmax). Where the
  // softmax is the larger part of a step: two consumer warpgroups at D = 64, which is fp8
  // KV there (+3-5% at gpt-oss 1 x 16k, 4 x 4k and the TP-8 rank, H200 s16run4); and
  // 16-bit KV at D = 128: +1-3% at 1 x 16k and -1 to +1% at 4 x 4k and 16 x 1k in the
  // 15th and 16th sessions (section 13), +5% at 1 x 16k, +1% at 4 x 4k and +3% at
  // 16 x 1k in s22run1, where ncu put the gap to FlashAttention-3 dense in the
  // consumers' fixed-latency waits (section 16); with kSoftmaxOneCopy +0.3 to +2% (s23run2,
  // the chain then FA3's length in ncu: section 17). Not at D = 256 (-5% at gemma 4 x 4k,
  // s22run1). Not with three consumer
  // warpgroups (=3 builds it, 158 of their 160 registers): gpt-oss bf16 2-3% slower
  // (s18run4, section 14).
  static constexpr bool kSpecSoftmax =
      (PAGEDMHA_SM90_SPEC_SOFTMAX < 0 ? (Fp8Kv && D == 64) || (!Fp8Kv && D == 128) : PAGEDMHA_SM90_SPEC_SOFTMAX != 0) &&
      PAGEDMHA_SM90_DIAG == 0 && (kConsumerWarpgroups == 2 || PAGEDMHA_SM90_SPEC_SOFTMAX == 3);
  static constexpr bool kSpecRecomputeAlways = PAGEDMHA_SM90_SPEC_SOFTMAX == 2;  // test of the rare path
  // The softmax's rare path for references past 2^20 (online_softmax.cuh step) as an
  // in-place rounding before the one copy of the exponentials, instead of a copy of its
  // own: the KV-step loop's code shrinks from 19 to 16 KB. At D = 128: +2% at llama3-8b
  // 16 x 1k and +0.5% at 1 x 16k (four rounds, H200 s23run3-4); at D = 64 -1.7% at
  // gpt-oss 1 x 16k and -1% at 4 x 4k, more MIO stalls in ncu (s23run2-4); at D = 256
  // no difference out of the noise (s23run2). The same results either way, by
  // construction (GpuPrefill.OverflowingLogitsNeverNaN runs both forms).
  static constexpr bool kSoftmaxOneCopy = D == 128;
  // The consumers' stage releases (lane 0 of each warp arrives on the empty barrier, and
  // on the cluster peer's) as predicated instructions instead of a divergent branch
  // around them (consumer.cuh release). ncu at D = 128 (H200 s23run3) counted two
  // divergent branches per KV step in the consumer loop, both these releases, and 63
  // cycles per step of branch-resolving stalls against FlashAttention-3's 9. Measured
  // +1-3% (bf16) and +1-4% (fp8 KV), bitwise the same results (H100 s30run1,
  // docs/perf-notes/prefill-sm90-loop.md section 25). Not with three consumer warpgroups
  // (their 160 registers then spill 8 bytes), nor at D = 256 (13 spill instructions).
  static constexpr bool kPredRelease = PAGEDMHA_SM90_PRED_RELEASE != 0 && kConsumerWarpgroups == 2 && D <= 128;
  // Not here: an item's tiles in masked / interior / masked loops, the interior without
  // mask code (no gain: H100 s27run1, 2 and 6, docs/perf-notes/prefill-sm90-loop.md
  // section 20; the one loop skips an interior tile's mask at run time); only producer
  // warp 0 polling a stage's empty barrier (no gain, same runs); waiting for V_j after
  // issuing Q K_{j+1}^T instead of before it (-1 to -6% on every shape, s13run1); every r-th S fragment exponentiated by a polynomial on the
  // FMA pipe instead of the MUFU (r = 8 / 4 / 2: up to -6 / -11 / -21%, s14run2); the
  // row sums by wgmma against a block of ones instead of an FADD per probability (-2 to
  // -7%, and lse off by up to 4e-3 from bf16 P, s14run3); the producer issuing V_j
  // before K_{j+1}, so that V no longer waits behind a free K stage (ncu: 17% of the KV
  // steps at D = 128 wait for V): 0 to -1% at llama3-8b (s23run2). The half key tile of
  // consumer.cuh first_step has no knob: +1 to +3% at D = 128 and 64, +2% at gemma 4 x 4k
  // (s13run1; docs/perf-notes/prefill-sm90-schedule.md sections 8 to 11).

  // The epilogue writes o rows in 16-byte stores after a transpose inside each quad
  // (consumer.cuh epilogue), where 4-byte stores left half of every 32-byte sector empty
  // and their count (D / 4 per thread and item) held the consumers at each item's end:
  // +11.5% at gemma 16 x 1k, +4.6% at 4 x 4k, +2.8% at llama3-8b 16 x 1k, +1.1% fp8 4 x 4k,
  // llama3-8b 1 x 16k and 4 x 4k within -1%. Not at D = 64, whose three warpgroups lost
  // 2.6% at gpt-oss 4 x 4k (16 x 1k equal): there the transpose's two shuffle stages sit
  // on the path of the item's last P V, for stores that were few anyway (medians of three
  // rounds, H200 2026-12-03 s12run2: docs/perf-notes/prefill-sm90-schedule.md section 5).
  static constexpr bool kOut16 = D >= 128;
  static constexpr int kQBytes = kBlockM * D * 2;
  static constexpr int kTileBytes = kBlockN * D * 2;  // one K or V stage (16-bit)
  static constexpr int kRawBytes = kBlockN * D;       // one fp8 staging slot
  static constexpr int kBarrierBytes = 256;
  // Shared memory beside the query-tile buffers and the fp8 staging slots holds K and V
  // stages, each its own ring, up to 4 each: the load latency of a tile (page-table read,
  // then TMA from L2 or HBM, then the barrier round trip through both CTAs of a cluster)
  // spans more than one tile's compute, so deeper rings keep the tensor cores fed. V
  // stages are held longer than K stages (a tile's P V is issued with the next tile's QK),
  // so an odd tile goes to V.
  static constexpr int tiles_fit(int q_slots) {
    return (227 * 1024 - 1024 - q_slots * kQBytes - kRawSlots * kRawBytes - kBarrierBytes) / kTileBytes;
  }
  static constexpr int kStagesWanted = PAGEDMHA_SM90_STAGES > 0 ? PAGEDMHA_SM90_STAGES : 4;
  static constexpr int clamp_stages(int want, int most) { return want < most ? want : most; }
  // Query-tile buffers: two where the rest still holds two K and three V stages, so the
  // next item's Q lands while the current one runs (with one buffer the producer cannot
  // load it before the item's last QK, and the consumers wait for it at every item). At
  // D = 128 that trades the third K stage for the buffer: +7% at llama3-8b 16 x 1k, equal
  // at 1 x 16k and 4 x 4k (H200, 2026-12-02 seventh session, run 1:
  // docs/perf-notes/prefill-sm90.md). D = 64 keeps four and four. One buffer at D = 256
  // and with fp8 staging at D = 128.
  static constexpr int kQSlots = PAGEDMHA_SM90_Q_SLOTS > 0 && tiles_fit(PAGEDMHA_SM90_Q_SLOTS) >= 4
                                     ? PAGEDMHA_SM90_Q_SLOTS
                                     : (tiles_fit(2) >= 5 ? 2 : 1);
  static constexpr int kTilesFit = tiles_fit(kQSlots);
  static constexpr int kKStages = clamp_stages(PAGEDMHA_SM90_K_STAGES > 0 ? PAGEDMHA_SM90_K_STAGES : kStagesWanted,
                                               PAGEDMHA_SM90_K_STAGES > 0 ? kTilesFit - 2 : kTilesFit / 2);
  static constexpr int kVStages =
      clamp_stages(PAGEDMHA_SM90_V_STAGES > 0 ? PAGEDMHA_SM90_V_STAGES : kStagesWanted, kTilesFit - kKStages);
  static_assert(kKStages >= 2 && kVStages >= 2, "two stages at least");
  static constexpr int kSmemBytes = 1024 /* alignment slack */ + kQSlots * kQBytes +
                                    (kKStages + kVStages) * kTileBytes + kRawSlots * kRawBytes + kBarrierBytes;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

/// Query heads packed into one tile with their tokens (GQA packing): the G heads of a
/// KV head share every K / V tile, so short extends fill 128 rows with G x n rows and
/// long prompts cut the diagonal band (tiles span 128 / G tokens). The largest divisor
/// of G up to 16 (a TMA box dimension; tiles keep >= 8 tokens).
/// PAGEDMHA_SM90_MAX_PACK=k (experiment) packs at most k heads: with k = 1 and
/// PAGEDMHA_SM90_CLUSTER=1 the tiles are FlashAttention-3's (one head, kBlockM tokens,
/// no cluster).
#ifndef PAGEDMHA_SM90_MAX_PACK
#define PAGEDMHA_SM90_MAX_PACK 16
#endif
inline int gqa_pack(int group) {
  constexpr int kMax = PAGEDMHA_SM90_MAX_PACK < 16 ? PAGEDMHA_SM90_MAX_PACK : 16;
  for (int p = group < kMax ? group : kMax; p > 1; --p) {
    if (group % p == 0) return p;
  }
  return 1;
}

/// CTAs per cluster: two when K / V come by TMA and the query heads of a KV head split
/// into two head groups (an even GQA group): the pair runs the same tokens of the same KV
/// head, so each K / V box is loaded once and multicast to both, halving the L2 -> SM
/// traffic and each CTA's box issues (H200, run 4 of 2026-12-02: clusters of one lose
/// 10% at llama3-8b 1 x 16k page 16 and tie at D = 64; docs/perf-notes/prefill-sm90.md). Else one.
#ifndef PAGEDMHA_SM90_CLUSTER
#define PAGEDMHA_SM90_CLUSTER 2
#endif
inline int cluster_size(int group, bool kv_tma) {
  return PAGEDMHA_SM90_CLUSTER == 2 && kv_tma && group % 2 == 0 ? 2 : 1;
}

/// Tokens of one request per query tile.
inline int tokens_per_tile(int block_m, int pack) { return block_m / pack; }

/// Whether Q (16-bit) can be loaded with TMA boxes of [tokens][pack heads][64].
inline bool q_tma_ok(bool fp8_q, int64_t row_stride_bytes, int64_t head_stride_bytes, int64_t rows) {
  if (fp8_q) return false;
  const auto a16 = [](int64_t x) { return x > 0 && x % 16 == 0 && x < (int64_t{1} << 40); };
  return a16(row_stride_bytes) && a16(head_stride_bytes) && rows < (int64_t{1} << 31);
}

/// Workspace of the plan (all offsets 16-byte aligned): the count of entries, the
/// per-request prefix of units (pairs or single tiles), then the units in the order to
/// run them (two 16-byte entries each: hopper/schedule.cuh).
struct PlanLayout {
  static constexpr int64_t kHeader = 16;
  PAGEDMHA_HD static int64_t prefix_offset() { return kHeader; }
  PAGEDMHA_HD static int64_t list_offset(int64_t batch) { return kHeader + ((4 * (batch + 1) + 15) / 16) * 16; }
  /// Bytes for `batch` requests and `total_q` query rows: a request of n >= 1 queries has
  /// t = ceil(n / tokens) tiles in 2 ceil(t / 2) <= n + 1 entries as pairs (a pair's
  /// missing partner is the + 1), or 2 t <= n + 1 as single tiles with empty partners
  /// (tokens >= 2: at least 128 rows over at most 16 packed heads), whatever the head
  /// geometry.
  PAGEDMHA_HD static int64_t bytes(int64_t batch, int64_t total_q) { return list_offset(batch) + 16 * (total_q + batch); }
};

/// D = 256, 16-bit KV by TMA: launches whose longest query run (the host bound
/// max_q_len) is at most this many tokens take 64-key tiles, the others 80. Against 80 on
/// the H100 (2026-12-06; docs/perf-notes/prefill-sm90-loop.md sections 20-23): 64 was
/// +6-13% at gemma 16 x 1k before the plan kept a request's pairs together and +1.5% with
/// it (s28run3; 1024 keys are 12.8 tiles of 80: a causal query tile reads up to 79 keys
/// past its diagonal and has two or three masked tiles), and 80 is +4-8% at 4 x 4k and
/// +3-6% at 2k-query chunks over 8k keys. A host bound: under a CUDA graph
/// the choice is the capture's (both tiles give the same results up to bf16 rounding).
constexpr int kD256ShortQ = PAGEDMHA_SM90_D256_SHORT_Q;
/// Keys per tile of D = 256's 16-bit TMA path for a launch of max_q_len (launch.cuh).
constexpr int d256_tma_block_n(int max_q_len) { return max_q_len <= kD256ShortQ ? 64 : 80; }

/// fp8 KV at D = 64 by TMA: whether a launch of `rows` query tokens in `batch` requests
/// of at most `max_q_len`, in tiles of `pack` heads (gqa_pack), `head_units` tiles per
/// token range (KV heads x head groups) and `ctas` CTAs takes 192-row tiles (kFp8Wg3). A
/// 192-row tile is 1.5x a 128-row tile's work at ~1.12x its rate, so ~4/3 its time: they
/// pay when their rounds of the grid times 4/3 are at most the 128-row tiles' rounds
/// (not monotonic in rows: rounds are whole). Measured +8-20% from one full round on
/// (H100 s30run1-2), and -21% for a 2k chunk of the one-KV-head TP-8 rank (84 tiles of
/// 192 rows on 132 SMs: one round of longer tiles, a third of the SMs idle;
/// docs/perf-notes/prefill-sm90-fp8.md sections 12-13). A request's tiles are
/// ceil(n / tokens); from host bounds their sum is at most ceil(rows / tokens) + batch - 1
/// and batch x ceil(max_q_len / tokens), the smaller taken (exact for one request;
/// requests of one tile either way count equal). Host bounds, so under a CUDA graph the
/// choice is the capture's; both tiles give the same results up to fp16 rounding.
inline bool fp8_rows192_pays(int64_t rows, int64_t batch, int64_t max_q_len, int pack, int64_t head_units,
                             int64_t ctas) {
  if (PAGEDMHA_SM90_FP8_WG3 != 1) return PAGEDMHA_SM90_FP8_WG3 == 2;
  if (rows <= 0 || batch <= 0 || max_q_len <= 0 || ctas <= 0) return false;
  const auto rounds = [&](int block_m) {
    const int64_t tokens = tokens_per_tile(block_m, pack);
    const int64_t tiles =
        std::min((rows + tokens - 1) / tokens + batch - 1, batch * ((max_q_len + tokens - 1) / tokens));
    return (tiles * head_units + ctas - 1) / ctas;
  };
  return 4 * rounds(192) <= 3 * rounds(128);
}

/// The plan runs each request's query tiles in pairs (tile n - 1 - j then tile j: a
/// request's K / V read together, schedule.cuh) when the batch has at least this many
/// rounds of pair units for the grid, and single tiles otherwise, and the walkers take
/// each round's units in serpentine order (walk_order.h). A pair is two tiles of work,
/// so a short grid of pairs idles: 86 pairs of one TP-8 rank's 8k-query extend on 66 clusters run two
/// rounds for 1.3 rounds of work (the suites at 57b7d00 and c6c1e8d read gpt-oss-tp8
/// bf16 at 359 and 323 TFLOP/s, H100), and 2-4 requests of an 8k Mooncake step balance at
/// 0.63-0.79 in pairs against 0.82-0.88 in serpentine single tiles (a host model of the
/// walk: docs/perf-notes/prefill-sm90-loop.md section 24). From three rounds on the
/// pairs' idle tail is under a sixth of a round and their L2 reuse pays (gemma 16 x 1k:
/// 7.8 rounds, +8%). Measured against pairs round-robin (s29run1, H100; section 24):
/// the bf16 extend above +35%, a 2k chunk over 28k keys +90%, two 3k chunks over 20k
/// +31%, the batches of three rounds or more within the spread. Knob
/// PAGEDMHA_SM90_PLAN_PAIR_ROUNDS (0: always pairs, round-robin).
#ifndef PAGEDMHA_SM90_PLAN_PAIR_ROUNDS
#define PAGEDMHA_SM90_PLAN_PAIR_ROUNDS 3
#endif
constexpr int kPlanPairRounds = PAGEDMHA_SM90_PLAN_PAIR_ROUNDS;

/// Fewest pairs for which the plan pairs tiles: kPlanPairRounds rounds of `walkers`
/// clusters, each pair giving `per_entry` units (KV heads x head groups / cluster); 0
/// with the knob at 0.
PAGEDMHA_HD int plan_min_pairs(int walkers, int per_entry) {
  return (kPlanPairRounds * walkers + per_entry - 1) / per_entry;
}

/// Cost buckets of the longest-first order (KV tiles a pair of query tiles reads; longer
/// pairs share the last bucket).
constexpr int kPlanBuckets = 2048;
constexpr int kPlanThreads = 1024;

}  // namespace pagedmha::cuda::sm90
