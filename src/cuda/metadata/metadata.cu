// The small metadata helpers (docs/semantics.md sections 3 and 6): prefix sums of lengths,
// the speculative-verify clamp and the write slots of decode / verify / extend steps.
// All graph-safe: grids depend only on host sizes, lengths are read on the device,
// nothing is allocated or copied to the host.
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/elementwise.cuh"
#include "cuda/cuda_ops.h"

namespace pagedmha::cuda {
namespace {

constexpr int kThreads = 256;

// slot(r, pos) = page_table[r, pos / P] * P + pos % P. A column beyond the table (only
// for lengths that contradict the table) maps to the dummy page 0, never out of bounds.
__device__ __forceinline__ int32_t slot_of(const detail::Int32Matrix& table, int64_t r, int32_t pos,
                                           int page_size) {
  const int32_t col = pos / page_size;
  const int32_t page = col < table.cols ? table.data[r * table.row_stride + col] : 0;
  return page * page_size + (pos - col * page_size);
}

// One CTA scans any n in tiles of kThreads * kItems, carrying the running total.
// Engine batch sizes (<= a few thousand) take one or two tiles.
__global__ void __launch_bounds__(kThreads) cumsum_kernel(const int32_t* __restrict__ lengths, int64_t n,
                                                          int32_t* __restrict__ out) {
  constexpr int kItems = 4;
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  if (threadIdx.x == 0) out[0] = 0;
  int32_t carry = 0;
  for (int64_t base = 0; base < n; base += kThreads * kItems) {
    const int64_t first = base + static_cast<int64_t>(threadIdx.x) * kItems;
    int32_t v[kItems];
    int32_t thread_total = 0;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      v[i] = first + i < n ? lengths[first + i] : 0;
      thread_total += v[i];
    }
    int32_t prefix, tile_total;
    Scan(temp).ExclusiveSum(thread_total, prefix, tile_total);
    int32_t running = carry + prefix;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      running += v[i];
      if (first + i < n) out[first + i + 1] = running;
    }
    carry += tile_total;
    __syncthreads();  // temp is reused by the next tile
  }
}

// out[i * repeat + j] = min(max(in[i], min_len), max_len); i indexes the output.
__global__ void __launch_bounds__(kThreads) clamp_kernel(const int32_t* in, int64_t n_out, int32_t min_len,
                                                         int32_t max_len, int repeat, int32_t* out) {
  // No __restrict__: in-place (in == out) is allowed when repeat == 1.
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n_out;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    out[i] = min(max(in[i / repeat], min_len), max_len);
  }
}

// out[r * N + j] = slot(r, max(seq_lens[r] - N + j, 0)).
__global__ void __launch_bounds__(kThreads) decode_write_slots_kernel(const detail::Int32Matrix table,
                                                                      const int32_t* __restrict__ seq_lens,
                                                                      int64_t bs, int q_len_per_req,
                                                                      int page_size, int32_t* __restrict__ out) {
  const int64_t total = bs * q_len_per_req;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = i / q_len_per_req;
    const int32_t j = static_cast<int32_t>(i - r * q_len_per_req);
    const int32_t pos = max(seq_lens[r] - q_len_per_req + j, 0);
    out[i] = slot_of(table, r, pos, page_size);
  }
}

// One CTA per request: out[cu_seqlens_q[r] + i] = slot(r, prefix_lens[r] + i).
__global__ void __launch_bounds__(kThreads) extend_write_slots_kernel(const detail::Int32Matrix table,
                                                                      const int32_t* __restrict__ prefix_lens,
                                                                      const int32_t* __restrict__ cu_seqlens_q,
                                                                      int page_size, int32_t* __restrict__ out) {
  const int64_t r = blockIdx.x;
  const int32_t begin = cu_seqlens_q[r];
  const int32_t len = cu_seqlens_q[r + 1] - begin;
  const int32_t prefix = prefix_lens[r];
  for (int32_t i = threadIdx.x; i < len; i += kThreads) {
    out[begin + i] = slot_of(table, r, prefix + i, page_size);
  }
}

}  // namespace

void metadata(const detail::MetadataProblem& p) {
  DeviceGuard guard(p.device.index);
  const cudaStream_t stream = as_stream(p.stream);
  switch (p.op) {
    case detail::MetadataOp::cumsum_lengths:
      cumsum_kernel<<<1, kThreads, 0, stream>>>(p.in, p.n, p.out);  // n == 0 still writes out[0]
      break;
    case detail::MetadataOp::clamp_seq_lens:
      if (p.n == 0) return;
      clamp_kernel<<<grid_stride_blocks(p.n * p.repeat, kThreads), kThreads, 0, stream>>>(
          p.in, p.n * p.repeat, p.value, p.max_value, p.repeat, p.out);
      break;
    case detail::MetadataOp::decode_write_slots: {
      const int64_t total = p.n * p.value;
      if (total == 0) return;
      decode_write_slots_kernel<<<grid_stride_blocks(total, kThreads), kThreads, 0, stream>>>(
          p.page_table, p.in, p.n, p.value, p.page_size, p.out);
      break;
    }
    case detail::MetadataOp::extend_write_slots:
      if (p.n == 0) return;
      extend_write_slots_kernel<<<static_cast<unsigned>(p.n), kThreads, 0, stream>>>(p.page_table, p.in,
                                                                                     p.cu_seqlens_q, p.page_size,
                                                                                     p.out);
      break;
  }
  PAGEDMHA_CUDA_CHECK_LAUNCH();
}

}  // namespace pagedmha::cuda
