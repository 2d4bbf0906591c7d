// Internal helpers shared by the MhaBackend translation units (mha_backend.cpp,
// graph_state.cpp): argument errors and the int32 metadata buffers the backend owns.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#include "pagedmha/tensor.h"

namespace pagedmha::backend_detail {

inline std::string str(int64_t v) { return std::to_string(v); }

[[noreturn]] inline void fail(const std::string& arg, const std::string& expected, const std::string& given) {
  throw_invalid_argument("MhaBackend", arg, expected, given);
}

// int32 [n] view of b starting at element offset.
inline TensorView vec(const Buffer& b, int64_t offset, int64_t n) {
  return TensorView(static_cast<int32_t*>(b.data()) + offset, DType::int32, b.device(), {n});
}

// int32 [rows, cols] row-major view of b.
inline TensorView mat(const Buffer& b, int64_t rows, int64_t cols) {
  return TensorView(b.data(), DType::int32, b.device(), {rows, cols});
}

// Zero-filled buffer of n_int32 int32 values (at least one, so data() is never null).
inline Buffer zeros(int64_t n_int32, Device dev, Stream s) {
  Buffer b(static_cast<std::size_t>(std::max<int64_t>(n_int32, 1)) * 4, dev);
  fill_bytes(b.data(), dev, 0, b.bytes(), s);
  return b;
}

}  // namespace pagedmha::backend_detail
