#include "array.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "pagedmha/error.h"

namespace pagedmha::python {

namespace {

using Code = nb::dlpack::dtype_code;

std::string dlpack_dtype_str(nb::dlpack::dtype dt) {
  std::string s;
  switch (static_cast<Code>(dt.code)) {
    case Code::Int: s = "int" + std::to_string(dt.bits); break;
    case Code::UInt: s = "uint" + std::to_string(dt.bits); break;
    case Code::Float: s = "float" + std::to_string(dt.bits); break;
    case Code::Bfloat: s = "bfloat" + std::to_string(dt.bits); break;
    case Code::Complex: s = "complex" + std::to_string(dt.bits); break;
    case Code::Bool: s = "bool"; break;
    case Code::Float8_E4M3: s = "float8_e4m3"; break;
    case Code::Float8_E4M3FN: s = "float8_e4m3fn"; break;
    case Code::Float8_E4M3FNUZ: s = "float8_e4m3fnuz"; break;
    case Code::Float8_E5M2: s = "float8_e5m2"; break;
    case Code::Float8_E5M2FNUZ: s = "float8_e5m2fnuz"; break;
    default:
      s = "DLPack dtype code " + std::to_string(dt.code) + " (" + std::to_string(dt.bits) +
          " bits)";
  }
  if (dt.lanes != 1) s += " x" + std::to_string(dt.lanes) + " lanes";
  return s;
}

}  // namespace

std::optional<DType> dtype_from_dlpack(nb::dlpack::dtype dt) {
  if (dt.lanes != 1) return std::nullopt;
  switch (static_cast<Code>(dt.code)) {
    case Code::Bfloat:
      if (dt.bits == 16) return DType::bf16;
      break;
    case Code::Float:
      if (dt.bits == 16) return DType::fp16;
      if (dt.bits == 32) return DType::fp32;
      break;
    case Code::Int:
      if (dt.bits == 32) return DType::int32;
      if (dt.bits == 64) return DType::int64;
      break;
    case Code::UInt:
      if (dt.bits == 8) return DType::uint8;
      break;
    case Code::Float8_E4M3FN:  // OCP E4M3FN: torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn
      if (dt.bits == 8) return DType::fp8_e4m3;
      break;
    default:
      break;
  }
  return std::nullopt;
}

static_assert(std::numeric_limits<float>::is_iec559, "a double past float's range narrows to inf");

float to_float32(double value, const char* op, const char* name) {
  const auto narrow = static_cast<float>(value);
  if (std::isfinite(value) && (!std::isfinite(narrow) || (value != 0.0 && narrow == 0.0f))) {
    char got[32];
    std::snprintf(got, sizeof got, "%.9g", value);  // 9 digits: told apart from FLT_MAX
    throw_invalid_argument(op, name, "a value float32 holds (one rounding to neither 0 nor infinity)", got);
  }
  return narrow;
}

Device parse_device(nb::handle value, const char* op, const char* name) {
  // The whole string: c_str() would stop at an embedded NUL ("cpu\0junk" read as "cpu").
  const nb::str str(value);
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(str.ptr(), &size);
  if (data == nullptr) {
    PyErr_Clear();
    throw_invalid_argument(op, name, "device \"cpu\", \"cuda\" or \"cuda:N\"", nb::repr(value).c_str());
  }
  const std::string text(data, static_cast<std::size_t>(size));
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() < 12 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos) {
    return Device::cuda(std::stoi(text.substr(5)));
  }
  throw_invalid_argument(op, name, "device \"cpu\", \"cuda\" or \"cuda:N\"",
                         text.find('\0') == std::string::npos ? "\"" + text + "\"" : std::string(nb::repr(str).c_str()));
}

TensorView to_view(const ArrayArg& arg, const char* op, const char* name, Access access) {
  if (arg.rejected.is_valid()) {
    std::string got = nb::type_name(arg.rejected.type()).c_str();
    std::string text = nb::repr(arg.rejected).c_str();
    if (text.size() > 60) text = text.substr(0, 57) + "...";
    throw_invalid_argument(op, name,
                           "an array (NumPy, PyTorch, CuPy or any DLPack producer) or a pagedmha.TypedArray",
                           got + " " + text);
  }
  const nb::ndarray<nb::ro>& a = arg.array;
  if (!a.is_valid()) return {};
  if (access == Access::write && !arg.writable) {
    throw_invalid_argument(op, name, "a writable array (the op writes it)", "a read-only array");
  }

  const std::optional<DType> own = dtype_from_dlpack(a.dtype());
  DType dtype;
  if (arg.dtype) {
    dtype = *arg.dtype;
    // A TypedArray reinterprets bits element by element: the sizes must agree.
    if (a.dtype().lanes != 1 || a.itemsize() != dtype_size(dtype)) {
      throw_invalid_argument(op, name,
                             std::string("an array of ") + std::to_string(dtype_size(dtype)) +
                                 "-byte elements to read as " + dtype_name(dtype),
                             dlpack_dtype_str(a.dtype()));
    }
  } else if (own) {
    dtype = *own;
  } else {
    throw_invalid_argument(op, name,
                           "a dtype pagedmha reads (bf16, fp16, fp32, int32, int64, uint8 or fp8_e4m3; "
                           "ops.h gives each argument's)",
                           dlpack_dtype_str(a.dtype()));
  }

  Device device;
  switch (a.device_type()) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value:  // pinned host memory is host memory
      device = Device::cpu();
      break;
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value:
      device = Device::cuda(a.device_id());
      break;
    default:
      throw_invalid_argument(op, name, "a cpu or cuda array",
                             "DLPack device type " + std::to_string(a.device_type()));
  }

  if (a.ndim() > static_cast<size_t>(TensorView::kMaxDims)) {
    throw_invalid_argument(op, name, "at most " + std::to_string(TensorView::kMaxDims) + " dims",
                           std::to_string(a.ndim()) + " dims");
  }
  // nanobind fills in row-major strides when the producer gives none; both are in elements.
  return TensorView::from_arrays(const_cast<void*>(a.data()), dtype, device, static_cast<int>(a.ndim()), a.shape_ptr(),
                                 a.stride_ptr());
}

}  // namespace pagedmha::python
