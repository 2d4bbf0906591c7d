// Filling q/k/v tensors of a step's tokens from the deterministic generator.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedmha/tensor.h"
#include "replay/datagen.h"

namespace pagedmha::tools {

/// A token's data source: the stream its values come from and its position. Tokens of a
/// shared prompt prefix (equal leading hash ids) share one stream, so every request that
/// shares the prefix sees the same K/V, as it would in a real engine.
struct TokenRef {
  uint64_t stream = 0;
  int32_t position = 0;
  int32_t unused = 0;
};

/// Writes token_value(...) of every token into the contiguous [T, heads, D] view `out`
/// (bf16, fp16 or fp32, on the host). OpenMP over tokens. `head_offset`: out's head h is
/// the model's head head_offset + h (a tensor-parallel rank's slice of the heads).
void fill_tokens_host(const TensorView& out, const TokenRef* tokens, int64_t num_tokens,
                      uint64_t seed, int layer, TokenTensor tensor, int head_offset = 0);

/// Same on a CUDA device: `tokens` is a device array. Only in CUDA builds.
void fill_tokens_cuda(const TensorView& out, const TokenRef* tokens, int64_t num_tokens,
                      uint64_t seed, int layer, TokenTensor tensor, Stream stream, int head_offset = 0);

/// Every layer in one launch: `out` is a contiguous [layers, >= T, heads, D] device tensor,
/// layer l's rows filled as fill_tokens_cuda(out[l], ..., layer l, ...). Only in CUDA builds.
void fill_tokens_layers_cuda(const TensorView& out, const TokenRef* tokens, int64_t num_tokens,
                             uint64_t seed, TokenTensor tensor, Stream stream, int head_offset = 0);

}  // namespace pagedmha::tools
