#include "pagedmha/memory.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "core/checks.h"
#include "pagedmha/error.h"
#if PAGEDMHA_WITH_CUDA
#include "cuda/cuda_ops.h"
#endif

namespace pagedmha {

bool built_with_cuda() {
#if PAGEDMHA_WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_available() {
#if PAGEDMHA_WITH_CUDA
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

namespace detail {

void check_device_usable(const std::string& op, const std::string& arg, Device device) {
  if (device.is_cpu()) return;
#if PAGEDMHA_WITH_CUDA
  const std::string why = cuda::device_unavailable(device.index);
  if (!why.empty()) throw_invalid_argument(op, arg, "a usable CUDA device", device.str() + " (" + why + ")");
#else
  throw_invalid_argument(op, arg, "cpu (this build has no CUDA support)", device.str());
#endif
}

}  // namespace detail

#if !PAGEDMHA_WITH_CUDA
namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw Error(std::string(op) + ": device: expected cpu (this build has no CUDA support), got cuda");
}
}  // namespace
#endif

Buffer::Buffer(std::size_t bytes, Device device) : bytes_(bytes), device_(device) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    // Rounded up to the alignment; sizes within 63 bytes of 2^64 would wrap to 0.
    if (bytes <= std::numeric_limits<std::size_t>::max() - 63) data_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!data_) throw Error("Buffer: bytes: expected an allocatable size, got " + std::to_string(bytes));
  } else {
#if PAGEDMHA_WITH_CUDA
    data_ = cuda::malloc_device(bytes, device.index);
#else
    no_cuda("Buffer");
#endif
  }
}

Buffer Buffer::empty(std::initializer_list<int64_t> shape, DType dtype, Device device) {
  int64_t n = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t s : shape) {
    if (s < 0) throw_invalid_argument("Buffer::empty", "shape", "non-negative sizes", std::to_string(s));
    if (__builtin_mul_overflow(n, s, &n)) {
      throw_invalid_argument("Buffer::empty", "shape", "at most 2^63 - 1 bytes", "a product overflowing 64 bits");
    }
  }
  return Buffer(static_cast<std::size_t>(n), device);
}

Buffer::~Buffer() {
  if (!data_) return;
  if (device_.is_cpu()) {
    std::free(data_);
  } else {
#if PAGEDMHA_WITH_CUDA
    cuda::free_device(data_);
#endif
  }
}

Buffer::Buffer(Buffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_), device_(other.device_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Buffer tmp(std::move(*this));
    data_ = other.data_;
    bytes_ = other.bytes_;
    device_ = other.device_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

TensorView Buffer::view(std::initializer_list<int64_t> shape, DType dtype) const {
  TensorView t(data_, dtype, device_, shape);
  const std::size_t need = static_cast<std::size_t>(t.numel()) * dtype_size(dtype);
  if (need > bytes_) {
    throw_invalid_argument("Buffer::view", "shape", "at most " + std::to_string(bytes_) + " bytes",
                           t.shape_str() + " of " + dtype_name(dtype) + " (" + std::to_string(need) + " bytes)");
  }
  return t;
}

TensorView Buffer::bytes_view() const {
  return TensorView(data_, DType::uint8, device_, {static_cast<int64_t>(bytes_)});
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes,
                Stream stream) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if PAGEDMHA_WITH_CUDA
  cuda::memcpy_async(dst, src, bytes, stream.handle);
#else
  (void)stream;
  no_cuda("copy_bytes");
#endif
}

void copy(const TensorView& dst, const TensorView& src, Stream stream) {
  if (dst.dtype != src.dtype) {
    throw_invalid_argument("copy", "src", std::string("dtype ") + dtype_name(dst.dtype), dtype_name(src.dtype));
  }
  if (dst.numel() != src.numel()) {
    throw_invalid_argument("copy", "src", std::to_string(dst.numel()) + " elements", src.shape_str());
  }
  if (!dst.is_contiguous() || !src.is_contiguous()) {
    throw_invalid_argument("copy", "dst/src", "contiguous views", dst.shape_str() + " / " + src.shape_str());
  }
  copy_bytes(dst.data, dst.device, src.data, src.device, static_cast<std::size_t>(dst.numel()) * dst.element_size(),
             stream);
}

void fill_bytes(void* dst, Device device, int value, std::size_t bytes, Stream stream) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    std::memset(dst, value, bytes);
    return;
  }
#if PAGEDMHA_WITH_CUDA
  cuda::memset_async(dst, value, bytes, stream.handle);
#else
  (void)stream;
  no_cuda("fill_bytes");
#endif
}

void synchronize(Stream stream) {
#if PAGEDMHA_WITH_CUDA
  if (cuda::device_count() > 0) cuda::stream_synchronize(stream.handle);
#else
  (void)stream;
#endif
}

}  // namespace pagedmha
