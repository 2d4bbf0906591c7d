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

/// P's m16n8k16 A fragment for k16 step kk from the m16n8 accumulators of its two key
/// halves (keys 16 kk .. + 7 in s[2 kk], + 8 .. + 15 in s[2 kk + 1]), packed to T pairs.
template <class T, int N>
__device__ __forceinline__ void p_fragment(uint32_t (&pa)[4], const float (&s)[N][4], int kk) {
  pa[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
  pa[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
  pa[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  pa[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

/// Two e4m3 bytes (low byte first) -> one packed fp16 pair, exact; NaN (0x7f / 0xff) ->
/// 0x7fff. sm_89+: one cvt. Older GPUs have no e4m3 cvt: seeeemmm -> fp16 s0eeeemmm0000000
/// is the value times 2^-8 (subnormals too) and one fp16x2 multiply by 2^8 (exact) fixes
/// the exponent bias; the NaN code, which reads as 480 that way, is patched to 0x7fff as
/// the cvt gives.
__device__ __forceinline__ uint32_t fp8x2_to_half2_bits(uint16_t v) {
#if __CUDA_ARCH__ >= 890
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
#else
  const uint32_t x = __byte_perm(v, 0u, 0x1404u);  // (0, b0, 0, b1): each half b << 8
  const uint32_t y = (x & 0x80008000u) | ((x >> 1) & 0x3f803f80u);
  const uint32_t k = 0x5c005c00u;  // fp16 (256, 256)
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&y), *reinterpret_cast<const __half2*>(&k));
  const uint32_t nan = __vcmpeq2(x & 0x7f007f00u, 0x7f007f00u);  // 0xffff in each NaN half
  return (*reinterpret_cast<const uint32_t*>(&r) & ~nan) | (0x7fff7fffu & nan);
#endif
}

/// Two e4m3 bytes (low byte first) -> one packed pair of T.
template <class T>
__device__ __forceinline__ uint32_t fp8x2_to(uint16_t v);

template <>
__device__ __forceinline__ uint32_t fp8x2_to<__half>(uint16_t v) {
  return fp8x2_to_half2_bits(v);
}

template <>
__device__ __forceinline__ uint32_t fp8x2_to<__nv_bfloat16>(uint16_t v) {
  const uint32_t h = fp8x2_to_half2_bits(v);
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

/// Four e4m3 bytes (byte 0 first) -> two packed pairs of T: lo = (byte 0, byte 1),
/// hi = (byte 2, byte 3). Exact. For fp16 one cvt per pair; for bf16 the e4m3 bits are
/// moved into place (seeeemmm -> s 0eeeemmm 0000: the value times 2^-120, exact for
/// subnormals too) and one bf16x2 multiply by 2^120 (exact) fixes the exponent bias.
/// (The e4m3 NaN code 0x7f reads as 480; saturating quantisation never writes it.)
template <class T>
__device__ __forceinline__ void fp8x4_to(uint32_t w, uint32_t& lo, uint32_t& hi);

template <>
__device__ __forceinline__ void fp8x4_to<__half>(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = fp8x2_to<__half>(static_cast<uint16_t>(w & 0xffffu));
  hi = fp8x2_to<__half>(static_cast<uint16_t>(w >> 16));
}

template <>
__device__ __forceinline__ void fp8x4_to<__nv_bfloat16>(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t x0 = __byte_perm(w, 0u, 0x1404u);  // bytes (0, b0, 0, b1): each half b << 8
  const uint32_t x1 = __byte_perm(w, 0u, 0x3424u);  // (0, b2, 0, b3)
  const uint32_t y0 = (x0 & 0x80008000u) | ((x0 >> 4) & 0x07f007f0u);
  const uint32_t y1 = (x1 & 0x80008000u) | ((x1 >> 4) & 0x07f007f0u);
  const __nv_bfloat162 k = __floats2bfloat162_rn(0x1p120f, 0x1p120f);
  const __nv_bfloat162 r0 = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&y0), k);
  const __nv_bfloat162 r1 = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&y1), k);
  lo = *reinterpret_cast<const uint32_t*>(&r0);
  hi = *reinterpret_cast<const uint32_t*>(&r1);
}

/// 16 e4m3 cache values -> 16 values of T in order, through fp8x4_to: for bf16 about half
/// the instructions of fp8x16_to (no fp16 detour). For bf16, like the portable kernels'
/// register conversion, the NaN code reads as 480; for fp16 (cvt) it is NaN. Quantisation
/// never writes it; inputs that may hold NaN (fp8 queries) use fp8x16_to.
template <class T>
__device__ __forceinline__ void fp8x16_cache_to(const uint4& in, uint4 (&out)[2]) {
  uint32_t r[8];
  fp8x4_to<T>(in.x, r[0], r[1]);
  fp8x4_to<T>(in.y, r[2], r[3]);
  fp8x4_to<T>(in.z, r[4], r[5]);
  fp8x4_to<T>(in.w, r[6], r[7]);
  out[0] = make_uint4(r[0], r[1], r[2], r[3]);
  out[1] = make_uint4(r[4], r[5], r[6], r[7]);
}

/// Four e4m3 bytes (a0, b0, a1, b1) as an ldmatrix.trans of fp8 data delivers them (a:
/// one column pair's even element, b: its odd one) -> fp16 pairs even = (a0, a1),
/// odd = (b0, b1). Exact.
__device__ __forceinline__ void fp8x4_deinterleave_to_half(uint32_t w, uint32_t& even, uint32_t& odd) {
  const uint32_t x = __byte_perm(w, 0u, 0x3120u);  // (a0, a1, b0, b1)
  even = fp8x2_to<__half>(static_cast<uint16_t>(x & 0xffffu));
  odd = fp8x2_to<__half>(static_cast<uint16_t>(x >> 16));
}

/// A bf16 pair -> an fp16 pair, round to nearest, saturating at +-65504 (finite inputs
/// stay finite; inf and NaN stay inf and NaN): a bf16 query entering fp16 GEMMs.
__device__ __forceinline__ uint32_t bf16x2_to_half_sat(uint32_t w) {
  const auto sat = [](float x) { return fabsf(x) <= 65504.0f || !(fabsf(x) < INFINITY) ? x : copysignf(65504.0f, x); };
  const __half2 h = __floats2half2_rn(sat(__uint_as_float(w << 16)), sat(__uint_as_float(w & 0xffff0000u)));
  return *reinterpret_cast<const uint32_t*>(&h);
}

/// 8 bf16 -> 8 fp16 (16 bytes each), as bf16x2_to_half_sat.
__device__ __forceinline__ uint4 bf16x8_to_half_sat(const uint4& in) {
  return make_uint4(bf16x2_to_half_sat(in.x), bf16x2_to_half_sat(in.y), bf16x2_to_half_sat(in.z),
                    bf16x2_to_half_sat(in.w));
}

/// 8 fp32 -> 8 values of T packed in 16 bytes.
template <class T>
__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
  return make_uint4(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]), pack2<T>(v[4], v[5]), pack2<T>(v[6], v[7]));
}

}  // namespace pagedmha::cuda
