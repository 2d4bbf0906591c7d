// append_kv: K[out_cache_loc[t]] = k[t], V[out_cache_loc[t]] = v[t] (docs/semantics.md section 2).
// bf16/fp16 caches get a plain copy; an fp8 e4m3 cache stores saturate_rne(x / scale).
// One thread moves one 16-byte vector of the cache (8 x 16-bit or 16 x fp8) for both K
// and V; a scalar variant covers views whose pointers or strides break 16-byte alignment.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/elementwise.cuh"
#include "cuda/cuda_ops.h"

namespace pagedmha::cuda {
namespace {

struct AppendArgs {
  const uint16_t* src[2];  // k, v (bf16 or fp16 bits)
  int64_t src_row_stride[2], src_head_stride[2];
  unsigned char* dst[2];  // k_cache, v_cache (bytes)
  int64_t dst_page_stride[2], dst_token_stride[2], dst_head_stride[2];  // in elements
  float scale[2];                                                        // fp8 only
  const int32_t* out_cache_loc;
  int64_t num_tokens;
  int64_t num_slots;
  int page_size;
  int num_kv_heads;
  int chunks_per_head;  // head_dim / kVec
};

// kN bytes moved as one access: 16-byte aligned vectors for kN >= 16.
template <int kN>
struct alignas(kN >= 16 ? 16 : kN) Bytes {
  unsigned char b[kN];
};

template <bool kBf16>
__device__ __forceinline__ float to_float(uint16_t bits) {
  if constexpr (kBf16) {
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  } else {
    return __half2float(__ushort_as_half(bits));
  }
}

// kVec source elements per thread; the cache element is 1 byte (kFp8) or 2 bytes.
template <bool kBf16, bool kFp8, int kVec>
__global__ void __launch_bounds__(256) append_kv_kernel(const AppendArgs a) {
  constexpr int kDstBytes = kFp8 ? 1 : 2;
  const int64_t per_token = static_cast<int64_t>(a.num_kv_heads) * a.chunks_per_head;
  const int64_t total = a.num_tokens * per_token;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_token;
    const int r = static_cast<int>(i - t * per_token);
    const int h = r / a.chunks_per_head;
    const int d = (r - h * a.chunks_per_head) * kVec;
    const int32_t slot = __ldg(a.out_cache_loc + t);
    // Out-of-pool slots are skipped rather than written anywhere (debug validation
    // reports them); every in-range slot is written.
    if (slot < 0 || slot >= a.num_slots) continue;
    const int64_t page = slot / a.page_size;
    const int64_t offset = slot - page * a.page_size;
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
      const uint16_t* src = a.src[kv] + t * a.src_row_stride[kv] + h * a.src_head_stride[kv] + d;
      unsigned char* dst = a.dst[kv] + (page * a.dst_page_stride[kv] + offset * a.dst_token_stride[kv] +
                                        h * a.dst_head_stride[kv] + d) * kDstBytes;
      const Bytes<kVec * 2> in = *reinterpret_cast<const Bytes<kVec * 2>*>(src);
      if constexpr (!kFp8) {
        *reinterpret_cast<Bytes<kVec * 2>*>(dst) = in;
      } else {
        const uint16_t* x = reinterpret_cast<const uint16_t*>(in.b);
        Bytes<kVec> out;
        // IEEE division (not a reciprocal multiply) so the stored value is exactly
        // saturate_rne(x / scale), as on the CPU path.
        if constexpr (kVec == 1) {
          out.b[0] = __nv_cvt_float_to_fp8(to_float<kBf16>(x[0]) / a.scale[kv], __NV_SATFINITE, __NV_E4M3);
        } else {
          uint16_t* o = reinterpret_cast<uint16_t*>(out.b);
#pragma unroll
          for (int e = 0; e < kVec; e += 2) {
            const float2 f = make_float2(to_float<kBf16>(x[e]) / a.scale[kv], to_float<kBf16>(x[e + 1]) / a.scale[kv]);
            o[e / 2] = __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3);  // x in the low byte
          }
        }
        *reinterpret_cast<Bytes<kVec>*>(dst) = out;
      }
    }
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }
bool stride_ok(int64_t stride_elems, int elem_bytes) { return (stride_elems * elem_bytes) % 16 == 0; }

template <bool kBf16, bool kFp8>
void launch(const AppendArgs& a, bool vectorised, cudaStream_t stream) {
  constexpr int kThreads = 256;
  constexpr int kVec = kFp8 ? 16 : 8;  // one 16-byte cache vector
  AppendArgs args = a;
  const int64_t head_dim = static_cast<int64_t>(a.chunks_per_head);
  if (vectorised) {
    args.chunks_per_head = static_cast<int>(head_dim / kVec);
    const int64_t work = args.num_tokens * args.num_kv_heads * args.chunks_per_head;
    append_kv_kernel<kBf16, kFp8, kVec><<<grid_stride_blocks(work, kThreads), kThreads, 0, stream>>>(args);
  } else {
    const int64_t work = args.num_tokens * args.num_kv_heads * head_dim;
    append_kv_kernel<kBf16, kFp8, 1><<<grid_stride_blocks(work, kThreads), kThreads, 0, stream>>>(args);
  }
  PAGEDMHA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void append_kv(const detail::AppendKvProblem& p) {
  if (p.num_tokens == 0) return;  // nothing to write; launching nothing is graph-safe
  const detail::KvCacheDesc& kv = p.kv;
  const bool fp8 = kv.dtype == DType::fp8_e4m3;
  const int dst_bytes = fp8 ? 1 : 2;

  AppendArgs a{};
  a.src[0] = static_cast<const uint16_t*>(p.k);
  a.src[1] = static_cast<const uint16_t*>(p.v);
  a.src_row_stride[0] = p.k_row_stride;
  a.src_head_stride[0] = p.k_head_stride;
  a.src_row_stride[1] = p.v_row_stride;
  a.src_head_stride[1] = p.v_head_stride;
  const detail::PagedCache* caches[2] = {&kv.k, &kv.v};
  for (int i = 0; i < 2; ++i) {
    a.dst[i] = static_cast<unsigned char*>(caches[i]->data);
    a.dst_page_stride[i] = caches[i]->page_stride;
    a.dst_token_stride[i] = caches[i]->token_stride;
    a.dst_head_stride[i] = caches[i]->head_stride;
  }
  a.scale[0] = p.k_scale;
  a.scale[1] = p.v_scale;
  a.out_cache_loc = p.out_cache_loc;
  a.num_tokens = p.num_tokens;
  a.num_slots = kv.num_pages * kv.page_size;
  a.page_size = kv.page_size;
  a.num_kv_heads = kv.num_kv_heads;
  a.chunks_per_head = kv.head_dim;  // launch() divides by the vector width

  // 16-byte vectors need every base pointer and stride (in bytes) 16-byte aligned and
  // head_dim a multiple of the vector: true for every real cache layout.
  const int vec = fp8 ? 16 : 8;
  bool vectorised = kv.head_dim % vec == 0;
  for (int i = 0; i < 2; ++i) {
    vectorised = vectorised && aligned16(a.src[i]) && aligned16(a.dst[i]) &&
                 stride_ok(a.src_row_stride[i], 2) && stride_ok(a.src_head_stride[i], 2) &&
                 stride_ok(a.dst_page_stride[i], dst_bytes) && stride_ok(a.dst_token_stride[i], dst_bytes) &&
                 stride_ok(a.dst_head_stride[i], dst_bytes);
  }

  DeviceGuard guard(p.device.index);
  const cudaStream_t stream = as_stream(p.stream);
  const bool bf16 = p.src_dtype == DType::bf16;
  if (bf16) {
    fp8 ? launch<true, true>(a, vectorised, stream) : launch<true, false>(a, vectorised, stream);
  } else {
    fp8 ? launch<false, true>(a, vectorised, stream) : launch<false, false>(a, vectorised, stream);
  }
}

}  // namespace pagedmha::cuda
