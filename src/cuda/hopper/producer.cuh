// The producer warpgroup(s) of the Hopper kernels: loads each query tile's Q once and
// streams its K / V tiles (last key tile first, the consumers' order: K0 K1 V0 K2 V1 ...)
// into the swizzled rings, signalling the consumers through mbarriers. Three ways in,
// chosen once per launch (paged_kv.cuh kv_tma_ok, policy.h q_tma_ok):
//   * TMA: the producer team's warps share each tile's boxes (a page, or a tile of a
//     page: unit i to lane i / W of warp i % W, W = kTmaWarps, four for a whole
//     warpgroup), page ids read in parallel one tile ahead; the rows of V's last page
//     past the request's length are copied by hand (warp 0) so that what lies there
//     (anything) never meets a zero probability;
//   * cp.async gather (page size 1, odd sizes or strides): all 128 threads, one 16-byte
//     chunk at a time through the page table (a tile's page ids read in one batch),
//     zero-filling keys outside the tile's span;
//   * fp8 caches: the raw e4m3 tile lands (TMA boxes shared by the warps as above, or
//     the gather) in one of the staging slots, then all the team's threads convert it
//     exactly into the 16-bit stage, zeroing keys outside the span. Two producer teams
//     where the policy says so (two warpgroups, or policy.h kFp8Teams' two halves of
//     one): one loads Q and converts the K tiles, the other the V tiles, each through its
//     own staging slots and named barrier, or (policy.h kFp8InPlace) each through its
//     ring alone, the raw tile landing in the upper half of the stage it is converted
//     into.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/hopper/params.cuh"
#include "cuda/hopper/sm90.cuh"

namespace pagedmha::cuda::sm90 {

/// kTma: K / V by TMA (16-bit into the stages, fp8 into the staging slots); else the
/// cp.async gather. A template parameter, not a runtime flag: each kernel then holds one
/// load path, and the producer's few registers (setmaxnreg) suffice for it.
template <class Pol, class T, class KV>
struct Producer {
  static constexpr bool kTma = Pol::kKvTma;
  static constexpr int D = Pol::kHeadDim, BN = Pol::kBlockN, BM = Pol::kBlockM;
  using KPipe = PipeState<Pol::kKStages>;
  using VPipe = PipeState<Pol::kVStages>;
  static constexpr int kPanels = D / 64;
  static constexpr int kChunks = D / 8;  // 16-byte chunks of a 16-bit row
  static constexpr bool kFp8 = Pol::kFp8Kv;
  using M = MmaType<Pol, T>;  // the stages' and Q's type (T, or fp16 for fp8 KV)

  const Sm90Params& p;
  const SmemLayout<Pol> sm;  // by value: a reference would put it in local memory
  int tid;   // 0 .. Pol::kRoleThreads - 1 within the producer team
  int role;  // fp8 with two producer teams: 0 loads Q and streams K, 1 streams V; else 0
  static constexpr int kTeam = Pol::kRoleThreads;  // threads of a producer team

  /// Keys [a, e) of KV tile `tile` that the query tile reads.
  struct Span {
    int key0, a, e;
  };
  __device__ static Span span(const QueryTile& t, int tile) {
    Span r;
    r.key0 = tile * BN;
    r.a = r.key0 > t.keys.span_lo ? r.key0 : t.keys.span_lo;
    r.e = r.key0 + BN < t.keys.span_hi ? r.key0 + BN : t.keys.span_hi;
    return r;
  }

  /// What a producer team loads: everything (one team), or with two (fp8 caches) Q and
  /// the K tiles, or the V tiles. Compile-time in the loops, so each team's code holds
  /// only its own pipeline state in its few registers.
  enum class Role { kAll, kQK, kV };

  __device__ void run() {
    static_assert(Pol::kProducerRoles == 1 || (kFp8 && kTma), "two producer teams convert TMA-loaded fp8 tiles");
    if constexpr (Pol::kProducerRoles == 2) {
      // Teams of two warps (kFp8Teams): a role read from lane 0 is one ptxas knows is
      // warp-uniform, so each team's loop is uniform control flow and keeps the walk, the
      // item and the pipeline state in uniform registers; branching on the plain role
      // spilled its 32 registers. The two producer warpgroups keep the plain role: they
      // fit their 56 without it, and their kernels are the ones measured.
      if ((kTeam == 64 ? __shfl_sync(0xffffffffu, role, 0) : role) == 0) {
        run_as<Role::kQK>();
      } else {
        run_as<Role::kV>();
      }
    } else {
      run_as<Role::kAll>();
    }
  }

  template <Role kRole>
  __device__ void run_as() {
    KPipe ks;
    VPipe vs;
    PipeState<kRawPerRole> raw;  // this team's fp8 staging slots (full barriers count TMA bytes)
    PipeState<Pol::kQSlots> qs;
    const Walk walk(p);
    // The next item's plan entry is loaded as an item starts (four registers across the
    // item), except in the two fp8 producer teams, whose 56 registers it spills: they
    // load an item's entry as it starts.
    constexpr bool kPrefetch = Pol::kProducerRoles == 1;
    int4 next = kPrefetch ? walk.entry(p, walk.begin(p)) : make_int4(0, 0, 0, 0);
    for (int item = walk.begin(p); item < walk.total; item = walk.next(p, item)) {
      const QueryTile t = walk.template tile<BN>(p, item, kPrefetch ? next : walk.entry(p, item));
      if (kPrefetch) next = walk.entry(p, walk.next(p, item));
      if (t.n_tok <= 0) continue;  // a pair's missing tile (schedule.cuh plan_kernel)
      const int n = t.keys.end - t.keys.begin;
      if (n <= 0) continue;  // the consumers write zeros without reading anything
      const auto next_q = [&] {
        wait(sm.q_empty(qs.slot), qs.phase ^ 1);
        load_q(t, qs.slot);
        qs.advance();
      };
      const int32_t* pages = p.a.page_table + int64_t{t.b} * p.a.page_table_row_stride;
      if constexpr (kFp8) {
        // A query to convert (q_convert) is finished once the item's first K / V loads
        // are out, so that its TMA latency overlaps theirs.
        PipeState<Pol::kQSlots> q = qs;
        if constexpr (kRole != Role::kV) next_q();
        const auto q_ready = [&] {
          if (kRole != Role::kV && p.tma_q && p.q_convert) finish_q(q.slot, q.phase);
        };
        if constexpr (Pol::kFp8InPlace) {
          if constexpr (kRole == Role::kV) {
            convert_in_place<true>(t, pages, n, vs, q_ready);
          } else {
            convert_in_place<false>(t, pages, n, ks, q_ready);
          }
        } else {
          convert_kv<kRole>(t, pages, n, ks, vs, raw, q_ready);
        }
      } else if constexpr (kTma) {
        stream_kv(
            t, n, ks, vs, next_q, [&](int tile) { return lane_page(t, pages, tile); },
            [&](int tile, bool is_v, int page, auto& st, const CUtensorMap& map) {
              tma_tile(t, pages, tile, is_v, page, st, map, walk.rank);
            });
      } else {
        stream_kv(
            t, n, ks, vs, next_q, [&](int tile) { return row_page(t, pages, tile); },
            [&](int tile, bool is_v, int page, auto& st, const CUtensorMap&) {
              wait(is_v ? sm.v_empty(st.slot) : sm.k_empty(st.slot), st.phase ^ 1);
              gather<kChunks, 2>(t, tile, page, is_v, is_v ? sm.v(st.slot) : sm.k(st.slot));
              cp_async_arrive(is_v ? sm.v_full(st.slot) : sm.k_full(st.slot));
              st.advance();
            });
      }
    }
  }

  // ---- Q ---------------------------------------------------------------------------

  /// Element offset in q of row r of query tile t: token `tok` (= r / pack), head
  /// head0 + r % pack.
  __device__ int64_t q_offset(const QueryTile& t, int tok, int r) const {
    return int64_t{t.q_row0 + tok} * p.a.q_row_stride + int64_t{t.head0 + r % p.pack} * p.a.q_head_stride;
  }

  __device__ void load_q(const QueryTile& t, int slot) {
    const int rows = p.space.tokens * p.pack;
    char* const q_smem = sm.q(slot);
    uint64_t* const full = sm.q_full(slot);
    if (p.tma_q) {
      // Converting: the bytes land on q_land, finish_q arrives on full.
      uint64_t* const land = p.q_convert ? sm.q_land(slot) : full;
      if (tid == 0) {
        expect_tx(land, static_cast<uint32_t>(rows * 128 * kPanels));
#pragma unroll
        for (int c = 0; c < kPanels; ++c) {
          tma_load_3d(&p.tm_q, land, q_smem + c * BM * 128, c * 64, t.head0, t.q_row0, kEvictFirst);
        }
        arrive(land);
      }
      return;
    }
    // Row r of the tile: token r / pack, head head0 + r % pack; rows past the tile's
    // tokens are zero.
    const char* q = static_cast<const char*>(p.a.q);
    if (!p.a.q_fp8) {
      // 16-bit queries; of another type than the GEMMs' (bf16 for fp8 KV's fp16 GEMMs)
      // they are converted in place once every thread's copies have landed.
#pragma unroll 1
      for (int idx = tid; idx < BM * kChunks; idx += kTeam) {
        const int r = idx / kChunks, c = idx % kChunks;
        const int tok = r / p.pack;
        const bool valid = r < rows && tok < t.n_tok;
        const char* src = q;
        if (valid) {
          src += q_offset(t, tok, r) * 2 + c * 16;
        }
        cp_async_16(smem_addr(q_smem + tile_offset(BM, r, c)), src, valid);
      }
      if constexpr (std::is_same<M, T>::value) {
        cp_async_arrive(full);
      } else {
        cp_async_commit();
        cp_async_wait<0>();
        named_sync(kBarProducer + role, kTeam);  // every thread's chunks have landed
        convert_q_in_place(slot);
        fence_async_smem();
        arrive(full);
      }
    } else {
      // fp8 e4m3 queries: 16 values per load, converted exactly to M.
#pragma unroll 1
      for (int idx = tid; idx < BM * (D / 16); idx += kTeam) {
        const int r = idx / (D / 16), c = idx % (D / 16);
        const int tok = r / p.pack;
        uint4 out[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
        if (r < rows && tok < t.n_tok) {
          const uint4 raw_q = __ldg(reinterpret_cast<const uint4*>(q + q_offset(t, tok, r) + c * 16));
          fp8x16_to<M>(raw_q, out);
        }
        sts128(smem_addr(q_smem + tile_offset(BM, r, 2 * c)), out[0]);
        sts128(smem_addr(q_smem + tile_offset(BM, r, 2 * c + 1)), out[1]);
      }
      fence_async_smem();
      arrive(full);
    }
  }

  /// The bf16 query tile in slot `slot` into fp16 in place, each 16-byte chunk onto
  /// itself (saturating past fp16's range: docs/semantics.md), two chunks in flight per
  /// thread. Rows past the tile's tokens (other rows of q, zeros, or what the slot held
  /// when pack does not divide BM) are converted but never written out, and each output
  /// row reads only its own query row. Only bf16 -> fp16 converts (launch.cuh asserts
  /// q_convert means that pair).
  __device__ void convert_q_in_place(int slot) const {
    if constexpr (std::is_same<T, __nv_bfloat16>::value && std::is_same<M, __half>::value) {
      const uint32_t q_smem = smem_addr(sm.q(slot));
      constexpr int kPerThread = BM * kChunks / kTeam, kGroup = 2;
      static_assert(BM * kChunks % kTeam == 0 && kPerThread % kGroup == 0, "whole groups");
#pragma unroll 1
      for (int g = 0; g < kPerThread; g += kGroup) {
        uint4 v[kGroup];
#pragma unroll
        for (int u = 0; u < kGroup; ++u) v[u] = lds128(q_smem + (tid + (g + u) * kTeam) * 16);
#pragma unroll
        for (int u = 0; u < kGroup; ++u) sts128(q_smem + (tid + (g + u) * kTeam) * 16, bf16x8_to_half_sat(v[u]));
      }
    }
  }

  /// A bf16 query tile loaded by TMA into slot `slot` (q_convert), once landed, into
  /// fp16 (convert_q_in_place).
  __device__ void finish_q(int slot, uint32_t phase) const {
    wait(sm.q_land(slot), phase);
    convert_q_in_place(slot);
    fence_async_smem();
    arrive(sm.q_full(slot));
  }

  // ---- TMA (all four warps share a tile's boxes) ---------------------------------------

  /// Issuing a box costs a serial chain (elect a lane, move its coordinates to uniform
  /// registers, UTMALDG): one warp issuing every box of a tile was the producer's limit
  /// (H200: a page-16 tile's 16 boxes took ~2,300 cycles; docs/perf-notes/prefill-sm90.md), so the
  /// team's warps split the boxes: unit i of a tile (from the first overlapping [a, e))
  /// belongs to lane i / kTmaWarps of warp i % kTmaWarps (64 units or more: a tile of up
  /// to 128 keys has at most 16 boxes, kv_boxes.h).
  static constexpr int kTmaWarps = kTeam / 32;
  __device__ int my_unit() const { return (tid & 31) * kTmaWarps + (tid >> 5); }
  /// Arrivals on a 16-bit TMA full barrier per phase: every lane of warp 0 (a
  /// cp.async.mbarrier.arrive.noinc, which also waits for the lane's V-tail copies, if
  /// any) and lane 0 of each other warp.
  static constexpr int kTmaFullArrivals = 32 + kTmaWarps - 1;

  /// This thread's page id for KV tile `tile`: unit my_unit() is the box of keys
  /// [u * R, u * R + R) with u = a / R + my_unit(), for the boxes overlapping [a, e) (0 for
  /// the others).
  __device__ int lane_page(const QueryTile& t, const int32_t* pages, int tile) const {
    const Span sp = span(t, tile);
    const PageGeometry& g = p.geo;
    const int u = g.box(sp.a) + my_unit();
    return u <= g.box(sp.e - 1) ? __ldg(pages + g.col(g.box_key(u))) : 0;
  }

  /// The item's Q (`next_q`: waits for a free query-tile buffer) and K / V tiles in the
  /// consumers' order K0, K1, V0, K2, V1, ...: `issue` loads one; the page ids it needs
  /// (`page_of`, per lane) are read one tile ahead (their latency hides behind the
  /// previous tile's waits and copies), and V_j reuses K_j's.
  template <class NextQ, class PageOf, class Issue>
  __device__ void stream_kv(const QueryTile& t, int n, KPipe& ks, VPipe& vs, NextQ next_q, PageOf page_of,
                            Issue issue) const {
    const int last = t.keys.end - 1;
    next_q();
    int cur = page_of(last);
    issue(last, false, cur, ks, p.tm_k);
    int next = n > 1 ? page_of(last - 1) : 0;
    for (int j = 1; j < n; ++j) {
      issue(last - j, false, next, ks, p.tm_k);
      const int prev = cur;
      cur = next;
      if (j + 1 < n) next = page_of(last - j - 1);
      issue(last - j + 1, true, prev, vs, p.tm_v);
    }
    issue(t.keys.begin, true, cur, vs, p.tm_v);
  }

  /// One K or V tile by TMA into the next stage of `st` (16-bit: 128-byte rows per
  /// panel); V's unit holding keys past L is copied by hand (warp 0). Each producer warp
  /// expects the bytes of its units, then arrives (kTmaFullArrivals). In a cluster of two the boxes (unit, panel) alternate between the CTAs
  /// and each is multicast to both: each CTA's full barrier expects the whole tile, its
  /// empty barrier both CTAs' releases.
  template <class Pipe>
  __device__ void tma_tile(const QueryTile& t, const int32_t* pages, int tile, bool is_v, int page, Pipe& st,
                           const CUtensorMap& map, int rank) const {
    const int lane = tid & 31, i = my_unit();
    const Span sp = span(t, tile);
    const PageGeometry& g = p.geo;
    const int R = g.box_rows;
    const int u0 = g.box(sp.a), u1 = g.box(sp.e - 1);
    const int tail = (is_v && (t.L & (R - 1)) != 0) ? g.box(t.L - 1) : -1;  // unit holding keys past L
    const int u = u0 + i;
    const bool mine = u <= u1 && u != tail;
    const int pos = g.box_key(u);
    uint64_t* full = is_v ? sm.v_full(st.slot) : sm.k_full(st.slot);
    char* dst = is_v ? sm.v(st.slot) : sm.k(st.slot);
    wait(is_v ? sm.v_empty(st.slot) : sm.k_empty(st.slot), st.phase ^ 1);
    const uint32_t bytes = __reduce_add_sync(0xffffffffu, mine ? static_cast<uint32_t>(R * 128 * kPanels) : 0u);
    if (lane == 0 && bytes > 0) expect_tx(full, bytes);
    __syncwarp();
    if (mine) {
#pragma unroll
      for (int c = 0; c < kPanels; ++c) {
        char* box = dst + c * BN * 128 + (pos - sp.key0) * 128;
        if (p.cluster == 1) {
          tma_load_4d(&map, full, box, c * 64, t.kv_head, g.row(pos), page, kEvictLast);
        } else if ((i * kPanels + c) % 2 == rank) {
          tma_load_4d_multicast(&map, full, box, 0x3, c * 64, t.kv_head, g.row(pos), page, kEvictLast);
        }
      }
    }
    if (tid < 32 && tail >= u0 && tail <= u1) {
      // Keys [max(tail * R, a), min(L, e)) by cp.async; the rest of the unit keeps what
      // the stage held (finite: earlier V rows or the zeros written at start).
      const int r0 = g.box_key(tail) > sp.a ? g.box_key(tail) : sp.a;
      const int r1 = t.L < sp.e ? t.L : sp.e;
      copy_rows(t, pages, sp.key0, r0, r1, dst);
    }
    __syncwarp();
    if (tid < 32) {
      cp_async_arrive(full);  // once this lane's tail copies (if any) have landed
    } else if (lane == 0) {
      arrive(full);
    }
    st.advance();
  }

  /// Warp 0: cp.async of V keys [r0, r1) (one page: inside the tail unit) into the
  /// swizzled 16-bit tile (the caller's cp_async_arrive counts them on the full barrier).
  __device__ void copy_rows(const QueryTile& t, const int32_t* pages, int key0, int r0, int r1, char* dst) const {
    const PageGeometry& g = p.geo;
    const int64_t page = __ldg(pages + g.col(r0));
    const char* base = static_cast<const char*>(p.a.v) +
                       (int64_t{t.kv_head} * p.a.v_head_stride + page * p.a.v_page_stride) * 2;
#pragma unroll 1
    for (int idx = tid; idx < (r1 - r0) * kChunks; idx += 32) {
      const int pos = r0 + idx / kChunks, c = idx % kChunks;
      cp_async_16(smem_addr(dst + tile_offset(BN, pos - key0, c)), base + g.row(pos) * p.a.v_token_stride * 2 + c * 16,
                  true);
    }
  }

  // ---- cp.async gather (all 128 threads) ---------------------------------------------

  static constexpr int kWarpRows = BN / 4;  // rows of a tile each producer warp copies

  /// This lane's page id for row (warp * kWarpRows + lane) of KV tile `tile`; -1 for
  /// rows outside the keys [a, e) the query tile reads (zero-filled, the table untouched).
  __device__ int row_page(const QueryTile& t, const int32_t* pages, int tile) const {
    const Span sp = span(t, tile);
    const int lane = tid & 31, pos = sp.key0 + (tid >> 5) * kWarpRows + lane;
    return lane < kWarpRows && pos >= sp.a && pos < sp.e ? __ldg(pages + p.geo.col(pos)) : -1;
  }

  /// The warp's kWarpRows rows of KV tile `tile` by 16-byte cp.async: kRowChunks chunks of
  /// kEsize-byte elements per row. Each lane first forms its own row's source address
  /// (from the page id row_page read; null for rows outside the span, which are
  /// zero-filled), once per tile; the chunks then go out row after row (consecutive lanes
  /// on consecutive chunks of a row: coalesced), each lane taking its row's address from
  /// the lane that formed it. The destination is the swizzled 16-bit tile (kEsize 2) or
  /// the dense raw fp8 slot (kEsize 1, rows of D bytes).
  template <int kRowChunks, int kEsize>
  __device__ void gather(const QueryTile& t, int tile, int page, bool is_v, char* dst) const {
    const void* cache = is_v ? p.a.v : p.a.k;
    const int64_t ps = is_v ? p.a.v_page_stride : p.a.k_page_stride;
    const int64_t ts = is_v ? p.a.v_token_stride : p.a.k_token_stride;
    const int64_t hs = is_v ? p.a.v_head_stride : p.a.k_head_stride;
    const char* base = static_cast<const char*>(cache) + int64_t{t.kv_head} * hs * kEsize;
    const int lane = tid & 31, row0 = (tid >> 5) * kWarpRows, key0 = tile * BN;
    const char* row = nullptr;
    if (page >= 0) row = base + (int64_t{page} * ps + p.geo.row(key0 + row0 + lane) * ts) * kEsize;
    static_assert((kWarpRows * kRowChunks) % 32 == 0, "whole warp steps");
#pragma unroll 4
    for (int idx = lane; idx < kWarpRows * kRowChunks; idx += 32) {
      const int rl = idx / kRowChunks, c = idx % kRowChunks;
      const char* src = reinterpret_cast<const char*>(
          __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(row), rl));
      const int r = row0 + rl;
      const uint32_t off = kEsize == 2 ? tile_offset(BN, r, c) : static_cast<uint32_t>(r * D + c * 16);
      cp_async_16(smem_addr(dst + off), src != nullptr ? src + c * 16 : base, src != nullptr);
    }
  }

  // ---- fp8 K / V ---------------------------------------------------------------------

  /// Staging slots per producer team: all of them with one, half each with two (the K
  /// team's first, then the V team's).
  static constexpr int kRawPerRole = Pol::kRawSlots > 0 ? Pol::kRawSlots / Pol::kProducerRoles : 1;

  /// Element x of this team's stream of an item's tiles: with one producer team the
  /// consumers' order K0, K1, V0, K2, V1, .. (kv_order, 2n elements); with two, its own
  /// K or V tiles, last key tile first (n elements each).
  struct Elem {
    int tile;
    bool is_v;
  };
  template <Role kRole>
  __device__ static Elem elem(const QueryTile& t, int n, int x) {
    if constexpr (kRole != Role::kAll) {
      return {t.keys.end - 1 - x, kRole == Role::kV};
    } else {
      int j;
      bool is_v;
      kv_order(x, n, j, is_v);
      return {t.keys.end - 1 - j, is_v};
    }
  }

  /// The item's K / V tiles through the team's kRawPerRole staging slots: elements
  /// x + 1 .. x + kRawPerRole - 1 are in flight while element x converts into its stage.
  /// `after_first_loads` runs once the first loads are out (finishing the item's Q).
  template <Role kRole, class AfterFirstLoads>
  __device__ void convert_kv(const QueryTile& t, const int32_t* pages, int n, KPipe& ks, VPipe& vs,
                             PipeState<kRawPerRole>& raw, AfterFirstLoads after_first_loads) {
    constexpr int R = kRawPerRole;
    // This team's staging slots and named barrier.
    constexpr int kSlot0 = kRole == Role::kV ? kRawPerRole : 0;
    constexpr int kBar = kBarProducer + (kRole == Role::kV ? 1 : 0);
    const auto elem = [&](int x) { return Producer::elem<kRole>(t, n, x); };
    const int total = kRole == Role::kAll ? 2 * n : n;
    for (int i = 0; i < R && i < total; ++i) {
      const int slot = kSlot0 + (raw.slot + i) % R;
      issue_raw(t, elem(i), sm.raw(slot), sm.raw_full(slot), raw_page(t, pages, elem(i)));
      if (!kTma) cp_async_commit();
    }
    after_first_loads();
    for (int x = 0; x < total; ++x) {
      const int ahead = x + R < total ? raw_page(t, pages, elem(x + R)) : 0;  // used after this conversion
      if constexpr (kTma) {
        wait(sm.raw_full(kSlot0 + raw.slot), raw.phase);
      } else {
        if (total - 1 - x >= R - 1) {
          cp_async_wait<R - 1>();
        } else {
          cp_async_wait<0>();
        }
        named_sync(kBar, kTeam);  // every thread's raw chunks of element x have landed
      }
      const Elem e = elem(x);
      const Span sp = span(t, e.tile);
      const int slot = e.is_v ? vs.slot : ks.slot;
      wait(e.is_v ? sm.v_empty(slot) : sm.k_empty(slot), (e.is_v ? vs.phase : ks.phase) ^ 1);
      convert_tile(smem_addr(sm.raw(kSlot0 + raw.slot)), smem_addr(e.is_v ? sm.v(slot) : sm.k(slot)), sp);
      fence_async_smem();
      arrive(e.is_v ? sm.v_full(slot) : sm.k_full(slot));
      named_sync(kBar, kTeam);  // the staging slot may be refilled
      if (x + R < total) {
        issue_raw(t, elem(x + R), sm.raw(kSlot0 + raw.slot), sm.raw_full(kSlot0 + raw.slot), ahead);
        if (!kTma) cp_async_commit();
      }
      raw.advance();
      if (e.is_v) {
        vs.advance();
      } else {
        ks.advance();
      }
    }
  }

  /// Converting in place (policy.h kFp8InPlace; two producer warpgroups, D = 128): the
  /// item's K (kIsV false) or V tiles, last key tile first, through this warpgroup's ring
  /// `st` alone. Each raw tile lands in the upper half of its stage once the consumers
  /// have released it, up to S - 1 tiles ahead of the conversion (S the ring's depth: the
  /// stage being converted holds the rest); the full barrier then counts the conversion.
  /// `after_first_loads` runs once the first loads are out (finishing the item's Q).
  template <bool kIsV, class Pipe, class AfterFirstLoads>
  __device__ void convert_in_place(const QueryTile& t, const int32_t* pages, int n, Pipe& st,
                                   AfterFirstLoads after_first_loads) {
    constexpr int kAhead = (kIsV ? Pol::kVStages : Pol::kKStages) - 1;
    const auto elem = [&](int x) { return Elem{t.keys.end - 1 - x, kIsV}; };
    Pipe ld = st;  // the next stage to load into
    const auto load = [&](int x, int page) {
      wait(kIsV ? sm.v_empty(ld.slot) : sm.k_empty(ld.slot), ld.phase ^ 1);
      issue_raw(t, elem(x), kIsV ? sm.v_raw(ld.slot) : sm.k_raw(ld.slot),
                kIsV ? sm.v_raw_full(ld.slot) : sm.k_raw_full(ld.slot), page);
      ld.advance();
    };
    for (int i = 0; i < kAhead && i < n; ++i) load(i, raw_page(t, pages, elem(i)));
    after_first_loads();
    for (int x = 0; x < n; ++x) {
      const int ahead = x + kAhead < n ? raw_page(t, pages, elem(x + kAhead)) : 0;  // used after this conversion
      wait(kIsV ? sm.v_raw_full(st.slot) : sm.k_raw_full(st.slot), st.phase);
      char* const stage = kIsV ? sm.v(st.slot) : sm.k(st.slot);
      convert_tile(smem_addr(stage + Pol::kTileBytes / 2), smem_addr(stage), span(t, elem(x).tile));
      fence_async_smem();
      arrive(kIsV ? sm.v_full(st.slot) : sm.k_full(st.slot));
      st.advance();
      if (x + kAhead < n) load(x + kAhead, ahead);
    }
  }

  /// One raw e4m3 tile (dense rows of D bytes) into its 16-bit stage (swizzled rows) as M.
  /// A thread's chunks are kTeam apart (same column, rows kTeam / (D / 16) apart: one
  /// swizzle phase, so addresses differ by constants). Each group of kFp8ConvertUnroll chunks is
  /// loaded before any of it converts, so its loads are in flight together; keys outside
  /// the span have their raw bytes zeroed (e4m3 0 is +0) instead of a guarded load (one
  /// branch and one round trip per chunk). Tiles inside the span (all but an item's first
  /// and last) skip that test: a compare and four selects per 16 keys' bytes.
  __device__ void convert_tile(uint32_t src, uint32_t dst, const Span& sp) const {
    if (sp.a == sp.key0 && sp.e == sp.key0 + BN) {
      convert_tile_as<false>(src, dst, sp);
    } else {
      convert_tile_as<true>(src, dst, sp);
    }
  }
  template <bool kEdge>
  __device__ __forceinline__ void convert_tile_as(uint32_t src, uint32_t dst, const Span& sp) const {
    constexpr int kPerThread = BN * (D / 16) / kTeam;  // 16-byte raw chunks per thread
    constexpr int U = Pol::kFp8ConvertUnroll < kPerThread ? Pol::kFp8ConvertUnroll : kPerThread;
    static_assert(BN * (D / 16) % kTeam == 0 && kPerThread % U == 0, "whole groups of chunks per thread");
    // Chunk k of the thread: raw row r0 + k * kRowStep, column c0 (16 bytes); its two
    // 16-bit chunks keep their swizzle phase where kRowStep is a multiple of 8, so every
    // address is a base plus a compile-time step: three registers across the tile, where
    // per-chunk offsets hoisted out of the loop spilled the producer's 40 registers. A
    // step of 4 (two-warp teams at D = 256) alternates two phases: odd chunks take a
    // second pair of bases.
    constexpr int kRowStep = kTeam / (D / 16);
    static_assert(kRowStep % 4 == 0, "at most two swizzle phases per thread");
    constexpr bool kTwoPhases = kRowStep % 8 != 0;
    // Each 8-thread phase of a 16-byte access reads 4 chunks (a piece) of an even row and
    // 4 of the next row, pieces of opposite parity above D = 64: its loads still cover all
    // 32 banks, and now its stores too (the row parities' swizzles put them in opposite
    // chunk parities). The plain order (8 chunks of one row) stored into the same banks of
    // two 16-byte columns that are a panel apart: 8 wavefronts per STS.128 instead of 4 at
    // D = 128 (ncu, H200 2026-12-03 s10run1).
    constexpr int kPieces = D / 64;  // 4-chunk pieces per raw row
    const int phase = tid >> 3, hi = (tid >> 2) & 1;
    const int r0 = 2 * (phase / kPieces) + hi;
    const int c0 = 4 * (kPieces > 1 ? (phase % kPieces) ^ hi : 0) + (tid & 3);
    const uint32_t src0 = src + r0 * D + c0 * 16;
    const uint32_t dst0 = dst + tile_offset(BN, r0, 2 * c0), dst1 = dst + tile_offset(BN, r0, 2 * c0 + 1);
    // Odd chunks' bases with two phases (row r0 + kRowStep, less the step they add).
    const uint32_t odd0 = kTwoPhases ? dst + tile_offset(BN, r0 + kRowStep, 2 * c0) - kRowStep * 128 : dst0;
    const uint32_t odd1 = kTwoPhases ? dst + tile_offset(BN, r0 + kRowStep, 2 * c0 + 1) - kRowStep * 128 : dst1;
    // The gather's producer holds its row addresses across the tile: groups one at a time.
    constexpr int kGroupsUnrolled = kTma ? kPerThread / U : 1;
    if constexpr (PAGEDMHA_SM90_FP8_DIAG == 1) return;  // diagnostic: the stage as it is
    uint32_t keep = 0;  // PAGEDMHA_SM90_FP8_DIAG == 2: what the stores would have written
#pragma unroll(kGroupsUnrolled)
    for (int g = 0; g < kPerThread; g += U) {
      uint4 in[U];
#pragma unroll
      for (int u = 0; u < U; ++u) in[u] = lds128(src0 + (g + u) * kRowStep * D);
      if constexpr (Pol::kFp8InPlace) {
        // In place, raw row r is the second panel's row r: the 8 lanes reading it (one
        // warp: its 4 rows are its 4 phases' rows) are done before any of them writes it.
        static_assert(D == 128, "raw rows are panel rows at D = 128 only");
        __syncwarp();
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int pos = sp.key0 + r0 + (g + u) * kRowStep;
        if (kEdge && !(pos >= sp.a && pos < sp.e)) in[u] = make_uint4(0, 0, 0, 0);  // e4m3 0 is +0
        uint4 out[2];
        fp8x16_cache_to<M>(in[u], out);
        if constexpr (PAGEDMHA_SM90_FP8_DIAG == 2) {
          keep ^= out[0].x ^ out[0].y ^ out[0].z ^ out[0].w ^ out[1].x ^ out[1].y ^ out[1].z ^ out[1].w;
        } else {
          const bool odd = kTwoPhases && ((g + u) & 1);  // compile-time where unrolled
          sts128((odd ? odd0 : dst0) + (g + u) * kRowStep * 128, out[0]);
          sts128((odd ? odd1 : dst1) + (g + u) * kRowStep * 128, out[1]);
        }
      }
    }
    // Keeps the diagnostic's conversions alive (one store in ~2^32 tiles).
    if (PAGEDMHA_SM90_FP8_DIAG == 2 && keep == 0x9e3779b9u) sts128(dst0, make_uint4(keep, 0, 0, 0));
  }

  /// This lane's page id for element e's raw load (TMA: lane i's box; gather: row i of
  /// the lane's warp), read before the load is due so that its latency overlaps the
  /// conversions in between.
  __device__ int raw_page(const QueryTile& t, const int32_t* pages, const Elem& e) const {
    if constexpr (kTma) {
      return lane_page(t, pages, e.tile);
    } else {
      return row_page(t, pages, e.tile);
    }
  }

  /// Element e's raw e4m3 tile (dense rows of D bytes) to `dst` (a staging slot, or the
  /// upper half of a stage) with the thread's page id from raw_page: TMA boxes of R rows,
  /// unit my_unit() per thread (each warp's bytes and lane 0's arrival counted on
  /// `full`), or the gather (cp.async groups; `full` unused).
  __device__ void issue_raw(const QueryTile& t, const Elem& e, char* dst, uint64_t* full, int page) const {
    const Span sp = span(t, e.tile);
    if constexpr (!kTma) {
      gather<D / 16, 1>(t, e.tile, page, e.is_v, dst);
      return;
    }
    const PageGeometry& g = p.geo;
    const int lane = tid & 31;
    const int u = g.box(sp.a) + my_unit();
    const bool mine = u <= g.box(sp.e - 1);
    const uint32_t bytes = __reduce_add_sync(0xffffffffu, mine ? static_cast<uint32_t>(g.box_rows * D) : 0u);
    if (lane == 0 && bytes > 0) expect_tx(full, bytes);
    __syncwarp();
    if (mine) {
      tma_load_4d(e.is_v ? &p.tm_v : &p.tm_k, full, dst + (g.box_key(u) - sp.key0) * D, 0, t.kv_head,
                  g.row(g.box_key(u)), page, kEvictLast);
    }
    __syncwarp();
    if (lane == 0) arrive(full);
  }
};

}  // namespace pagedmha::cuda::sm90
