// Hopper prefill instantiations for head dim 64 (one file per head dim: parallel compilation).
#include "cuda/prefill_sm90/launch.cuh"

namespace pagedmha::cuda::sm90 {

template void run_prefill<64, __nv_bfloat16, __nv_bfloat16>(const detail::AttentionProblem&, const AttentionArgs&, int,
                                                            cudaStream_t);
template void run_prefill<64, __nv_bfloat16, fp8_e4m3>(const detail::AttentionProblem&, const AttentionArgs&, int,
                                                      cudaStream_t);
template void run_prefill<64, __half, __half>(const detail::AttentionProblem&, const AttentionArgs&, int, cudaStream_t);
template void run_prefill<64, __half, fp8_e4m3>(const detail::AttentionProblem&, const AttentionArgs&, int,
                                               cudaStream_t);

}  // namespace pagedmha::cuda::sm90
