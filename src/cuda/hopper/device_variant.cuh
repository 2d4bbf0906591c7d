// The attention variant on the device for the Hopper kernels: the mask (MaskVariant,
// include/pagedmha/variant.h), the logits transform (scale, soft-cap) and the sink.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/attention_args.cuh"
#include "cuda/common/online_softmax.cuh"

namespace pagedmha::cuda::sm90 {

/// The attention variant on the device: docs/semantics.md section 1 through MaskVariant
/// (visible keys) plus the logits transform and the sink. Runtime fields, and one
/// compile-time flag (as FA3's Has_softcap): kMayCap = false holds no soft-cap code, for
/// launches whose cap_log2 <= 0 (the launcher checks). Without the soft-cap's ex2 / rcp
/// and its branch in every KV tile's softmax the Hopper prefill ran 5-10% faster at
/// D = 256, 1-2% at D = 64 and 0-1% at D = 128 (H200, 2026-12-03 s11run2:
/// docs/perf-notes/prefill-sm90-schedule.md).
template <bool kMayCap = true>
struct DeviceVariant {
  const AttentionArgs& a;

  /// tanh(x) = 1 - 2 / (e^2x + 1): ex2 and rcp, no branches (tanhf's registers would
  /// spill at D = 256); absolute error a few ulp of 1, which is what c * tanh needs.
  __device__ __forceinline__ static float tanh_fast(float x) {
    return 1.0f - __fdividef(2.0f, fast_exp2_ftz(x * (2.0f * kLog2e)) + 1.0f);
  }

  /// Turns raw logits into log2 units; returns the scale left to fold into the softmax's
  /// FFMA (1 when applied here). Soft-cap: c * tanh(s * scale / c). kFold = false
  /// always applies the scale here (split-KV decode: see online_softmax.cuh on why its
  /// partials keep the product rounded before the reference is subtracted).
  template <bool kFold = true, int NS>
  __device__ __forceinline__ float transform(float (&s)[NS][4]) const {
    if constexpr (kMayCap) {
      if (a.cap_log2 > 0.0f) {
#pragma unroll
        for (int i = 0; i < NS; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[i][e] = a.cap_log2 * tanh_fast(s[i][e] * a.cap_inner);
        }
        return 1.0f;
      }
    }
    if (kFold && a.logit_scale_log2 > 0.0f) return a.logit_scale_log2;
#pragma unroll
    for (int i = 0; i < NS; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] *= a.logit_scale_log2;
    }
    return 1.0f;
  }

  /// The sink of query head h in log2 units (-inf when absent).
  __device__ __forceinline__ float sink_log2(int h) const {
    return a.sinks != nullptr ? a.sinks[h] * kLog2e : -INFINITY;
  }
};

}  // namespace pagedmha::cuda::sm90
