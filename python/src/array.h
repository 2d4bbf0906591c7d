// The binding's one tensor edge: any DLPack producer (NumPy, PyTorch, CuPy, JAX) or a
// TypedArray arrives as an ArrayArg, zero-copy through nanobind's nb::ndarray, and is
// turned into a pagedmha::TensorView with the op and argument named in every error.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>

#include "pagedmha/tensor.h"

namespace pagedmha::python {

namespace nb = nanobind;

/// An array whose bits are read as `dtype` (NumPy has no bf16 or fp8: a uint16 array
/// is given as bf16, a uint8 one as fp8_e4m3). Python: pagedmha.TypedArray.
struct TypedArray {
  nb::ndarray<> array;
  DType dtype;
};

/// A bound function's tensor argument: the imported array (invalid when the caller
/// passed None) and, for a TypedArray, the dtype its bits stand for.
struct ArrayArg {
  nb::ndarray<> array;
  std::optional<DType> dtype;
};

/// The view of `arg`; an undefined view for None. Throws pagedmha::Error
/// "<op>: <name>: expected ..., got ..." for a dtype, device or rank the library has no
/// name for. The view borrows the array: it is valid while `arg` lives.
TensorView to_view(const ArrayArg& arg, const char* op, const char* name);

/// DType of a DLPack dtype, if the library has one.
std::optional<DType> dtype_from_dlpack(nb::dlpack::dtype dt);

/// Parses "cpu", "cuda" (device 0) or "cuda:N" (anything whose str() is one of these,
/// e.g. a torch.device).
Device parse_device(const std::string& text, const char* op, const char* name);

}  // namespace pagedmha::python

namespace nanobind::detail {

/// Accepts a TypedArray, anything nb::ndarray imports (never converting, so outputs are
/// written in place), and None where the argument allows it.
template <>
struct type_caster<pagedmha::python::ArrayArg> {
  NB_TYPE_CASTER(pagedmha::python::ArrayArg, const_name("ArrayLike"))

  bool from_python(handle src, uint32_t flags, cleanup_list* cleanup) noexcept {
    if (src.is_none()) {
      value = {};
      return (flags & (uint32_t)cast_flags::accepts_none) != 0;
    }
    if (isinstance<pagedmha::python::TypedArray>(src)) {
      const auto* typed = inst_ptr<pagedmha::python::TypedArray>(src);
      value = {typed->array, typed->dtype};
      return true;
    }
    make_caster<ndarray<>> inner;
    if (!inner.from_python(src, flags & ~(uint32_t)cast_flags::convert, cleanup)) return false;
    value = {std::move(inner.value), std::nullopt};
    return true;
  }

  static handle from_cpp(const pagedmha::python::ArrayArg& arg, rv_policy policy,
                         cleanup_list* cleanup) noexcept {
    return make_caster<ndarray<>>::from_cpp(arg.array, policy, cleanup);
  }
};

}  // namespace nanobind::detail
