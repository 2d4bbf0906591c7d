// The Hopper prefill / extend kernel: a persistent grid (one CTA per SM) walking the
// plan's query tiles longest first; per CTA one producer warpgroup (producer.cuh) and
// two consumer warpgroups (consumer.cuh) with setmaxnreg moving registers to the
// consumers. Shapes and heuristics: policy.h.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/check.cuh"
#include "cuda/hopper/consumer.cuh"
#include "cuda/hopper/producer.cuh"
#include "cuda/prefill_sm90/policy.h"

namespace pagedmha::cuda::sm90 {

template <class Pol, class T, class KV>
__global__ void __launch_bounds__(Pol::kThreads, 1) prefill_kernel(const __grid_constant__ Sm90Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem_raw[];
  const SmemLayout<Pol> sm(smem_raw);
  const int tid = threadIdx.x;
  if (tid == 0) {
    const uint32_t kv_arrivals = p.tma_kv ? 1 : 128;  // one TMA lane, or every producer thread
    Barrier::init(sm.q_full(), p.tma_q ? 1 : 128);
    Barrier::init(sm.q_empty(), kConsumerWarps);
    for (int s = 0; s < Pol::kStages; ++s) {
      Barrier::init(sm.k_full(s), kv_arrivals);
      Barrier::init(sm.v_full(s), kv_arrivals);
      Barrier::init(sm.k_empty(s), kConsumerWarps);
      Barrier::init(sm.v_empty(s), kConsumerWarps);
    }
    cutlass::arch::fence_barrier_init();
  }
  // V rows a tile does not load meet probability 0: they must be finite, so the stages
  // start at zero (afterwards they only ever hold loaded rows).
  uint4* v = reinterpret_cast<uint4*>(sm.v(0));
  for (int i = tid; i < Pol::kStages * Pol::kTileBytes / 16; i += Pol::kThreads) v[i] = make_uint4(0, 0, 0, 0);
  fence_async_smem();
  __syncthreads();
  if (tid < 128) {
    cutlass::arch::warpgroup_reg_dealloc<Pol::kProducerRegs>();
    // With TMA for everything only warp 0 has work.
    if (p.tma_q && p.tma_kv && tid >= 32) return;
    Producer<Pol, T, KV>{p, sm, tid}.run();
  } else {
    cutlass::arch::warpgroup_reg_alloc<Pol::kConsumerRegs>();
    Consumer<Pol, T, DeviceVariant>{p, sm, tid / 128 - 1, tid % 128}.run();
  }
#endif
}

template <class Pol, class T, class KV>
void launch_prefill_kernel(const Sm90Params& p, int grid, cudaStream_t stream) {
  auto* kernel = prefill_kernel<Pol, T, KV>;
  PAGEDMHA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Pol::kSmemBytes));
  kernel<<<grid, Pol::kThreads, Pol::kSmemBytes, stream>>>(p);
  PAGEDMHA_CUDA_CHECK_LAUNCH();
}

}  // namespace pagedmha::cuda::sm90
