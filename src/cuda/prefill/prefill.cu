// batch_prefill launcher: grid from max_q_len (host bound), heads and batch.
#include <cuda_runtime.h>

#include "cuda/common/attention_args.cuh"
#include "cuda/common/dispatch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/cuda_ops.h"

namespace pagedmha::cuda {

// Defined in prefill_hd{64,128,256}.cu.
template <int D, class T, class KV>
void launch_prefill(const AttentionArgs& a, int max_q_len, cudaStream_t stream);

void batch_prefill(const detail::AttentionProblem& p) {
  if (p.batch == 0 || p.max_q_len == 0) return;
  DeviceGuard guard(p.device.index);
  const AttentionArgs a = make_attention_args(p);
  const auto stream = static_cast<cudaStream_t>(p.stream);
  dispatch_attention("batch_prefill", p, [&](auto d, auto t, auto kv) {
    launch_prefill<decltype(d)::value, typename decltype(t)::type, typename decltype(kv)::type>(a, p.max_q_len,
                                                                                              stream);
  });
}

}  // namespace pagedmha::cuda
