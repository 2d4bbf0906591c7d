// batch_decode's one dispatch point and launcher: the split policy, workspace layout and
// forced split count, then the Hopper decode (decode_sm90/) on sm_90a where it is
// switched on (PAGEDMHA_DECODE_SM90, off by default: decode_sm90/policy.h) and the call
// fits it (16-bit cache and queries, D <= 128, G * q_len <= 16, a TMA layout), else the
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
#include "cuda/decode/policy.h"

namespace pagedmha::cuda {

// Defined in decode_hd{64,128,256}.cu.
template <int D, class T, class KV>
void launch_decode(const AttentionArgs& a, int device, int sm_count, cudaStream_t stream);

#if PAGEDMHA_WITH_SM90
namespace sm90 {
// Defined in decode_sm90/decode_sm90_hd{64,128}.cu; false when the call does not fit.
template <int D, class T>
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

void batch_decode(const detail::AttentionProblem& p) {
  DeviceGuard guard(p.device.index);
  AttentionArgs a = make_attention_args(p);
  const int64_t rows = static_cast<int64_t>(p.batch) * p.q_len_per_req;
  const DecodeSplitPolicy policy = DecodeSplitPolicy::make(p.head_dim, static_cast<int>(dtype_size(p.kv.dtype)), p.num_kv_heads);
  // Work items are counted in int32 (at most batch * Hkv * G * n * max_splits).
  if (static_cast<int64_t>(p.batch) * p.num_q_heads * p.q_len_per_req * policy.max_splits > INT32_MAX) {
    throw Error("batch_decode: seq_lens: at most " +
                std::to_string(INT32_MAX / (int64_t{p.num_q_heads} * p.q_len_per_req * policy.max_splits)) +
                " requests for this shape, got " + std::to_string(p.batch));
  }
  a.split_keys = policy.split_keys;
  a.max_splits = policy.max_splits;
  a.forced_splits = std::min(p.num_splits, policy.max_splits);  // 0: from each request's length

  // The front end checked workspace_bytes >= decode_workspace_size (which has the
  // alignment slack), so the layout fits.
  const DecodeWorkspaceLayout layout(rows, p.num_q_heads, p.head_dim, policy.max_splits);
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(p.workspace) + DecodeWorkspaceLayout::kAlign - 1) &
                                       ~uintptr_t{DecodeWorkspaceLayout::kAlign - 1});
  a.ws_o = reinterpret_cast<float*>(base + layout.o);
  a.ws_ml = reinterpret_cast<float2*>(base + layout.ml);

  const int sm_count = multiprocessor_count(p.device.index);
  const auto stream = static_cast<cudaStream_t>(p.stream);
#if PAGEDMHA_WITH_SM90
  if (kernel_path(p.device.index) == KernelPath::sm90) {
    bool done = false;
    dispatch_attention("batch_decode", p, [&](auto d, auto t, auto kv) {
      using T = typename decltype(t)::type;
      if constexpr (decltype(d)::value <= 128 && std::is_same<T, typename decltype(kv)::type>::value) {
        done = sm90::run_decode<decltype(d)::value, T>(p, a, sm_count, stream);
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
