#include "cuda/common/arch.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "cuda/common/check.cuh"

namespace pagedmha::cuda {

KernelPath kernel_path(int device_index) {
  static const bool forced_portable = [] {
    const char* v = std::getenv("PAGEDMHA_KERNELS");
    return v != nullptr && std::strcmp(v, "portable") == 0;
  }();
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];  // 0: unknown, else major * 10 + minor + 1
  int cc = 0;
  if (device_index >= 0 && device_index < kMaxDevices) cc = cache[device_index].load(std::memory_order_relaxed) - 1;
  if (cc < 0) {
    int major = 0, minor = 0;
    PAGEDMHA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index));
    PAGEDMHA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index));
    cc = major * 10 + minor;
    if (device_index >= 0 && device_index < kMaxDevices) cache[device_index].store(cc + 1, std::memory_order_relaxed);
  }
#if PAGEDMHA_WITH_SM90
  if (cc == 90 && !forced_portable) return KernelPath::sm90;
#endif
  return KernelPath::portable;
}

const char* kernel_path_name(KernelPath path) { return path == KernelPath::sm90 ? "sm90" : "portable"; }

}  // namespace pagedmha::cuda
