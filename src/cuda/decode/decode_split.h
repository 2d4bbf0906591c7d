// Split-KV constants shared by the decode launcher (host) and kernels (device).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pagedmha::cuda {

/// Keys per split when the count is chosen from the length, and the cap on splits per
/// request (also the workspace bound). 1 x 32k with 8 KV heads gives 32 x 8 = 256 work
/// items (about 2 CTAs per SM on 132 SMs); at large batch the partials add
/// (D + 2) * 4 bytes per query head per 1024 keys read (about 1% of the KV bytes).
constexpr int kKeysPerSplit = 1024;
constexpr int kMaxSplits = 32;  // == warp size: the merge reads one split per lane

/// Workspace layout of batch_decode (offsets from the 16-byte aligned base): the work
/// prefix int32 [batch + 1], then fp32 O partials [rows * Hq, kMaxSplits, D], then
/// float2 (m, l) [rows * Hq, kMaxSplits].
struct DecodeWorkspaceLayout {
  static constexpr std::size_t kAlign = 16;
  std::size_t prefix = 0, o = 0, ml = 0, total = 0;

  DecodeWorkspaceLayout(int64_t batch, int64_t rows, int num_q_heads, int head_dim) {
    auto up = [](std::size_t x) { return (x + kAlign - 1) / kAlign * kAlign; };
    const std::size_t slots = static_cast<std::size_t>(rows) * num_q_heads * kMaxSplits;
    prefix = 0;
    o = up(static_cast<std::size_t>(batch + 1) * sizeof(int32_t));
    ml = o + slots * head_dim * sizeof(float);
    total = ml + slots * 2 * sizeof(float);
  }
};

}  // namespace pagedmha::cuda
