// Reusable argument checks for the validating front end (src/core/ops.cpp). Every
// failure throws Error("<op>: <arg>: expected <what>, got <value>").
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "core/problem.h"
#include "pagedmha/tensor.h"

namespace pagedmha::detail {

/// A tensor argument and its name in errors.
using Named = std::pair<const TensorView*, const char*>;

/// Checks bound to one op name, so every message starts with "<op>: ".
class ArgCheck {
 public:
  explicit ArgCheck(const char* op) : op_(op) {}
  const char* op() const { return op_; }

  [[noreturn]] void fail(const std::string& arg, const std::string& expected,
                         const std::string& given) const;

  /// A defined view with non-negative sizes (every tensor check starts here).
  void defined(const TensorView& t, const char* arg) const;
  void dtype(const TensorView& t, const char* arg, DType want) const;
  void dtype_in(const TensorView& t, const char* arg, std::initializer_list<DType> allowed) const;
  void ndim(const TensorView& t, const char* arg, int want) const;
  /// Exact shape; -1 entries match any size.
  void shape(const TensorView& t, const char* arg, std::initializer_list<int64_t> want) const;
  /// t.size(dim) >= min_size.
  void size_at_least(const TensorView& t, const char* arg, int dim, int64_t min_size) const;
  void device(const TensorView& t, const char* arg, Device want) const;
  /// Only the last dim must be contiguous (stride 1, or size <= 1).
  void last_dim_contiguous(const TensorView& t, const char* arg) const;
  /// A CUDA tensor's base pointer and non-last strides are 16-byte aligned (vector loads).
  void aligned16(const TensorView& t, const char* arg) const;
  /// No two indices address the same element (outputs and caches that the op writes):
  /// rejects stride 0 on a dim of size > 1 and strides that step inside another dim.
  void no_self_overlap(const TensorView& t, const char* arg) const;
  /// No element of `t` is an element of `other` (two outputs the op writes). Views of one
  /// layout (K and V interleaved in one allocation) are compared element-exactly; views
  /// of different layouts must not share a byte.
  void disjoint(const TensorView& t, const char* arg, const TensorView& other, const char* other_arg) const;
  /// A written view `w` that is either exactly one part parts[i] (same elements, same
  /// order: an in-place op) or shares no element with any part of `parts` (dim 0).
  void in_place_or_disjoint(const TensorView& w, const char* arg, const TensorView& parts,
                            const char* parts_arg) const;
  /// A written view `w` shares no element with the input `in` (skipped when absent).
  void disjoint_from_input(const TensorView& w, const char* arg, const TensorView& in, const char* in_arg) const;
  /// A written view `w` shares no element with any of `inputs` (absent ones skipped; a
  /// no-op for an absent `w`): an output laid over the op's own metadata, query or cache
  /// would change its inputs while it runs (a page id or slot rewritten after its check).
  void disjoint_from_inputs(const TensorView& w, const char* arg, std::initializer_list<Named> inputs) const;
  /// t.size(dim) as an int; fails when it exceeds 2^31 - 1.
  int int32_size(const TensorView& t, const char* arg, int dim) const;
  /// int32, 1-d, contiguous, on `dev`, exactly `len` elements (len < 0: any length).
  void int32_vector(const TensorView& t, const char* arg, Device dev, int64_t len) const;
  /// int32, 2-d, last dim contiguous, on `dev`.
  void int32_matrix(const TensorView& t, const char* arg, Device dev) const;

  void scalar_finite(float v, const char* arg) const;
  void int_at_least(int64_t v, const char* arg, int64_t min_value) const;
  void head_dim(int64_t d, const char* arg) const;
  /// Rejects CUDA tensors in a build without CUDA support, and GPUs the build has no
  /// kernels for (older than sm_80, or outside PAGEDMHA_CUDA_ARCHS).
  void device_supported(Device dev) const;

  // Value checks of host (CPU) int32 data.
  void non_negative(const int32_t* v, int64_t n, const char* arg) const;
  /// cu[0] == 0, non-decreasing, cu[n] == total.
  void prefix_sums(const int32_t* cu, int64_t n, int64_t total, const char* arg) const;

 private:
  const char* op_;
};

template <class T>
  requires std::is_integral_v<T>
std::string str(T v) {
  return std::to_string(v);
}
std::string str(float v);

/// Whether two views share an element: exactly for views of one layout whose strides
/// nest (no_self_overlap), by byte ranges otherwise (conservative).
bool overlaps(const TensorView& t, const TensorView& other);

/// Resolves a paged K/V cache pair: [num_slots, Hkv, D] (num_slots % page_size == 0)
/// or [num_pages, page_size, Hkv, D]; both of one dtype and shape, last dim contiguous,
/// on `dev`, head dim supported. `allowed` lists the accepted cache dtypes.
KvCacheDesc resolve_cache(const ArgCheck& chk, const TensorView& k_cache, const TensorView& v_cache,
                          int page_size, Device dev, std::initializer_list<DType> allowed);

/// The largest int32 value (sizes and slots the kernels index with int32).
constexpr int64_t kMaxInt32 = 2147483647;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// An int32 [rows, cols] view (checked with ArgCheck::int32_matrix) as a problem field.
inline Int32Matrix int32_matrix(const TensorView& t) {
  return {t.ptr<int32_t>(), t.stride(0), t.size(0), t.size(1)};
}

}  // namespace pagedmha::detail
