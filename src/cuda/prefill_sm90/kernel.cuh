// The Hopper prefill / extend kernel: a persistent grid (one CTA per SM, clusters of two
// when they can share K / V) walking the plan's pairs of query tiles longest first; per CTA one
// producer warpgroup (two for fp8 caches up to D = 128: producer.cuh) and two or three consumer
// warpgroups (consumer.cuh) with
// setmaxnreg moving registers to the consumers. Shapes and heuristics: policy.h.
#pragma once

#include <cuda_runtime.h>

#include <cute/arch/cluster_sm90.hpp>

#include "cuda/common/check.cuh"
#include "cuda/hopper/consumer.cuh"
#include "cuda/hopper/producer.cuh"
#include "cuda/prefill_sm90/policy.h"

namespace pagedmha::cuda::sm90 {

/// Variant: DeviceVariant<true>, or <false> where no soft-cap is set.
template <class Pol, class T, class KV, class Variant>
__global__ void __launch_bounds__(Pol::kThreads, 1) prefill_kernel(const __grid_constant__ Sm90Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem_raw[];
  const SmemLayout<Pol> sm(smem_raw);
  const int tid = threadIdx.x;
  if (tid == 0) {
    // TMA: Producer::kTmaFullArrivals; else every thread of the producer team (cp.async,
    // or the fp8 conversion).
    const uint32_t kv_arrivals =
        Pol::kKvTma && !Pol::kFp8Kv ? Producer<Pol, T, KV>::kTmaFullArrivals : Pol::kRoleThreads;
    // Every consumer warp of every CTA the stages are multicast to.
    const uint32_t releases = Pol::kConsumerWarps * p.cluster;
    for (int s = 0; s < Pol::kQSlots; ++s) {
      Barrier::init(sm.q_full(s), p.tma_q && !p.q_convert ? 1 : Pol::kRoleThreads);
      Barrier::init(sm.q_land(s), 1);
      Barrier::init(sm.q_empty(s), Pol::kConsumerWarps);
    }
    constexpr int kRingMax = Pol::kKStages > Pol::kVStages ? Pol::kKStages : Pol::kVStages;
    for (int s = 0; s < kRingMax; ++s) {
      if (s < Pol::kKStages) Barrier::init(sm.k_full(s), kv_arrivals);
      if (s < Pol::kVStages) Barrier::init(sm.v_full(s), kv_arrivals);
      if (s < Pol::kKStages) Barrier::init(sm.k_empty(s), releases);
      if (s < Pol::kVStages) Barrier::init(sm.v_empty(s), releases);
    }
    // fp8 tiles by TMA: lane 0 of each warp of a producer team (each issues its share of
    // the boxes).
    for (int r = 0; r < SmemLayout<Pol>::kRawBars; ++r) Barrier::init(sm.raw_full(r), Producer<Pol, T, KV>::kTmaWarps);
    cutlass::arch::fence_barrier_init();
  }
  // V rows a tile does not load meet probability 0: they must be finite, so the stages
  // start at zero (afterwards they only ever hold loaded rows).
  uint4* v = reinterpret_cast<uint4*>(sm.v(0));
  for (int i = tid; i < Pol::kVStages * Pol::kTileBytes / 16; i += Pol::kThreads) v[i] = make_uint4(0, 0, 0, 0);
  fence_async_smem();
  // The peer's barriers exist before anything is multicast to it or arrives on them.
  if (p.cluster > 1) {
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  } else {
    __syncthreads();
  }
  if (tid < Pol::kProducerThreads) {
    cutlass::arch::warpgroup_reg_dealloc<Pol::kProducerRegs>();
    if constexpr (Pol::kProducerRoles == 1) {
      Producer<Pol, T, KV>{p, sm, tid, 0}.run();
    } else {
      Producer<Pol, T, KV>{p, sm, tid % Pol::kRoleThreads, tid / Pol::kRoleThreads}.run();
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Pol::kConsumerRegs>();
    Consumer<Pol, T, Variant>{p, sm, warpgroup_index() - Pol::kProducerWarpgroups, tid % 128}.run();
  }
  // No CTA leaves while its peer may still arrive on its barriers.
  if (p.cluster > 1) {
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  }
#endif
}

/// Persistent launch: `grid` CTAs (a multiple of `cluster`), clusters of `cluster`.
template <class Pol, class T, class KV, class Variant>
void launch_prefill_kernel(const Sm90Params& p, int grid, cudaStream_t stream) {
  auto* kernel = prefill_kernel<Pol, T, KV, Variant>;
  PAGEDMHA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Pol::kSmemBytes));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(Pol::kThreads);
  cfg.dynamicSmemBytes = Pol::kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(p.cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  PAGEDMHA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p));
}

/// CTAs of the persistent grid: one per SM, or, in clusters of two, as many as can be
/// resident at once (clusters live inside one GPC; cudaOccupancyMaxActiveClusters).
template <class Pol, class T, class KV, class Variant>
int persistent_grid(int cluster, int num_sms) {
  if (cluster == 1) return num_sms;
  auto* kernel = prefill_kernel<Pol, T, KV, Variant>;
  PAGEDMHA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Pol::kSmemBytes));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(num_sms));
  cfg.blockDim = dim3(Pol::kThreads);
  cfg.dynamicSmemBytes = Pol::kSmemBytes;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  PAGEDMHA_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
  return clusters > 0 ? clusters * cluster : 0;
}

}  // namespace pagedmha::cuda::sm90
