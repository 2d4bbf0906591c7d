// Decode instantiations for head dim 64 (one file per head dim: parallel compilation).
#include "cuda/decode/decode_kernel.cuh"

namespace pagedmha::cuda {

template void launch_decode<64, __nv_bfloat16, __nv_bfloat16>(const AttentionArgs&, int, int, cudaStream_t);
template void launch_decode<64, __nv_bfloat16, fp8_e4m3>(const AttentionArgs&, int, int, cudaStream_t);
template void launch_decode<64, __half, __half>(const AttentionArgs&, int, int, cudaStream_t);
template void launch_decode<64, __half, fp8_e4m3>(const AttentionArgs&, int, int, cudaStream_t);
// The merges the Hopper decode launches too (decode_sm90/launch.cuh declares them extern).
template void launch_decode_merge<64, __nv_bfloat16>(const AttentionArgs&, int, int, cudaStream_t);
template void launch_decode_merge<64, __half>(const AttentionArgs&, int, int, cudaStream_t);

}  // namespace pagedmha::cuda
