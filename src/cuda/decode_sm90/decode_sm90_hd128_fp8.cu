// Hopper decode instantiations for head dim 128 and fp8 e4m3 caches (one file per head dim
// and cache dtype: parallel compilation).
#include "cuda/decode_sm90/launch.cuh"

namespace pagedmha::cuda::sm90 {

template bool run_decode<128, __nv_bfloat16, fp8_e4m3>(const detail::AttentionProblem&, const AttentionArgs&, int,
                                                      cudaStream_t);
template bool run_decode<128, __half, fp8_e4m3>(const detail::AttentionProblem&, const AttentionArgs&, int, cudaStream_t);

}  // namespace pagedmha::cuda::sm90
