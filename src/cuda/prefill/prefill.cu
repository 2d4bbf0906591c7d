// batch_prefill's one dispatch point: the Hopper kernel (prefill_sm90/) on sm_90a, the
// portable mma.sync kernel
// (prefill_kernel.cuh, grid from max_q_len x heads x batch) elsewhere or when
// PAGEDMHA_KERNELS=portable.
#include <cuda_runtime.h>

#include "cuda/common/arch.h"
#include "cuda/common/attention_args.cuh"
#include "cuda/common/dispatch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/prefill_sm90/policy.h"

namespace pagedmha::cuda {

// Defined in prefill_hd{64,128,256}.cu.
template <int D, class T, class KV>
void launch_prefill(const AttentionArgs& a, int max_q_len, cudaStream_t stream);

#if PAGEDMHA_WITH_SM90
namespace sm90 {
// Defined in prefill_sm90/prefill_sm90_hd{64,128,256}.cu.
template <int D, class T, class KV>
void run_prefill(const detail::AttentionProblem& prob, const AttentionArgs& a, int num_sms, cudaStream_t stream);
}  // namespace sm90
#endif

std::size_t prefill_workspace_size(int64_t batch, int64_t total_q) {
  return static_cast<std::size_t>(sm90::PlanLayout::bytes(batch, total_q));
}

void batch_prefill(const detail::AttentionProblem& p) {
  if (p.batch == 0 || p.max_q_len == 0) return;
  DeviceGuard guard(p.device.index);
  const AttentionArgs a = make_attention_args(p);
  const auto stream = static_cast<cudaStream_t>(p.stream);
#if PAGEDMHA_WITH_SM90
  if (kernel_path(p.device.index) == KernelPath::sm90) {
    const int sms = multiprocessor_count(p.device.index);
    dispatch_attention("batch_prefill", p, [&](auto d, auto t, auto kv) {
      sm90::run_prefill<decltype(d)::value, typename decltype(t)::type, typename decltype(kv)::type>(p, a, sms, stream);
    });
    return;
  }
#endif
  dispatch_attention("batch_prefill", p, [&](auto d, auto t, auto kv) {
    launch_prefill<decltype(d)::value, typename decltype(t)::type, typename decltype(kv)::type>(a, p.max_q_len,
                                                                                              stream);
  });
}

}  // namespace pagedmha::cuda
