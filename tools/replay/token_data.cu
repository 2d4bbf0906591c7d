// GPU generator of the replay's token data; bit-identical to fill_tokens_host.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "pagedmha/error.h"
#include "replay/cuda_check.h"
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

// Block (t, l): token t of layer first_layer + l, whose rows start layer_stride elements apart;
// element i of a row is the token's element first + i (a rank's slice of the heads).
template <class T>
__global__ void fill_tokens_kernel(T* out, const TokenRef* tokens, int64_t num_tokens, int64_t row, int64_t first,
                                   int64_t layer_stride, uint64_t seed, int first_layer, TokenTensor tensor) {
  const int64_t t = blockIdx.x;
  if (t >= num_tokens) return;
  const int layer = first_layer + static_cast<int>(blockIdx.y);
  const uint64_t key = token_key(seed, tokens[t].stream, tokens[t].position, layer, tensor);
  T* dst = out + blockIdx.y * layer_stride + t * row;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x)
    dst[i] = convert<T>(token_value(key, static_cast<uint32_t>(first + i), tensor));
}

void launch_fill(const TensorView& out, const TokenRef* tokens, int64_t num_tokens, int64_t row, int64_t first,
                 int layers, int64_t layer_stride, uint64_t seed, int first_layer, TokenTensor tensor, Stream stream) {
  if (num_tokens == 0 || layers == 0) return;
  auto s = static_cast<cudaStream_t>(stream.handle);
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(layers)), block(256);
  switch (out.dtype) {
    case DType::bf16:
      fill_tokens_kernel<<<grid, block, 0, s>>>(out.ptr<__nv_bfloat16>(), tokens, num_tokens, row, first, layer_stride, seed,
                                                first_layer, tensor);
      break;
    case DType::fp16:
      fill_tokens_kernel<<<grid, block, 0, s>>>(out.ptr<__half>(), tokens, num_tokens, row, first, layer_stride, seed,
                                                first_layer, tensor);
      break;
    case DType::fp32:
      fill_tokens_kernel<<<grid, block, 0, s>>>(out.ptr<float>(), tokens, num_tokens, row, first, layer_stride, seed,
                                                first_layer, tensor);
      break;
    default:
      throw_invalid_argument("fill_tokens_cuda", "out", "bf16, fp16 or fp32", dtype_name(out.dtype));
  }
  check_cuda(cudaGetLastError(), "fill_tokens_cuda", "launch failed");
}

}  // namespace

void fill_tokens_cuda(const TensorView& out, const TokenRef* tokens, int64_t num_tokens,
                      uint64_t seed, int layer, TokenTensor tensor, Stream stream, int head_offset) {
  launch_fill(out, tokens, num_tokens, out.size(1) * out.size(2), int64_t{head_offset} * out.size(2), 1, 0, seed, layer,
              tensor, stream);
}

void fill_tokens_layers_cuda(const TensorView& out, const TokenRef* tokens, int64_t num_tokens,
                             uint64_t seed, TokenTensor tensor, Stream stream, int head_offset) {
  if (out.ndim != 4 || !out.is_contiguous() || out.size(1) < num_tokens)
    throw_invalid_argument("fill_tokens_layers_cuda", "out", "a contiguous [layers, >= T, H, D] tensor", out.shape_str());
  launch_fill(out, tokens, num_tokens, out.size(2) * out.size(3), int64_t{head_offset} * out.size(3),
              static_cast<int>(out.size(0)), out.stride(0), seed, 0, tensor, stream);
}

}  // namespace pagedmha::tools
