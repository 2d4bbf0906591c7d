// The extension module pagedmha._pagedmha. The Python package (python/pagedmha) wraps it:
// default streams, dtype names, the torch custom ops.
#include <nanobind/nanobind.h>

#include "array.h"
#include "pagedmha/error.h"
#include "pagedmha/memory.h"

namespace pagedmha::python {

void bind_ops(nb::module_& m);
void bind_backend(nb::module_& m);

namespace {

void bind_types(nb::module_& m) {
  nb::enum_<DType>(m, "DType", "Element types understood by the ops.")
      .value("bf16", DType::bf16, "bfloat16 (the top 16 bits of an IEEE fp32)")
      .value("fp16", DType::fp16, "IEEE binary16")
      .value("fp32", DType::fp32, "IEEE binary32")
      .value("int32", DType::int32)
      .value("int64", DType::int64)
      .value("uint8", DType::uint8)
      .value("fp8_e4m3", DType::fp8_e4m3, "OCP E4M3FN (bias 7, no infinities, max 448)");

  nb::class_<TypedArray>(m, "TypedArray",
                         "An array whose bits the ops read as another dtype of the same size\n"
                         "(see view_as). Holds a reference to the array, copies nothing.")
      .def_prop_ro("dtype", [](const TypedArray& t) { return t.dtype; })
      .def_prop_ro("shape",
                   [](const TypedArray& t) {
                     nb::list shape;
                     for (size_t d = 0; d < t.array.ndim(); ++d) shape.append(t.array.shape(d));
                     return nb::tuple(shape);
                   })
      .def("__repr__", [](const TypedArray& t) {
        nb::list shape;
        for (size_t d = 0; d < t.array.ndim(); ++d) shape.append(t.array.shape(d));
        return nb::str("TypedArray(dtype={}, shape={})").format(dtype_name(t.dtype), nb::tuple(shape));
      });

  m.def(
      "view_as",
      [](const ArrayArg& arg, DType dtype) {
        // A read-only array is viewed too (the ops refuse it only where they write); a
        // TypedArray is viewed through to its array.
        const char* expected = "an array (NumPy, PyTorch, CuPy or any DLPack producer) or a pagedmha.TypedArray";
        if (arg.rejected.is_valid()) (void)to_view(arg, "view_as", "array", Access::read);  // names it
        if (!arg.array.is_valid()) throw_invalid_argument("view_as", "array", expected, "NoneType None");
        const nb::ndarray<nb::ro>& array = arg.array;
        if (array.dtype().lanes != 1 || array.itemsize() != dtype_size(dtype)) {
          throw_invalid_argument("view_as", "array",
                                 std::to_string(dtype_size(dtype)) + "-byte elements for " +
                                     dtype_name(dtype),
                                 std::to_string(array.itemsize()) + "-byte elements");
        }
        return TypedArray{array, dtype, arg.writable};
      },
      nb::arg("array").none(), nb::arg("dtype"),
      "Reads `array`'s elements as `dtype` without copying: NumPy has no bf16 or fp8, so a\n"
      "uint16 array holding bf16 bits is passed as view_as(a, DType.bf16), a uint8 one\n"
      "holding fp8 E4M3FN bits as view_as(a, DType.fp8_e4m3). Element sizes must match.\n"
      "A read-only array is viewed too (an op refuses it only where it writes); a\n"
      "TypedArray is viewed through to its array.\n\n"
      "Returns:\n    TypedArray, accepted by every op wherever an array is.\n\n"
      "Raises:\n    pagedmha.Error: element size mismatch, None or an object that is no array.");

  m.def("cuda_available", &cuda_available,
        "True when the library was built with CUDA and a CUDA device is visible.");
  m.def("built_with_cuda", &built_with_cuda, "Whether the library was compiled with its CUDA kernels.");
  // Whether an instance of an extension class has been constructed: the Python
  // constructors refuse a second __init__ with pagedmha.Error (nanobind warns and raises a
  // TypeError listing the signature, as if the arguments were wrong).
  m.def("_constructed", [](nb::handle obj) { return nb::inst_check(obj) && nb::inst_ready(obj); }, nb::arg("obj"));
}

}  // namespace

}  // namespace pagedmha::python

NB_MODULE(_pagedmha, m) {
  namespace py = pagedmha::python;
  m.doc() = "pagedmha: paged-KV multi-head attention (native extension).";
  nanobind::exception<pagedmha::Error>(m, "Error", PyExc_ValueError);
  py::bind_types(m);
  py::bind_ops(m);
  py::bind_backend(m);
}
