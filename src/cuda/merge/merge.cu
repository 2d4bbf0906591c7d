// merge_attention_states on CUDA (docs/semantics.md section 8.6). Memory-bound: each
// (row, head) item is served by D / kVec threads of one block, each moving one 16-byte
// vector of every part's row (coalesced along D) and of the output. Every thread of an
// item computes the weights exp(lse_i - M) itself from the item's K lse values (cached
// reads); the arithmetic is the CPU path's, in fp32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/check.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/elementwise.cuh"
#include "cuda/cuda_ops.h"

namespace pagedmha::cuda {
namespace {

constexpr int kThreads = 256;

struct MergeArgs {
  const unsigned char* o;  // bytes
  int64_t o_part_stride, o_row_stride, o_head_stride;  // elements
  const float* lse;
  int64_t lse_part_stride, lse_row_stride, lse_head_stride;
  unsigned char* out;
  int64_t out_row_stride, out_head_stride;
  float* out_lse;  // optional
  int64_t out_lse_row_stride, out_lse_head_stride;
  const float* sinks;  // optional [Hq]
  int num_parts, num_rows, num_heads, head_dim;
};

// 16 bytes of T <-> kVec floats.
template <class T>
struct Vec16 {
  static constexpr int kVec = 8;  // bf16 / fp16
  __device__ static void load(const unsigned char* p, float (&x)[kVec]) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f;
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
      } else {
        f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      }
      x[2 * i] = f.x, x[2 * i + 1] = f.y;
    }
  }
  __device__ static void store(unsigned char* p, const float (&x)[kVec]) { *reinterpret_cast<uint4*>(p) = pack8<T>(x); }
};

template <>
struct Vec16<float> {
  static constexpr int kVec = 4;
  __device__ static void load(const unsigned char* p, float (&x)[kVec]) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  }
  __device__ static void store(unsigned char* p, const float (&x)[kVec]) {
    *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  }
};

template <class T>
__global__ void __launch_bounds__(kThreads) merge_kernel(const MergeArgs a) {
  using V = Vec16<T>;
  constexpr int kVec = V::kVec;
  constexpr int64_t kBytes = sizeof(T);
  const int per_item = a.head_dim / kVec;  // divides kThreads: D in {64, 128, 256}
  const int items_per_block = kThreads / per_item;
  const int local = static_cast<int>(threadIdx.x) / per_item;
  const int d0 = (static_cast<int>(threadIdx.x) - local * per_item) * kVec;
  const int64_t total = static_cast<int64_t>(a.num_rows) * a.num_heads;
  // The loop bound is uniform across the block, so every thread reaches __syncthreads.
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * items_per_block; base < total;
       base += static_cast<int64_t>(gridDim.x) * items_per_block) {
    const int64_t item = base + local;
    const bool active = item < total;
    const int64_t t = active ? item / a.num_heads : 0;
    const int h = active ? static_cast<int>(item - t * a.num_heads) : 0;
    float acc[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[e] = 0.0f;
    float m = -INFINITY, z = 0.0f;
    if (active) {
      const float* lse = a.lse + t * a.lse_row_stride + h * a.lse_head_stride;
      const float sink = a.sinks != nullptr ? a.sinks[h] : -INFINITY;
      m = sink;
      for (int i = 0; i < a.num_parts; ++i) m = fmaxf(m, lse[i * a.lse_part_stride]);
      // M = -inf: no key and no sink; out = 0 and out_lse = -inf, no exp(-inf - -inf).
      if (m != -INFINITY) {
        z = sink == -INFINITY ? 0.0f : expf(sink - m);
        const unsigned char* o = a.o + (t * a.o_row_stride + h * a.o_head_stride + d0) * kBytes;
        for (int i = 0; i < a.num_parts; ++i) {
          const float l = lse[i * a.lse_part_stride];
          const float w = l == -INFINITY ? 0.0f : expf(l - m);
          if (w == 0.0f) continue;  // an empty part's o is never read
          z += w;
          float x[kVec];
          V::load(o + i * a.o_part_stride * kBytes, x);
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc[e] += w * x[e];
        }
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e] /= z;  // z >= 1: the largest term is exp(0)
      }
    }
    // out_lse may be lse[i] itself: every thread of the item has read it by now. (out may
    // be o[i]: each thread rewrites only the vector it read.)
    __syncthreads();
    if (active) {
      V::store(a.out + (t * a.out_row_stride + h * a.out_head_stride + d0) * kBytes, acc);
      if (d0 == 0 && a.out_lse != nullptr) {
        a.out_lse[t * a.out_lse_row_stride + h * a.out_lse_head_stride] = m == -INFINITY ? -INFINITY : m + logf(z);
      }
    }
  }
}

template <class T>
void launch(const MergeArgs& a, cudaStream_t stream) {
  const int items_per_block = kThreads / (a.head_dim / Vec16<T>::kVec);
  const int64_t items = static_cast<int64_t>(a.num_rows) * a.num_heads;
  merge_kernel<T><<<grid_stride_blocks(items, items_per_block), kThreads, 0, stream>>>(a);
  PAGEDMHA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void merge_attention_states(const detail::MergeProblem& p) {
  if (static_cast<int64_t>(p.num_rows) * p.num_heads == 0) return;
  MergeArgs a{};
  a.o = static_cast<const unsigned char*>(p.o);
  a.o_part_stride = p.o_part_stride, a.o_row_stride = p.o_row_stride, a.o_head_stride = p.o_head_stride;
  a.lse = p.lse;
  a.lse_part_stride = p.lse_part_stride, a.lse_row_stride = p.lse_row_stride, a.lse_head_stride = p.lse_head_stride;
  a.out = static_cast<unsigned char*>(p.out);
  a.out_row_stride = p.out_row_stride, a.out_head_stride = p.out_head_stride;
  a.out_lse = p.out_lse;
  a.out_lse_row_stride = p.out_lse_row_stride, a.out_lse_head_stride = p.out_lse_head_stride;
  a.sinks = p.sinks;
  a.num_parts = p.num_parts, a.num_rows = p.num_rows, a.num_heads = p.num_heads, a.head_dim = p.head_dim;

  DeviceGuard guard(p.device.index);
  const cudaStream_t stream = as_stream(p.stream);
  switch (p.dtype) {
    case DType::bf16: launch<__nv_bfloat16>(a, stream); break;
    case DType::fp16: launch<__half>(a, stream); break;
    default: launch<float>(a, stream); break;  // fp32: the front end admits nothing else
  }
}

}  // namespace pagedmha::cuda
