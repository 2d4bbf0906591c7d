// Row conversions between the storage dtypes and fp32 for the CPU ops. The bit-level
// formats are those of pagedmha/numeric.h; fp8 decodes through a table built from it.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>

#include "pagedmha/numeric.h"
#include "pagedmha/tensor.h"

namespace pagedmha::cpu {

inline const std::array<float, 256>& fp8_e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8_e4m3_to_float(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

/// dst[0..n) = float(src[0..n)); src is an element pointer of `dtype` (bf16, fp16, fp8).
inline void load_row(const void* src, DType dtype, int n, float* __restrict dst) {
  switch (dtype) {
    case DType::bf16: {
      const auto* s = static_cast<const uint16_t*>(src);
#pragma omp simd
      for (int i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(static_cast<uint32_t>(s[i]) << 16);
      break;
    }
    case DType::fp16: {
      const auto* s = static_cast<const _Float16*>(src);
      for (int i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      break;
    }
    case DType::fp8_e4m3: {
      const auto* s = static_cast<const uint8_t*>(src);
      const float* t = fp8_e4m3_table().data();
      for (int i = 0; i < n; ++i) dst[i] = t[s[i]];
      break;
    }
    case DType::fp32:
      std::memcpy(dst, src, sizeof(float) * static_cast<std::size_t>(n));
      break;
    default:
      break;  // the front end admits no other dtype
  }
}

/// dst[0..n) = round(src[0..n)) to bf16 or fp16 (round to nearest even), or fp32 as is.
inline void store_row(const float* src, int n, void* dst, DType dtype) {
  if (dtype == DType::fp32) {
    std::memcpy(dst, src, sizeof(float) * static_cast<std::size_t>(n));
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  if (dtype == DType::bf16) {
    for (int i = 0; i < n; ++i) d[i] = float_to_bf16(src[i]);
  } else {
    for (int i = 0; i < n; ++i) d[i] = float_to_fp16(src[i]);
  }
}

/// Element pointer arithmetic in elements of `dtype`, 64-bit.
inline const void* offset(const void* base, DType dtype, int64_t elems) {
  return static_cast<const char*>(base) + elems * static_cast<int64_t>(dtype_size(dtype));
}
inline void* offset(void* base, DType dtype, int64_t elems) {
  return static_cast<char*>(base) + elems * static_cast<int64_t>(dtype_size(dtype));
}

}  // namespace pagedmha::cpu
