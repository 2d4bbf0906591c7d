// Owning buffers and byte copies on the host or a CUDA device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "pagedmha/tensor.h"

namespace pagedmha {

/// True when this build has CUDA support and at least one CUDA device is visible.
bool cuda_available();
/// Whether the library was compiled with its CUDA kernels.
bool built_with_cuda();

/// An owning, contiguous allocation on the host (64-byte aligned) or a CUDA device
/// (cudaMalloc). Move-only. Allocating never happens inside the ops: callers and
/// the backend own every buffer an op touches.
class Buffer {
 public:
  Buffer() = default;
  /// `bytes` bytes on `device`, uninitialised. Throws Error when the allocation fails.
  Buffer(std::size_t bytes, Device device);
  /// A buffer sized for a dense tensor of `shape` and `dtype`.
  static Buffer empty(std::initializer_list<int64_t> shape, DType dtype, Device device);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  /// A contiguous view of the first numel(shape) elements; throws if too small.
  TensorView view(std::initializer_list<int64_t> shape, DType dtype) const;
  /// A one-dimensional uint8 view of the whole buffer.
  TensorView bytes_view() const;

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_{};
};

/// Copies `bytes` bytes between any two devices (cudaMemcpyAsync on `stream` when
/// either side is CUDA; memcpy otherwise). Host-to-host copies are synchronous.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes,
                Stream stream = {});
/// Copies a contiguous view into another of the same dtype and numel.
void copy(const TensorView& dst, const TensorView& src, Stream stream = {});
/// Sets `bytes` bytes at `dst` to `value` (cudaMemsetAsync on CUDA).
void fill_bytes(void* dst, Device device, int value, std::size_t bytes, Stream stream = {});
/// Waits for all work on `stream` (no-op for CPU).
void synchronize(Stream stream = {});

}  // namespace pagedmha
