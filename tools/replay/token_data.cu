// GPU generator of the replay's token data; bit-identical to fill_tokens_host.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "pagedmha/error.h"
#include "replay/token_data.h"

namespace pagedmha::tools {
namespace {

template <class T>
__device__ __forceinline__ T convert(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 convert<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half convert<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ float convert<float>(float x) { return x; }

template <class T>
__global__ void fill_tokens_kernel(T* out, const TokenRef* tokens, int64_t num_tokens, int64_t row,
                                   uint64_t seed, int layer, TokenTensor tensor) {
  const int64_t t = blockIdx.x;
  if (t >= num_tokens) return;
  const uint64_t key = token_key(seed, tokens[t].stream, tokens[t].position, layer, tensor);
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x)
    out[t * row + i] = convert<T>(token_value(key, static_cast<uint32_t>(i), tensor));
}

}  // namespace

void fill_tokens_cuda(const TensorView& out, const TokenRef* tokens, int64_t num_tokens,
                      uint64_t seed, int layer, TokenTensor tensor, Stream stream) {
  if (num_tokens == 0) return;
  const int64_t row = out.size(1) * out.size(2);
  auto s = static_cast<cudaStream_t>(stream.handle);
  const dim3 grid(static_cast<unsigned>(num_tokens)), block(256);
  switch (out.dtype) {
    case DType::bf16:
      fill_tokens_kernel<<<grid, block, 0, s>>>(out.ptr<__nv_bfloat16>(), tokens, num_tokens, row, seed, layer, tensor);
      break;
    case DType::fp16:
      fill_tokens_kernel<<<grid, block, 0, s>>>(out.ptr<__half>(), tokens, num_tokens, row, seed, layer, tensor);
      break;
    case DType::fp32:
      fill_tokens_kernel<<<grid, block, 0, s>>>(out.ptr<float>(), tokens, num_tokens, row, seed, layer, tensor);
      break;
    default:
      throw_invalid_argument("fill_tokens_cuda", "out", "bf16, fp16 or fp32", dtype_name(out.dtype));
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw Error(std::string("fill_tokens_cuda: launch failed: ") + cudaGetErrorString(err));
}

}  // namespace pagedmha::tools
