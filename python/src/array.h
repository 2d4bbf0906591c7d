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
  nb::ndarray<nb::ro> array;
  DType dtype;
  bool writable = true;  ///< whether the viewed array's producer allows writes
};

/// A bound function's tensor argument: the imported array (invalid when the caller
/// passed None or something that is no array), whether the producer allows writes, for
/// a TypedArray the dtype its bits stand for, and the object nothing could import (its
/// error is raised by to_view, naming the argument).
struct ArrayArg {
  nb::ndarray<nb::ro> array;
  std::optional<DType> dtype;
  bool writable = true;
  nb::object rejected;
};

/// Whether the op writes the argument (outputs, caches, workspaces).
enum class Access { read, write };

/// The view of `arg`; an undefined view for None. Throws pagedmha::Error
/// "<op>: <name>: expected ..., got ..." for an object that is no array, a read-only
/// array where `access` is write, or a dtype, device or rank the library has no name
/// for. The view borrows the array: it is valid while `arg` lives.
TensorView to_view(const ArrayArg& arg, const char* op, const char* name, Access access = Access::write);

/// DType of a DLPack dtype, if the library has one.
std::optional<DType> dtype_from_dlpack(nb::dlpack::dtype dt);

/// A Python float as the library's float32. Throws pagedmha::Error "<op>: <name>: ..." for
/// a finite value that float32 cannot hold: one that would overflow to infinity, or a
/// nonzero one that would round to 0 (a scale of 1e-50 would otherwise silently zero the
/// output). NaN and infinities pass through to the op's own checks.
float to_float32(double value, const char* op, const char* name);

/// Parses "cpu", "cuda" (device 0) or "cuda:N" (anything whose str() is one of these,
/// e.g. a torch.device; the whole str(), embedded NULs included).
Device parse_device(nb::handle value, const char* op, const char* name);

}  // namespace pagedmha::python

namespace nanobind::detail {

/// Accepts every object, so that to_view can name the argument in the error: a
/// TypedArray, anything nb::ndarray imports (never converting, so outputs are written in
/// place; read-only arrays are marked), None, or else the object as `rejected`.
template <>
struct type_caster<pagedmha::python::ArrayArg> {
  NB_TYPE_CASTER(pagedmha::python::ArrayArg, const_name("ArrayLike"))

  bool from_python(handle src, uint32_t flags, cleanup_list* cleanup) noexcept {
    value = {};
    if (src.is_none()) return true;
    if (isinstance<pagedmha::python::TypedArray>(src)) {
      const auto* typed = inst_ptr<pagedmha::python::TypedArray>(src);
      value.array = typed->array;
      value.dtype = typed->dtype;
      value.writable = typed->writable;
      return true;
    }
    const uint32_t no_convert = flags & ~(uint32_t)cast_flags::convert;
    make_caster<ndarray<>> writable;
    if (writable.from_python(src, no_convert, cleanup)) {
      value.array = ndarray<ro>(writable.value);
      return true;
    }
    make_caster<ndarray<ro>> read_only;
    if (read_only.from_python(src, no_convert, cleanup)) {
      value.array = std::move(read_only.value);
      value.writable = false;
      return true;
    }
    value.rejected = borrow(src);
    return true;
  }

  static handle from_cpp(const pagedmha::python::ArrayArg& arg, rv_policy policy,
                         cleanup_list* cleanup) noexcept {
    return make_caster<ndarray<ro>>::from_cpp(arg.array, policy, cleanup);
  }
};

}  // namespace nanobind::detail
