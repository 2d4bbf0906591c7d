#include "pagedmha/tensor.h"

#include <sstream>

#include "pagedmha/error.h"

namespace pagedmha {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::bf16:
    case DType::fp16:
      return 2;
    case DType::fp32:
    case DType::int32:
      return 4;
    case DType::int64:
      return 8;
    case DType::uint8:
    case DType::fp8_e4m3:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::bf16: return "bf16";
    case DType::fp16: return "fp16";
    case DType::fp32: return "fp32";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::uint8: return "uint8";
    case DType::fp8_e4m3: return "fp8_e4m3";
  }
  return "unknown";
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

TensorView TensorView::from_arrays(void* data, DType dtype, Device device, int ndim,
                                   const int64_t* shape, const int64_t* strides) {
  if (ndim < 0 || ndim > kMaxDims) {
    throw_invalid_argument("TensorView", "ndim", "0.." + std::to_string(kMaxDims), std::to_string(ndim));
  }
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = ndim;
  for (int d = 0; d < ndim; ++d) t.shape[d] = shape[d];
  int64_t running = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    t.strides[d] = strides ? strides[d] : running;
    if (!strides && d > 0 && __builtin_mul_overflow(running, shape[d], &running)) {
      throw_invalid_argument("TensorView", "shape", "at most 2^63 - 1 elements (row-major strides)", t.shape_str());
    }
  }
  return t;
}

TensorView::TensorView(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape)
    : TensorView(from_arrays(data, dtype, device, static_cast<int>(shape.size()), shape.begin())) {}

namespace {
// Checked before from_arrays reads shape.size() strides.
const int64_t* matching_strides(std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides) {
  if (strides.size() != shape.size()) {
    throw_invalid_argument("TensorView", "strides", std::to_string(shape.size()) + " strides (one per dim)",
                           std::to_string(strides.size()));
  }
  return strides.begin();
}
}  // namespace

TensorView::TensorView(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape,
                       std::initializer_list<int64_t> strides)
    : TensorView(from_arrays(data, dtype, device, static_cast<int>(shape.size()), shape.begin(),
                             matching_strides(shape, strides))) {}

int64_t TensorView::numel() const {
  if (!defined()) return 0;
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) {
    if (__builtin_mul_overflow(n, shape[d], &n)) {
      throw_invalid_argument("TensorView", "shape", "at most 2^63 - 1 elements", shape_str());
    }
  }
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string TensorView::shape_str() const {
  if (!defined()) return "undefined";
  std::ostringstream os;
  os << '[';
  for (int d = 0; d < ndim; ++d) os << (d ? ", " : "") << shape[d];
  os << ']';
  return os.str();
}

TensorView TensorView::slice(int dim, int64_t start, int64_t length) const {
  if (dim < 0) dim += ndim;
  if (dim < 0 || dim >= ndim || start < 0 || length < 0 || start + length > shape[dim]) {
    // Built with a stream: GCC's -Wrestrict misfires on the equivalent string concatenation.
    std::ostringstream expected, given;
    expected << "within " << shape_str() << " on dim " << dim;
    given << '[' << start << ", " << start + length << ')';
    throw_invalid_argument("TensorView::slice", "range", expected.str(), given.str());
  }
  TensorView t = *this;
  t.data = static_cast<char*>(data) + start * strides[dim] * static_cast<int64_t>(element_size());
  t.shape[dim] = length;
  return t;
}

}  // namespace pagedmha
