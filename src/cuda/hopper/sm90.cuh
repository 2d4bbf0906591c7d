// sm_90a building blocks for the Hopper kernels, on top of CUTLASS/CuTe's PTX wrappers
// (cute/arch: wgmma atoms, TMA copies; cutlass/arch: mbarriers, setmaxnreg): array
// forms of the warpgroup MMAs, shared-memory matrix descriptors for the 128-byte
// swizzled tiles the loaders write, pipeline state, and named barriers.
//
// Tile layout shared by every operand (Q, K, V, in 16-bit elements): a tile of R rows and
// C columns is C / 64 panels of [R][64]; a panel row is 128 bytes, and 16-byte chunk c of
// row r sits at chunk c ^ (r % 8) (TMA's SWIZZLE_128B; GMMA's B128 layout). Panels and
// tiles start on 1024-byte boundaries.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/arch/mma_sm90_gmma_ext.hpp>  // N = 40 / 80: D = 256's 80-key tiles (policy.h)
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

namespace pagedmha::cuda::sm90 {

namespace gmma = cute::SM90::GMMA;

/// Byte offset of 16-byte chunk c (of a 16-bit row with 8 * panels chunks) of row r in a
/// tile of `rows` rows laid out as above.
__device__ __forceinline__ uint32_t tile_offset(int rows, int r, int c) {
  return static_cast<uint32_t>((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/// The 16-bit type the GEMMs run in: the query dtype T, or fp16 where the policy says so
/// (fp8 KV: policy.h kMmaF16).
template <class Pol, class T>
using MmaType = std::conditional_t<Pol::kMmaF16, __half, T>;

/// 16-byte shared-memory load / store by shared-space address (a generic pointer into
/// the dynamic shared memory compiles to LD.E / ST.E: a 64-bit address and the window
/// test per access).
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sts128(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// ---- GMMA (wgmma) --------------------------------------------------------------------

/// Shared-memory matrix descriptors of the B128 operands, in two 32-bit halves. The high
/// half is the same for every operand here: stride offset 1024 B (8-row groups), swizzle
/// mode 128 B (bit 62). The low half holds the start address >> 4 and the leading offset,
/// so moving an operand by b bytes adds b >> 4 to it (addresses stay below 2^18: no carry
/// out of the 14-bit field). Building each k-step's descriptor from an address costs five
/// instructions; this way a k-step is one uniform add.
constexpr uint32_t kDescHi = (1024 >> 4) | (1u << 30);

__device__ __forceinline__ uint64_t gmma_desc(uint32_t lo) { return (uint64_t{kDescHi} << 32) | lo; }

/// K-major operand (Q and K of S = Q K^T) at `addr`: rows 128 B apart; the leading offset
/// is unused for swizzled K-major layouts. Advancing k by 16 elements inside a panel adds
/// 32 bytes.
__device__ __forceinline__ uint32_t desc_lo_k_major(uint32_t addr) { return ((addr >> 4) & 0x3FFF) | (1u << 16); }

/// MN-major operand (V as the B of P V: N = head dim along the 128-byte rows, K = keys down
/// the rows): 64-column panels `panel_bytes` apart (leading offset). 16 keys further =
/// +2048 B.
__device__ __forceinline__ uint32_t desc_lo_mn_major(uint32_t addr, uint32_t panel_bytes) {
  return ((addr >> 4) & 0x3FFF) | (((panel_bytes >> 4) & 0x3FFF) << 16);
}

/// The warpgroup of the calling thread, in a register the compiler knows is warp-uniform
/// (a shuffle from lane 0), so what is derived from it (descriptors, barrier ids) lives in
/// uniform registers instead of being moved into them before every wgmma.
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0); }

template <int N, class T>
struct GmmaOps;
#define PAGEDMHA_GMMA_OPS(N, TN, CT)                                                  \
  template <>                                                                         \
  struct GmmaOps<N, CT> {                                                             \
    using SS = gmma::MMA_64x##N##x16_F32##TN##TN##_SS<gmma::Major::K, gmma::Major::K>;  \
    using RS = gmma::MMA_64x##N##x16_F32##TN##TN##_RS<gmma::Major::K, gmma::Major::MN>; \
  };
PAGEDMHA_GMMA_OPS(32, BF16, __nv_bfloat16)
PAGEDMHA_GMMA_OPS(64, BF16, __nv_bfloat16)
PAGEDMHA_GMMA_OPS(128, BF16, __nv_bfloat16)
PAGEDMHA_GMMA_OPS(256, BF16, __nv_bfloat16)
PAGEDMHA_GMMA_OPS(32, F16, __half)
PAGEDMHA_GMMA_OPS(64, F16, __half)
PAGEDMHA_GMMA_OPS(128, F16, __half)
PAGEDMHA_GMMA_OPS(256, F16, __half)
// Shapes of the extended header (N not a power of two: D = 256's 80-key tiles, policy.h
// kBlockN), compiled only where a tile uses them.
PAGEDMHA_GMMA_OPS(40, BF16, __nv_bfloat16)
PAGEDMHA_GMMA_OPS(80, BF16, __nv_bfloat16)
PAGEDMHA_GMMA_OPS(40, F16, __half)
PAGEDMHA_GMMA_OPS(80, F16, __half)
#undef PAGEDMHA_GMMA_OPS

template <class Op, std::size_t... I>
__device__ __forceinline__ void gmma_ss_call(uint64_t a, uint64_t b, float (&d)[sizeof...(I) / 4][4],
                                             gmma::ScaleOut scale, std::index_sequence<I...>) {
  Op::fma(a, b, d[I / 4][I % 4]..., scale);
}

template <class Op, std::size_t... I>
__device__ __forceinline__ void gmma_rs_call(const uint32_t (&a)[4], uint64_t b, float (&d)[sizeof...(I) / 4][4],
                                             std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], b, d[I / 4][I % 4]..., gmma::ScaleOut::One);
}

/// d (64 x N per warpgroup, fp32; [N / 8][4]: the m16n8 accumulator layout per warp) =
/// A(smem) * B(smem)^T (+ d when `accumulate`); one k16 step.
template <int N, class T>
__device__ __forceinline__ void gmma_ss(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  gmma_ss_call<typename GmmaOps<N, T>::SS>(desc_a, desc_b, d, accumulate ? gmma::ScaleOut::One : gmma::ScaleOut::Zero,
                                           std::make_index_sequence<N / 2>{});
}

/// d += A(registers: the m16n8k16 A fragment of each warp's 16 rows) * B(smem, MN-major).
template <int N, class T>
__device__ __forceinline__ void gmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc_b) {
  gmma_rs_call<typename GmmaOps<N, T>::RS>(a, desc_b, d, std::make_index_sequence<N / 2>{});
}

/// Keeps the compiler from moving register reads / writes across the asynchronous MMAs.
template <int M, int N>
__device__ __forceinline__ void fence_operand(float (&x)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int j = 0; j < N; ++j) cute::warpgroup_fence_operand(x[i][j]);
  }
}
template <int M, int N>
__device__ __forceinline__ void fence_operand(uint32_t (&x)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int j = 0; j < N; ++j) cute::warpgroup_fence_operand(x[i][j]);
  }
}

// ---- barriers ------------------------------------------------------------------------

using Barrier = cutlass::arch::ClusterBarrier;
using TxBarrier = cutlass::arch::ClusterTransactionBarrier;

/// (slot, phase) of a ring of mbarrier-guarded buffers. Consumers wait on full[slot] for
/// `phase`; the producer waits on empty[slot] for phase ^ 1 (a fresh barrier counts its
/// previous phase as complete, so the first round passes).
template <int kSlots>
struct PipeState {
  int slot = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++slot == kSlots) {
      slot = 0;
      phase ^= 1;
    }
  }
};

__device__ __forceinline__ void wait(uint64_t* bar, uint32_t phase) { Barrier::wait(bar, phase); }
__device__ __forceinline__ void arrive(uint64_t* bar) { Barrier::arrive(bar); }
/// arrive() where `pred`: a predicated instruction, no branch, so the compiler may
/// schedule it among independent arithmetic.
__device__ __forceinline__ void arrive_if(uint64_t* bar, bool pred) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %1, 0;\n\t@p mbarrier.arrive.shared::cta.b64 _, [%0];\n\t}"
      :
      : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "r"(static_cast<int>(pred))
      : "memory");
}
/// Barrier::arrive(bar, cta, 1) on the cluster peer `cta`'s copy of `bar` where `pred`,
/// as predicated instructions (no branch).
__device__ __forceinline__ void arrive_peer_if(uint64_t* bar, int cta, bool pred) {
  asm volatile(
      "{\n\t.reg .pred p;\n\t.reg .b32 rem;\n\tsetp.ne.b32 p, %2, 0;\n\t"
      "@p mapa.shared::cluster.u32 rem, %0, %1;\n\t@p mbarrier.arrive.shared::cluster.b64 _, [rem];\n\t}"
      :
      : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "r"(cta), "r"(static_cast<int>(pred))
      : "memory");
}
__device__ __forceinline__ void expect_tx(uint64_t* bar, uint32_t bytes) { TxBarrier::expect_transaction(bar, bytes); }

/// Arrives on `bar` once this thread's cp.async copies so far have landed (counts as one
/// of the barrier's arrivals).
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) { cutlass::arch::cpasync_barrier_arrive_noinc(bar); }

/// Generic-proxy shared-memory writes of this thread become visible to TMA / GMMA reads.
__device__ __forceinline__ void fence_async_smem() { cutlass::arch::fence_view_async_shared(); }

__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- TMA -----------------------------------------------------------------------------

constexpr uint64_t kEvictLast = 0x14F0000000000000ull;   // K / V: re-read by other query tiles
constexpr uint64_t kEvictFirst = 0x12F0000000000000ull;  // Q: read once

__device__ __forceinline__ void tma_load_3d(const CUtensorMap* map, uint64_t* bar, void* dst, int c0, int c1, int c2,
                                            uint64_t hint) {
  cute::SM90_TMA_LOAD_3D::copy(map, bar, hint, dst, c0, c1, c2);
}
__device__ __forceinline__ void tma_load_4d(const CUtensorMap* map, uint64_t* bar, void* dst, int c0, int c1, int c2,
                                            int c3, uint64_t hint) {
  cute::SM90_TMA_LOAD_4D::copy(map, bar, hint, dst, c0, c1, c2, c3);
}
/// The same box into every CTA of `mask` in the cluster (same offsets, each CTA's own
/// barrier at `bar`'s offset counts the bytes).
__device__ __forceinline__ void tma_load_4d_multicast(const CUtensorMap* map, uint64_t* bar, void* dst, uint16_t mask,
                                                      int c0, int c1, int c2, int c3, uint64_t hint) {
  cute::SM90_TMA_LOAD_MULTICAST_4D::copy(map, bar, mask, hint, dst, c0, c1, c2, c3);
}

}  // namespace pagedmha::cuda::sm90
