// Non-owning tensor views, element types, devices and streams.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace pagedmha {

/// Element types understood by the ops.
/// fp8_e4m3 is the OCP E4M3FN format (bias 7, no infinities, max finite 448);
/// bf16 is bfloat16 (the top 16 bits of an IEEE fp32).
enum class DType : uint8_t { bf16, fp16, fp32, int32, int64, uint8, fp8_e4m3 };

/// Size of one element in bytes.
std::size_t dtype_size(DType dtype);
/// Lower-case name: "bf16", "fp16", "fp32", "int32", "int64", "uint8", "fp8_e4m3".
const char* dtype_name(DType dtype);

enum class DeviceType : uint8_t { cpu, cuda };

/// Where a tensor's memory lives: the host, or CUDA device `index`.
struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static constexpr Device cpu() { return Device{DeviceType::cpu, 0}; }
  static constexpr Device cuda(int index = 0) { return Device{DeviceType::cuda, index}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  /// "cpu" or "cuda:N".
  std::string str() const;
  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && (a.type == DeviceType::cpu || a.index == b.index);
  }
};

/// A CUDA stream (`cudaStream_t`) carried without including CUDA headers.
/// A null handle is the legacy default stream. CPU ops ignore the stream and
/// complete before returning.
struct Stream {
  void* handle = nullptr;
};

/// A non-owning view of a strided tensor: data pointer, dtype, device, shape and
/// strides counted in elements (not bytes). A default-constructed view is
/// "undefined" and stands for an absent optional argument.
struct TensorView {
  static constexpr int kMaxDims = 6;

  void* data = nullptr;
  DType dtype = DType::fp32;
  Device device{};
  int ndim = -1;  // -1: undefined (absent); 0: scalar
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  TensorView() = default;
  /// A view with explicit strides (in elements).
  TensorView(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape,
             std::initializer_list<int64_t> strides);
  /// A row-major contiguous view.
  TensorView(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape);
  /// Same, from arrays of `ndim` sizes (and strides; null strides: contiguous).
  static TensorView from_arrays(void* data, DType dtype, Device device, int ndim, const int64_t* shape,
                                const int64_t* strides = nullptr);

  bool defined() const { return ndim >= 0; }
  int64_t size(int dim) const { return shape[dim < 0 ? dim + ndim : dim]; }
  int64_t stride(int dim) const { return strides[dim < 0 ? dim + ndim : dim]; }
  int64_t numel() const;
  std::size_t element_size() const { return dtype_size(dtype); }
  /// True when the strides are those of a row-major dense tensor (size-1 dims ignored).
  bool is_contiguous() const;
  /// "[2, 8, 128]".
  std::string shape_str() const;
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  /// The view with dim `dim` narrowed to [start, start + length).
  TensorView slice(int dim, int64_t start, int64_t length) const;
};

}  // namespace pagedmha
