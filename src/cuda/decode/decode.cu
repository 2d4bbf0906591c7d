// batch_decode launcher and its heuristics: split-KV extent from the batch, the KV heads
// and the SM count (never from live lengths), workspace layout.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/attention_args.cuh"
#include "cuda/common/dispatch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/cuda_ops.h"

namespace pagedmha::cuda {

// Defined in decode_hd{64,128,256}.cu.
template <int D, class T, class KV>
void launch_decode(const AttentionArgs& a, cudaStream_t stream);

namespace {

constexpr int kMaxSplits = 64;
constexpr std::size_t kWorkspaceAlign = 16;

// Enough CTAs for about two per SM: ceil(2 * SMs / (batch * Hkv)), in [1, 64].
int auto_max_splits(int sm_count, int64_t batch, int num_kv_heads) {
  const int64_t ctas = std::max<int64_t>(batch * num_kv_heads, 1);
  const int64_t s = (2 * static_cast<int64_t>(sm_count) + ctas - 1) / ctas;
  return static_cast<int>(std::clamp<int64_t>(s, 1, kMaxSplits));
}

// Workspace per split: fp32 o [rows * Hq, D] and lse [rows * Hq].
std::size_t bytes_per_split(int64_t rows, int num_q_heads, int head_dim) {
  return static_cast<std::size_t>(rows) * num_q_heads * (head_dim + 1) * sizeof(float);
}

}  // namespace

std::size_t decode_workspace_size(int device_index, int64_t batch, int q_len_per_req, int num_q_heads,
                                  int num_kv_heads, int head_dim) {
  if (batch <= 0) return 0;
  const int splits = auto_max_splits(multiprocessor_count(device_index), batch, num_kv_heads);
  if (splits <= 1) return 0;
  return kWorkspaceAlign + splits * bytes_per_split(batch * q_len_per_req, num_q_heads, head_dim);
}

void batch_decode(const detail::AttentionProblem& p) {
  DeviceGuard guard(p.device.index);
  AttentionArgs a = make_attention_args(p);
  const int64_t rows = static_cast<int64_t>(p.batch) * p.q_len_per_req;

  // The grid's split extent: the auto bound (or the forced count), capped by what the
  // given workspace holds. Depends only on shapes, the device and the workspace size.
  const std::size_t per_split = bytes_per_split(rows, p.num_q_heads, p.head_dim);
  int64_t capacity = 1;
  if (p.workspace != nullptr && p.workspace_bytes > kWorkspaceAlign && per_split > 0) {
    capacity = static_cast<int64_t>((p.workspace_bytes - kWorkspaceAlign) / per_split);
  }
  const int want = p.num_splits > 0 ? p.num_splits
                                    : auto_max_splits(multiprocessor_count(p.device.index), p.batch, p.num_kv_heads);
  a.max_splits = static_cast<int>(std::clamp<int64_t>(std::min<int64_t>(want, capacity), 1, kMaxSplits));
  a.forced_splits = p.num_splits > 0 ? a.max_splits : 0;
  if (a.max_splits > 1) {
    const uintptr_t base = (reinterpret_cast<uintptr_t>(p.workspace) + kWorkspaceAlign - 1) & ~(kWorkspaceAlign - 1);
    a.ws_o = reinterpret_cast<float*>(base);
    a.ws_lse = a.ws_o + rows * p.num_q_heads * a.max_splits * p.head_dim;
  }

  const auto stream = static_cast<cudaStream_t>(p.stream);
  dispatch_attention("batch_decode", p, [&](auto d, auto t, auto kv) {
    launch_decode<decltype(d)::value, typename decltype(t)::type, typename decltype(kv)::type>(a, stream);
  });
}

}  // namespace pagedmha::cuda
