// Deterministic token data: every element of a token's q, k and v is a pure function of
// (seed, request, position, layer, head, dim), so any step can be recomputed anywhere
// (host reference, GPU generator) with identical bits.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PAGEDMHA_HD __host__ __device__ __forceinline__
#else
#define PAGEDMHA_HD inline
#endif

namespace pagedmha::tools {

enum class TokenTensor : uint32_t { q = 1, k = 2, v = 3 };

/// splitmix64 finaliser: a cheap, well-mixed 64-bit hash.
PAGEDMHA_HD uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

PAGEDMHA_HD uint64_t hash_words(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0, uint64_t e = 0) {
  return mix64(mix64(mix64(mix64(mix64(a) ^ b) ^ c) ^ d) ^ e);
}

/// Uniform in [0, 1) with 24 random bits (exact in fp32).
PAGEDMHA_HD float uniform01(uint64_t h) { return static_cast<float>(h >> 40) * (1.0f / 16777216.0f); }

/// Key of one token's tensor in one layer (stream: see TokenRef).
PAGEDMHA_HD uint64_t token_key(uint64_t seed, uint64_t stream, int position, int layer, TokenTensor t) {
  return hash_words(seed, stream, static_cast<uint64_t>(position),
                    static_cast<uint64_t>(layer), static_cast<uint64_t>(t));
}

/// Element `index` (head * D + dim) of a token's tensor: uniform in [-a, a) with a = 2
/// for queries (sharper softmax than uniform keys alone give) and 1 for k and v.
PAGEDMHA_HD float token_value(uint64_t key, uint32_t index, TokenTensor t) {
  const float u = uniform01(mix64(key ^ (static_cast<uint64_t>(index) * 0xD1B54A32D192ED03ull)));
  const float amplitude = t == TokenTensor::q ? 2.0f : 1.0f;
  return (2.0f * u - 1.0f) * amplitude;
}

/// Sink logit of query head h in layer `layer`: uniform in [-1, 3).
PAGEDMHA_HD float sink_value(uint64_t seed, int layer, int head) {
  return uniform01(hash_words(seed, 0x5171ull, static_cast<uint64_t>(layer), static_cast<uint64_t>(head))) * 4.0f - 1.0f;
}

}  // namespace pagedmha::tools
