// Debug validation (off by default): device checks of page ids and write slots that the
// front end cannot see without reading device memory. A check kernel records the first
// violation (lowest index) with atomicMin into one 64-bit device word; the host then
// synchronises and throws Error naming it. Allocates and synchronises: debug mode only,
// never inside graph capture.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/common/check.cuh"
#include "cuda/common/elementwise.cuh"
#include "cuda/cuda_ops.h"

namespace pagedmha::cuda {
namespace {

constexpr unsigned long long kNone = ~0ull;

// Key of a violation: (row << 32) | code; code 0 = the row's length itself is bad
// (negative, or needs more table columns than exist); code c + 1 = page id at column c.
// Checks exactly the pages attention reads (as the CPU front end does).
__global__ void check_page_ids_kernel(const detail::AttentionProblem p, unsigned long long* first) {
  const int64_t r = blockIdx.x;
  const int32_t len = p.seq_lens[r];
  const int32_t n = p.cu_seqlens_q ? p.cu_seqlens_q[r + 1] - p.cu_seqlens_q[r] : p.q_len_per_req;
  if (len < 0) {
    if (threadIdx.x == 0) atomicMin(first, static_cast<unsigned long long>(r) << 32);
    return;
  }
  if (n <= 0 || len == 0) return;  // reads no page
  const int64_t P = p.kv.page_size;
  const int64_t pages = div_up(len, P);
  if (pages > p.page_table_cols) {
    if (threadIdx.x == 0) atomicMin(first, static_cast<unsigned long long>(r) << 32);
    return;
  }
  // Pages wholly before the window may have been released: they are never read.
  const int64_t first_key = MaskVariant{p.causal, p.window_left}.first_key(len, n);
  const int32_t* row = p.page_table + r * p.page_table_row_stride;
  for (int64_t c = first_key / P + threadIdx.x; c < pages; c += blockDim.x) {
    const int32_t id = row[c];
    if (id < 0 || id >= p.kv.num_pages) {
      atomicMin(first, (static_cast<unsigned long long>(r) << 32) | static_cast<unsigned long long>(c + 1));
    }
  }
}

__device__ __forceinline__ float load_value(const void* base, int64_t i, bool bf16) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i])
              : __half2float(static_cast<const __half*>(base)[i]);
}

// detail::PendingRows on the device: the sorted slots a write not made yet will fill,
// the token of each, and the new rows' source.
struct DevicePending {
  const int32_t* slots = nullptr;
  const int32_t* tokens = nullptr;
  int64_t n = 0;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_row = 0, k_head = 0, v_row = 0, v_head = 0;
  bool bf16 = true;
};

// Index of `slot` in the sorted slots[0, n), -1 when absent.
__device__ __forceinline__ int64_t find_sorted(const int32_t* slots, int64_t n, int64_t slot) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (slots[mid] < slot) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < n && slots[lo] == slot ? lo : -1;
}

// Key of an out-of-range input: (request << 32) | kind, kind 1 = q, 2 = k_cache, 3 = v_cache,
// 4 = a new k row, 5 = a new v row. Reads q's rows of the request and the K / V of the keys
// its queries can see, a key in a pending slot from its new row.
__global__ void check_values_kernel(const detail::AttentionProblem p, float bound, const DevicePending pend,
                                    unsigned long long* first) {
  const int64_t r = blockIdx.x;
  const int32_t L = p.seq_lens[r];
  const int64_t row0 = p.cu_seqlens_q ? p.cu_seqlens_q[r] : r * int64_t{p.q_len_per_req};
  const int32_t n = p.cu_seqlens_q ? p.cu_seqlens_q[r + 1] - p.cu_seqlens_q[r] : p.q_len_per_req;
  const auto bad = [&](float x) { return !(fabsf(x) <= bound); };  // NaN fails too
  const int64_t D = p.head_dim;
  if (p.q_dtype != DType::fp8_e4m3) {
    const bool bf16 = p.q_dtype == DType::bf16;
    const int64_t per_row = int64_t{p.num_q_heads} * D;
    for (int64_t i = threadIdx.x; i < n * per_row; i += blockDim.x) {
      const int64_t row = row0 + i / per_row, h = (i % per_row) / D, d = i % D;
      if (bad(load_value(p.q, row * p.q_row_stride + h * p.q_head_stride + d, bf16))) {
        atomicMin(first, (static_cast<unsigned long long>(r) << 32) | 1ull);
        return;
      }
    }
  }
  if (p.kv.dtype == DType::fp8_e4m3 || L <= 0 || n <= 0) return;  // e4m3 is within +-448
  const bool bf16 = p.kv.dtype == DType::bf16;
  const int64_t P = p.kv.page_size, lo = MaskVariant{p.causal, p.window_left}.first_key(L, n);
  const int64_t per_key = int64_t{p.num_kv_heads} * D;
  const int32_t* table = p.page_table + r * p.page_table_row_stride;
  int64_t looked_up = -1, w = -1;  // the key whose pending slot was last searched, and the result
  for (int64_t i = threadIdx.x; i < (L - lo) * per_key; i += blockDim.x) {
    const int64_t pos = lo + i / per_key, h = (i % per_key) / D, d = i % D;
    const int64_t page = table[pos / P], off = pos % P;
    if (pend.n > 0 && pos != looked_up) {  // once per key and thread, not per element
      looked_up = pos;
      w = find_sorted(pend.slots, pend.n, page * P + off);
    }
    if (w >= 0) {
      const int64_t t = pend.tokens[w];
      if (bad(load_value(pend.k, t * pend.k_row + h * pend.k_head + d, pend.bf16))) {
        atomicMin(first, (static_cast<unsigned long long>(r) << 32) | 4ull);
        return;
      }
      if (bad(load_value(pend.v, t * pend.v_row + h * pend.v_head + d, pend.bf16))) {
        atomicMin(first, (static_cast<unsigned long long>(r) << 32) | 5ull);
        return;
      }
      continue;
    }
    if (bad(load_value(p.kv.k.data, page * p.kv.k.page_stride + off * p.kv.k.token_stride + h * p.kv.k.head_stride + d,
                       bf16))) {
      atomicMin(first, (static_cast<unsigned long long>(r) << 32) | 2ull);
      return;
    }
    if (bad(load_value(p.kv.v.data, page * p.kv.v.page_stride + off * p.kv.v.token_stride + h * p.kv.v.head_stride + d,
                       bf16))) {
      atomicMin(first, (static_cast<unsigned long long>(r) << 32) | 3ull);
      return;
    }
  }
}

__global__ void check_slots_kernel(const int32_t* __restrict__ slots, int64_t n, int64_t num_slots,
                                   unsigned long long* first) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t s = slots[t];
    if (s < 0 || s >= num_slots) atomicMin(first, static_cast<unsigned long long>(t));
  }
}

// Runs `launch(flag)` on `stream` with a fresh device word set to kNone; returns the word.
template <class Launch>
unsigned long long run_check(cudaStream_t stream, Launch&& launch) {
  unsigned long long* flag = nullptr;
  PAGEDMHA_CUDA_CHECK(cudaMalloc(&flag, sizeof(*flag)));
  unsigned long long result = kNone;
  try {
    PAGEDMHA_CUDA_CHECK(cudaMemcpyAsync(flag, &result, sizeof(result), cudaMemcpyHostToDevice, stream));
    launch(flag);
    PAGEDMHA_CUDA_CHECK_LAUNCH();
    PAGEDMHA_CUDA_CHECK(cudaMemcpyAsync(&result, flag, sizeof(result), cudaMemcpyDeviceToHost, stream));
    PAGEDMHA_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    cudaFree(flag);
    throw;
  }
  PAGEDMHA_CUDA_CHECK(cudaFree(flag));
  return result;
}

int32_t read_int(const int32_t* device_ptr, cudaStream_t stream) {
  int32_t v = 0;
  PAGEDMHA_CUDA_CHECK(cudaMemcpyAsync(&v, device_ptr, sizeof(v), cudaMemcpyDeviceToHost, stream));
  PAGEDMHA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return v;
}

}  // namespace

void validate_page_ids(const detail::AttentionProblem& p) {
  if (p.batch == 0) return;
  DeviceGuard guard(p.device.index);
  const cudaStream_t stream = as_stream(p.stream);
  const unsigned long long first = run_check(stream, [&](unsigned long long* flag) {
    check_page_ids_kernel<<<p.batch, 128, 0, stream>>>(p, flag);
  });
  if (first == kNone) return;
  const int64_t row = static_cast<int64_t>(first >> 32);
  const int64_t code = static_cast<int64_t>(first & 0xffffffffull);
  const char* op = p.cu_seqlens_q ? "batch_prefill" : "batch_decode";
  const int32_t len = read_int(p.seq_lens + row, stream);
  if (code == 0) {
    throw_invalid_argument(op, "seq_lens[" + std::to_string(row) + "]",
                           "a length in [0, page_table cols * page_size] = [0, " +
                               std::to_string(static_cast<int64_t>(p.page_table_cols) * p.kv.page_size) + "]",
                           std::to_string(len));
  }
  const int64_t col = code - 1;
  const int32_t id = read_int(p.page_table + row * p.page_table_row_stride + col, stream);
  throw_invalid_argument(op, "page_table[" + std::to_string(row) + ", " + std::to_string(col) + "]",
                         "a page id in [0, num_pages) = [0, " + std::to_string(p.kv.num_pages) +
                             ") for seq_len " + std::to_string(len),
                         std::to_string(id));
}

void validate_values(const detail::AttentionProblem& p, float bound, const detail::PendingRows* pending) {
  if (p.batch == 0) return;
  DeviceGuard guard(p.device.index);
  const cudaStream_t stream = as_stream(p.stream);
  DevicePending pend;
  int32_t* d_lists = nullptr;  // the slots, then the tokens
  const int64_t n = pending != nullptr ? static_cast<int64_t>(pending->slots.size()) : 0;
  if (n > 0) {
    PAGEDMHA_CUDA_CHECK(cudaMalloc(&d_lists, 2 * n * sizeof(int32_t)));
    pend = {d_lists, d_lists + n, n, pending->k, pending->v, pending->k_row_stride, pending->k_head_stride,
            pending->v_row_stride, pending->v_head_stride, pending->dtype == DType::bf16};
  }
  unsigned long long first = kNone;
  try {
    if (n > 0) {
      PAGEDMHA_CUDA_CHECK(cudaMemcpyAsync(d_lists, pending->slots.data(), n * sizeof(int32_t),
                                          cudaMemcpyHostToDevice, stream));
      PAGEDMHA_CUDA_CHECK(cudaMemcpyAsync(d_lists + n, pending->tokens.data(), n * sizeof(int32_t),
                                          cudaMemcpyHostToDevice, stream));
    }
    first = run_check(stream, [&](unsigned long long* flag) {
      check_values_kernel<<<p.batch, 256, 0, stream>>>(p, bound, pend, flag);
    });
  } catch (...) {
    cudaFree(d_lists);
    throw;
  }
  PAGEDMHA_CUDA_CHECK(cudaFree(d_lists));  // after run_check's synchronisation
  if (first == kNone) return;
  const int64_t row = static_cast<int64_t>(first >> 32);
  const int kind = static_cast<int>(first & 0xffffffffull);
  const char* arg = kind == 1 ? "q" : kind == 2 ? "k_cache" : kind == 3 ? "v_cache" : kind == 4 ? "k" : "v";
  throw_invalid_argument(p.cu_seqlens_q ? "batch_prefill" : "batch_decode", arg,
                         "finite values of magnitude <= 2^56 (docs/semantics.md: larger ones may overflow fp32)",
                         std::string("a value outside that range ") +
                             (kind == 1 ? "in the queries" : kind <= 3 ? "in a key it reads" : "in a new row it reads") +
                             " of request " + std::to_string(row));
}

void validate_slots(const detail::AppendKvProblem& p) {
  if (p.num_tokens == 0) return;
  DeviceGuard guard(p.device.index);
  const cudaStream_t stream = as_stream(p.stream);
  const int64_t num_slots = p.kv.num_pages * p.kv.page_size;
  const unsigned long long first = run_check(stream, [&](unsigned long long* flag) {
    constexpr int kThreads = 256;
    check_slots_kernel<<<grid_stride_blocks(p.num_tokens, kThreads), kThreads, 0, stream>>>(
        p.out_cache_loc, p.num_tokens, num_slots, flag);
  });
  if (first == kNone) return;
  const int32_t slot = read_int(p.out_cache_loc + first, stream);
  throw_invalid_argument("append_kv", "out_cache_loc[" + std::to_string(first) + "]",
                         "a slot in [0, num_pages * page_size) = [0, " + std::to_string(num_slots) + ")",
                         std::to_string(slot));
}

}  // namespace pagedmha::cuda
