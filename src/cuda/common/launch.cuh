// Host helpers shared by the kernel launchers.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/check.cuh"

namespace pagedmha::cuda {

/// Makes `index` the current device for the scope (kernels launch on the op's device).
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    PAGEDMHA_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != index) PAGEDMHA_CUDA_CHECK(cudaSetDevice(index));
    changed_ = previous_ != index;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

/// Allows `kernel` `bytes` of dynamic shared memory (needed above 48 KB). Not a stream
/// operation, so it is legal during CUDA-graph capture.
template <class Kernel>
void allow_dynamic_smem(Kernel kernel, int bytes) {
  PAGEDMHA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace pagedmha::cuda
