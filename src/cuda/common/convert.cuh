// Element conversions for the attention kernels: fp32 <-> bf16/fp16 pairs and fp8 e4m3
// (OCP E4M3FN) -> bf16/fp16, exact (every e4m3 value is representable in both).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace pagedmha::cuda {

/// Storage type of an fp8 e4m3 cache element.
using fp8_e4m3 = __nv_fp8_e4m3;

/// Two fp32 -> one packed 32-bit pair of T (round to nearest even); `lo` in the low half.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

/// Two e4m3 bytes (low byte first) -> one packed pair of T.
template <class T>
__device__ __forceinline__ uint32_t fp8x2_to(uint16_t v);

template <>
__device__ __forceinline__ uint32_t fp8x2_to<__half>(uint16_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

template <>
__device__ __forceinline__ uint32_t fp8x2_to<__nv_bfloat16>(uint16_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return pack2<__nv_bfloat16>(f.x, f.y);
}

/// 16 e4m3 values -> 16 values of T, in order (out[0] holds elements 0..7).
template <class T>
__device__ __forceinline__ void fp8x16_to(const uint4& in, uint4 (&out)[2]) {
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t r[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    r[2 * i] = fp8x2_to<T>(static_cast<uint16_t>(w[i] & 0xffffu));
    r[2 * i + 1] = fp8x2_to<T>(static_cast<uint16_t>(w[i] >> 16));
  }
  out[0] = make_uint4(r[0], r[1], r[2], r[3]);
  out[1] = make_uint4(r[4], r[5], r[6], r[7]);
}

/// 8 fp32 -> 8 values of T packed in 16 bytes.
template <class T>
__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
  return make_uint4(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]), pack2<T>(v[4], v[5]), pack2<T>(v[6], v[7]));
}

}  // namespace pagedmha::cuda
