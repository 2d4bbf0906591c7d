#include "core/validate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

#include "pagedmha/error.h"
#if PAGEDMHA_WITH_CUDA
#include "cuda/common/arch.h"
#endif

namespace pagedmha::detail {

std::string str(float v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

namespace {
std::string dtype_list(std::initializer_list<DType> allowed) {
  std::string s;
  for (DType d : allowed) s += (s.empty() ? "" : " or ") + std::string(dtype_name(d));
  return s;
}

std::string strides_str(const TensorView& t) {
  std::string s = "[";
  for (int d = 0; d < t.ndim; ++d) s += (d ? ", " : "") + std::to_string(t.strides[d]);
  return s + "]";
}
}  // namespace

void ArgCheck::fail(const std::string& arg, const std::string& expected, const std::string& given) const {
  throw_invalid_argument(op_, arg, expected, given);
}

void ArgCheck::defined(const TensorView& t, const char* arg) const {
  if (!t.defined()) fail(arg, "a tensor", "an undefined (absent) view");
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0) fail(arg, "non-negative sizes", "shape " + t.shape_str());
  }
  // Element count and the byte extent the strides reach, in checked 64-bit arithmetic: a
  // wrapped size would defeat every later size, overlap and bounds check.
  int64_t n = 1, extent = 0;
  bool over = false;
  for (int d = 0; d < t.ndim && !over; ++d) {
    const int64_t s = t.strides[d] < 0 ? -t.strides[d] : t.strides[d];
    int64_t step = 0;
    over = __builtin_mul_overflow(n, t.shape[d], &n) ||
           (t.shape[d] > 0 && (__builtin_mul_overflow(s, t.shape[d] - 1, &step) ||
                               __builtin_add_overflow(extent, step, &extent)));
  }
  int64_t bytes = 0;
  if (over || __builtin_mul_overflow(extent + 1, static_cast<int64_t>(dtype_size(t.dtype)), &bytes)) {
    fail(arg, "a view of at most 2^63 bytes", "shape " + t.shape_str() + " with strides " + strides_str(t));
  }
}

void ArgCheck::dtype(const TensorView& t, const char* arg, DType want) const {
  if (t.dtype != want) fail(arg, std::string("dtype ") + dtype_name(want), dtype_name(t.dtype));
}

void ArgCheck::dtype_in(const TensorView& t, const char* arg, std::initializer_list<DType> allowed) const {
  for (DType d : allowed) {
    if (t.dtype == d) return;
  }
  fail(arg, "dtype " + dtype_list(allowed), dtype_name(t.dtype));
}

void ArgCheck::ndim(const TensorView& t, const char* arg, int want) const {
  defined(t, arg);
  if (t.ndim != want) fail(arg, std::to_string(want) + " dims", std::to_string(t.ndim) + " dims " + t.shape_str());
}

void ArgCheck::shape(const TensorView& t, const char* arg, std::initializer_list<int64_t> want) const {
  defined(t, arg);
  bool ok = t.ndim == static_cast<int>(want.size());
  std::string w = "shape [";
  int d = 0;
  for (int64_t s : want) {
    w += (d ? ", " : "") + (s < 0 ? std::string("*") : std::to_string(s));
    if (ok && s >= 0 && t.shape[d] != s) ok = false;
    ++d;
  }
  if (!ok) fail(arg, w + "]", t.shape_str());
}

void ArgCheck::size_at_least(const TensorView& t, const char* arg, int dim, int64_t min_size) const {
  if (t.size(dim) < min_size) {
    fail(arg, "size(" + std::to_string(dim) + ") >= " + std::to_string(min_size), t.shape_str());
  }
}

void ArgCheck::device(const TensorView& t, const char* arg, Device want) const {
  if (!(t.device == want)) fail(arg, "device " + want.str() + " (all tensors on one device)", t.device.str());
}

void ArgCheck::last_dim_contiguous(const TensorView& t, const char* arg) const {
  if (t.numel() == 0) return;  // an empty view addresses no element (NumPy gives it strides 0)
  if (t.ndim >= 1 && t.size(-1) > 1 && t.stride(-1) != 1) {
    fail(arg, "a contiguous last dim (stride 1)", "strides " + strides_str(t));
  }
}

void ArgCheck::aligned16(const TensorView& t, const char* arg) const {
  if (!t.device.is_cuda() || t.numel() == 0) return;
  const int64_t es = static_cast<int64_t>(t.element_size());
  bool ok = reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  for (int d = 0; d + 1 < t.ndim; ++d) {
    if (t.shape[d] > 1 && (t.strides[d] * es) % 16 != 0) ok = false;
  }
  if (!ok) {
    fail(arg, "a 16-byte aligned pointer and 16-byte multiple strides on CUDA",
         "strides " + strides_str(t) + " of " + dtype_name(t.dtype));
  }
}

void ArgCheck::no_self_overlap(const TensorView& t, const char* arg) const {
  if (t.numel() <= 1) return;
  // Sufficient and, for layouts that nest, necessary: visiting dims of size > 1 by
  // increasing |stride|, each stride must step past everything the smaller ones span.
  int order[TensorView::kMaxDims];
  int n = 0;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] > 1) order[n++] = d;
  }
  const auto mag = [&](int d) { return t.strides[d] < 0 ? -t.strides[d] : t.strides[d]; };
  for (int i = 1; i < n; ++i) {  // insertion sort: at most kMaxDims entries
    for (int j = i; j > 0 && mag(order[j]) < mag(order[j - 1]); --j) std::swap(order[j], order[j - 1]);
  }
  int64_t span = 0;  // largest offset reachable through the dims visited so far
  for (int i = 0; i < n; ++i) {
    const int d = order[i];
    if (mag(d) <= span) {
      fail(arg, "a view whose elements do not overlap (written by the op)",
           "shape " + t.shape_str() + " with strides " + strides_str(t));
    }
    span += mag(d) * (t.shape[d] - 1);
  }
}

namespace {

// Whether delta = sum_d i_d * stride_d for some |i_d| < shape_d, dims visited by
// decreasing |stride| (a layout whose strides nest, which no_self_overlap ensures): at
// each dim only the two nearest multiples can leave a remainder the smaller dims reach.
bool reachable(int64_t delta, const int64_t* stride, const int64_t* size, const int64_t* below, int n) {
  if (n == 0) return delta == 0;
  const int64_t s = stride[0], m = size[0] - 1;
  if (s == 0) return reachable(delta, stride + 1, size + 1, below + 1, n - 1);
  const int64_t q = delta / s;
  for (int64_t i : {q - 1, q, q + 1}) {
    if (i < -m || i > m) continue;
    const int64_t r = delta - i * s;
    if ((r < 0 ? -r : r) <= below[0] && reachable(r, stride + 1, size + 1, below + 1, n - 1)) return true;
  }
  return false;
}

}  // namespace

bool overlaps(const TensorView& t, const TensorView& other) {
  if (t.numel() == 0 || other.numel() == 0) return false;
  const int64_t es = static_cast<int64_t>(dtype_size(t.dtype));
  const auto lo = reinterpret_cast<intptr_t>(t.data), olo = reinterpret_cast<intptr_t>(other.data);
  bool same_layout = t.dtype == other.dtype && t.ndim == other.ndim;
  for (int d = 0; same_layout && d < t.ndim; ++d) {
    same_layout = t.shape[d] == other.shape[d] && t.strides[d] == other.strides[d] && t.strides[d] >= 0;
  }
  bool overlap;
  if (same_layout && (olo - lo) % es == 0) {
    int64_t stride[TensorView::kMaxDims], size[TensorView::kMaxDims], below[TensorView::kMaxDims];
    int order[TensorView::kMaxDims], n = 0;
    for (int d = 0; d < t.ndim; ++d) {
      if (t.shape[d] > 1) order[n++] = d;
    }
    for (int i = 1; i < n; ++i) {  // insertion sort by decreasing stride: at most kMaxDims entries
      for (int j = i; j > 0 && t.strides[order[j]] > t.strides[order[j - 1]]; --j) std::swap(order[j], order[j - 1]);
    }
    for (int i = 0; i < n; ++i) stride[i] = t.strides[order[i]], size[i] = t.shape[order[i]];
    int64_t span = 0;
    for (int i = n - 1; i >= 0; --i) {
      below[i] = span;
      span += stride[i] * (size[i] - 1);
    }
    overlap = reachable((olo - lo) / es, stride, size, below, n);
  } else {
    // Byte ranges [first, last) of the elements each view reaches (negative strides too).
    auto range = [](const TensorView& v, intptr_t base) {
      int64_t below = 0, above = 0;
      for (int d = 0; d < v.ndim; ++d) (v.strides[d] < 0 ? below : above) += v.strides[d] * (v.shape[d] - 1);
      const int64_t vs = static_cast<int64_t>(dtype_size(v.dtype));
      return std::pair<intptr_t, intptr_t>{base + below * vs, base + (above + 1) * vs};
    };
    const auto a = range(t, lo), b = range(other, olo);
    overlap = a.first < b.second && b.first < a.second;
  }
  return overlap;
}

void ArgCheck::disjoint(const TensorView& t, const char* arg, const TensorView& other, const char* other_arg) const {
  if (overlaps(t, other)) {
    fail(arg, std::string("memory disjoint from ") + other_arg + " (both are written)",
         std::string("a view sharing elements with ") + other_arg);
  }
}

namespace {

// Dim 0 entry i of t, as a view of one less dim.
TensorView entry(const TensorView& t, int64_t i) {
  TensorView v = t.slice(0, i, 1);
  for (int d = 1; d < t.ndim; ++d) v.shape[d - 1] = t.shape[d], v.strides[d - 1] = t.strides[d];
  v.ndim = t.ndim - 1;
  return v;
}

// a and b address the same elements in the same order (strides of size-1 dims aside).
bool same_elements(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.ndim != b.ndim) return false;
  for (int d = 0; d < a.ndim; ++d) {
    if (a.shape[d] != b.shape[d] || (a.shape[d] > 1 && a.strides[d] != b.strides[d])) return false;
  }
  return true;
}

}  // namespace

void ArgCheck::in_place_or_disjoint(const TensorView& w, const char* arg, const TensorView& parts,
                                    const char* parts_arg) const {
  for (int64_t i = 0; i < parts.size(0); ++i) {
    const TensorView part = entry(parts, i);
    if (!same_elements(w, part) && overlaps(w, part)) {
      fail(arg, std::string(parts_arg) + "[i] itself (in place) or memory disjoint from every " + parts_arg + "[i]",
           std::string("a view sharing some elements with ") + parts_arg + "[" + std::to_string(i) + "]");
    }
  }
}

void ArgCheck::disjoint_from_input(const TensorView& w, const char* arg, const TensorView& in,
                                   const char* in_arg) const {
  if (in.defined() && overlaps(w, in)) {
    fail(arg, std::string("memory disjoint from ") + in_arg + " (read by the op)",
         std::string("a view sharing memory with ") + in_arg);
  }
}

void ArgCheck::disjoint_from_inputs(const TensorView& w, const char* arg, std::initializer_list<Named> inputs) const {
  if (!w.defined()) return;
  for (const auto& [in, name] : inputs) disjoint_from_input(w, arg, *in, name);
}

int ArgCheck::int32_size(const TensorView& t, const char* arg, int dim) const {
  const int64_t v = t.size(dim);
  if (v > std::numeric_limits<int32_t>::max()) {
    fail(arg, "size(" + std::to_string(dim) + ") at most 2^31 - 1", "shape " + t.shape_str());
  }
  return static_cast<int>(v);
}

void ArgCheck::int32_vector(const TensorView& t, const char* arg, Device dev, int64_t len) const {
  ndim(t, arg, 1);
  dtype(t, arg, DType::int32);
  device(t, arg, dev);
  if (len >= 0 && t.size(0) != len) fail(arg, "shape [" + std::to_string(len) + "]", t.shape_str());
  last_dim_contiguous(t, arg);
}

void ArgCheck::int32_matrix(const TensorView& t, const char* arg, Device dev) const {
  ndim(t, arg, 2);
  dtype(t, arg, DType::int32);
  device(t, arg, dev);
  last_dim_contiguous(t, arg);
}

void ArgCheck::scalar_finite(float v, const char* arg) const {
  if (!std::isfinite(v)) fail(arg, "a finite value", str(v));
}

void ArgCheck::int_at_least(int64_t v, const char* arg, int64_t min_value) const {
  if (v < min_value) fail(arg, ">= " + std::to_string(min_value), std::to_string(v));
}

void ArgCheck::head_dim(int64_t d, const char* arg) const {
  if (d != 64 && d != 128 && d != 256) fail(arg, "head dim 64, 128 or 256", std::to_string(d));
}

void ArgCheck::device_supported(Device dev) const {
#if PAGEDMHA_WITH_CUDA
  if (!dev.is_cuda()) return;
  // cc < 0: no driver or no such device, which the op's CUDA calls report.
  const int cc = cuda::compute_capability(dev.index);
  if (cc >= 0 && !cuda::archs_run_on(cuda::built_archs(), cc)) {
    fail("device",
         std::string("a GPU this build has kernels for (compute capability 8.0 or newer; PAGEDMHA_CUDA_ARCHS ") +
             cuda::built_archs() + ")",
         dev.str() + " of compute capability " + std::to_string(cc / 10) + "." + std::to_string(cc % 10));
  }
#else
  if (dev.is_cuda()) fail("device", "cpu (this build has no CUDA support)", dev.str());
#endif
}

void ArgCheck::non_negative(const int32_t* v, int64_t n, const char* arg) const {
  for (int64_t i = 0; i < n; ++i) {
    if (v[i] < 0) fail(arg, "non-negative lengths", std::to_string(v[i]) + " at index " + std::to_string(i));
  }
}

void ArgCheck::prefix_sums(const int32_t* cu, int64_t n, int64_t total, const char* arg) const {
  if (cu[0] != 0) fail(arg, "cu_seqlens_q[0] == 0", std::to_string(cu[0]));
  for (int64_t i = 0; i < n; ++i) {
    if (cu[i + 1] < cu[i]) {
      fail(arg, "non-decreasing prefix sums",
           std::to_string(cu[i + 1]) + " after " + std::to_string(cu[i]) + " at index " + std::to_string(i + 1));
    }
  }
  if (cu[n] != total) {
    fail(arg, "last entry == " + std::to_string(total) + " (total query rows)",
         std::to_string(cu[n]) + " at index " + std::to_string(n));
  }
}

KvCacheDesc resolve_cache(const ArgCheck& chk, const TensorView& k_cache, const TensorView& v_cache,
                          int page_size, Device dev, std::initializer_list<DType> allowed) {
  chk.defined(k_cache, "k_cache");
  chk.defined(v_cache, "v_cache");
  chk.device(k_cache, "k_cache", dev);
  chk.device(v_cache, "v_cache", dev);
  chk.int_at_least(page_size, "page_size", 1);
  if (k_cache.ndim != 3 && k_cache.ndim != 4) {
    chk.fail("k_cache", "[num_slots, Hkv, D] or [num_pages, page_size, Hkv, D]", k_cache.shape_str());
  }
  chk.dtype_in(k_cache, "k_cache", allowed);
  if (v_cache.dtype != k_cache.dtype) {
    chk.fail("v_cache", std::string("dtype ") + dtype_name(k_cache.dtype) + " (k_cache's)", dtype_name(v_cache.dtype));
  }
  bool same_shape = v_cache.ndim == k_cache.ndim;
  for (int d = 0; same_shape && d < k_cache.ndim; ++d) same_shape = v_cache.shape[d] == k_cache.shape[d];
  if (!same_shape) chk.fail("v_cache", "shape " + k_cache.shape_str() + " (k_cache's)", v_cache.shape_str());
  chk.last_dim_contiguous(k_cache, "k_cache");
  chk.last_dim_contiguous(v_cache, "v_cache");
  chk.aligned16(k_cache, "k_cache");
  chk.aligned16(v_cache, "v_cache");

  KvCacheDesc kv;
  kv.dtype = k_cache.dtype;
  kv.page_size = page_size;
  kv.num_kv_heads = chk.int32_size(k_cache, "k_cache", k_cache.ndim - 2);
  kv.head_dim = static_cast<int>(k_cache.size(-1));
  chk.head_dim(k_cache.size(-1), "k_cache");
  if (k_cache.size(-2) < 1) chk.fail("k_cache", "at least one KV head", k_cache.shape_str());
  auto paged = [&](const TensorView& t) {
    PagedCache c;
    c.data = t.data;
    if (t.ndim == 3) {
      c.token_stride = t.stride(0);
      c.page_stride = t.stride(0) * page_size;
      c.head_stride = t.stride(1);
    } else {
      c.page_stride = t.stride(0);
      c.token_stride = t.stride(1);
      c.head_stride = t.stride(2);
    }
    return c;
  };
  if (k_cache.ndim == 3) {
    if (k_cache.size(0) % page_size != 0) {
      chk.fail("k_cache", "num_slots a multiple of page_size " + std::to_string(page_size),
               std::to_string(k_cache.size(0)) + " slots");
    }
    kv.num_pages = k_cache.size(0) / page_size;
  } else {
    if (k_cache.size(1) != page_size) {
      chk.fail("k_cache", "size(1) == page_size " + std::to_string(page_size) + " in [num_pages, page_size, Hkv, D]",
               k_cache.shape_str());
    }
    kv.num_pages = k_cache.size(0);
  }
  kv.k = paged(k_cache);
  kv.v = paged(v_cache);
  return kv;
}

}  // namespace pagedmha::detail
