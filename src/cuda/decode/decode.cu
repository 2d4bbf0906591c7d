// batch_decode's one dispatch point and launcher: the split policy, workspace layout and
// forced split count, then the Hopper decode (decode_sm90/) on sm_90a where it is
// switched on (PAGEDMHA_DECODE_SM90 and, for fp8 caches, PAGEDMHA_DECODE_SM90_FP8: on
// by default, decode_sm90/policy.h) and the call fits it (16-bit queries, D <= 128,
// G * q_len <= 16, a TMA layout), else the
// portable mma.sync decode (decode_kernel.cuh). The split count of each request is
// decided on the device from its own length.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/common/arch.h"
#include "cuda/common/attention_args.cuh"
#include "cuda/common/dispatch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/decode/decode_args.cuh"
#include "cuda/decode/policy.h"
#include "cuda/decode_sm90/policy.h"

namespace pagedmha::cuda {

// Defined in decode_hd{64,128,256}.cu.
template <int D, class T, class KV>
void launch_decode(const AttentionArgs& a, int device, int sm_count, cudaStream_t stream);

#if PAGEDMHA_WITH_SM90
namespace sm90 {
// Defined in decode_sm90/decode_sm90_hd{64,128}{,_fp8}.cu; false when the call does not fit.
template <int D, class T, class KV>
bool run_decode(const detail::AttentionProblem& prob, const AttentionArgs& a, int sm_count, cudaStream_t stream);
}  // namespace sm90
#endif

std::size_t decode_workspace_size(int /*device_index*/, int64_t batch, int q_len_per_req, int num_q_heads,
                                  int num_kv_heads, int head_dim) {
  if (batch <= 0) return 0;
  // The cap does not depend on the KV dtype, so one size serves bf16 and fp8 caches.
  const int cap = DecodeSplitPolicy::make(head_dim, 2, num_kv_heads).max_splits;
  return DecodeWorkspaceLayout::kAlign + DecodeWorkspaceLayout(batch * q_len_per_req, num_q_heads, head_dim, cap).total;
}

bool decode_fp8_qk_in_fp16(int device_index, int head_dim) {
#if PAGEDMHA_WITH_SM90
  if (!sm90::kDecodeSm90 || !sm90::kDecodeSm90Fp8 || kernel_path(device_index) != KernelPath::sm90) return false;
  return head_dim == 64    ? sm90::DecodePolicy<64, true>::kQkF16
         : head_dim == 128 ? sm90::DecodePolicy<128, true>::kQkF16
                           : false;
#else
  (void)device_index;
  (void)head_dim;
  return false;
#endif
}

void batch_decode(const detail::AttentionProblem& p) {
  DeviceGuard guard(p.device.index);
  const AttentionArgs a = decode_args(p);

  const int sm_count = multiprocessor_count(p.device.index);
  const auto stream = static_cast<cudaStream_t>(p.stream);
#if PAGEDMHA_WITH_SM90
  if (sm90::kDecodeSm90 && kernel_path(p.device.index) == KernelPath::sm90) {
    bool done = false;
    dispatch_attention("batch_decode", p, [&](auto d, auto t, auto kv) {
      using T = typename decltype(t)::type;
      using KV = typename decltype(kv)::type;
      if constexpr (decltype(d)::value <= 128 && (std::is_same<T, KV>::value || sm90::kDecodeSm90Fp8)) {
        done = sm90::run_decode<decltype(d)::value, T, KV>(p, a, sm_count, stream);
      }
    });
    if (done) return;
  }
#endif
  dispatch_attention("batch_decode", p, [&](auto d, auto t, auto kv) {
    launch_decode<decltype(d)::value, typename decltype(t)::type, typename decltype(kv)::type>(a, p.device.index,
                                                                                             sm_count, stream);
  });
}

}  // namespace pagedmha::cuda
