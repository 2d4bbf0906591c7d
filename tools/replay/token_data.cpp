#include "replay/token_data.h"

#include <string>

#include "pagedmha/error.h"
#include "pagedmha/numeric.h"

namespace pagedmha::tools {

void fill_tokens_host(const TensorView& out, const TokenRef* tokens, int64_t num_tokens,
                      uint64_t seed, int layer, TokenTensor tensor, int head_offset) {
  if (!out.device.is_cpu() || out.ndim != 3 || !out.is_contiguous() || out.size(0) < num_tokens)
    throw_invalid_argument("fill_tokens_host", "out", "a contiguous host [>= T, H, D] tensor",
                           out.shape_str() + " on " + out.device.str());
  const int64_t row = out.size(1) * out.size(2), first = int64_t{head_offset} * out.size(2);
  const DType dt = out.dtype;
  if (dt != DType::bf16 && dt != DType::fp16 && dt != DType::fp32)
    throw_invalid_argument("fill_tokens_host", "out", "bf16, fp16 or fp32", dtype_name(dt));
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const uint64_t key = token_key(seed, tokens[t].stream, tokens[t].position, layer, tensor);
    for (int64_t i = 0; i < row; ++i) {
      const float x = token_value(key, static_cast<uint32_t>(first + i), tensor);
      const int64_t at = t * row + i;
      if (dt == DType::bf16) out.ptr<uint16_t>()[at] = float_to_bf16(x);
      else if (dt == DType::fp16) out.ptr<uint16_t>()[at] = float_to_fp16(x);
      else out.ptr<float>()[at] = x;
    }
  }
}

#if !defined(PAGEDMHA_WITH_CUDA)
void fill_tokens_cuda(const TensorView&, const TokenRef*, int64_t, uint64_t, int, TokenTensor, Stream, int) {
  throw Error("fill_tokens_cuda: this build has no CUDA support");
}
void fill_tokens_layers_cuda(const TensorView&, const TokenRef*, int64_t, uint64_t, TokenTensor, Stream, int) {
  throw Error("fill_tokens_layers_cuda: this build has no CUDA support");
}
#endif

}  // namespace pagedmha::tools
