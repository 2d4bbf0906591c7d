#include "cuda/common/arch.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/common/check.cuh"
#include "pagedmha/error.h"

#ifndef PAGEDMHA_CUDA_ARCHS
#error "PAGEDMHA_CUDA_ARCHS (the comma-separated architecture list) comes from src/CMakeLists.txt"
#endif

namespace pagedmha::cuda {
namespace {

enum class Forced { none, portable, sm89 };

Forced forced() {
  static const Forced f = [] {
    const char* v = std::getenv("PAGEDMHA_KERNELS");
    if (v == nullptr || *v == '\0') return Forced::none;
    if (std::strcmp(v, "portable") == 0) return Forced::portable;
    if (std::strcmp(v, "sm89") == 0) return Forced::sm89;
    throw Error(std::string("PAGEDMHA_KERNELS: expected portable, sm89 or unset, got '") + v + "'");
  }();
  return f;
}

// One attribute per device, read once. Returns -1 when the runtime cannot read it (then
// read again next time), clearing that error so that no later launch check reports it.
int device_attribute(std::atomic<int> (&cache)[kMaxDevices], int device_index, cudaDeviceAttr attr) {
  return once_per_device(cache, device_index, [&] {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, attr, device_index) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return v;
  });
}

}  // namespace

int compute_capability(int device_index) {
  static std::atomic<int> major_cache[kMaxDevices], minor_cache[kMaxDevices];
  const int major = device_attribute(major_cache, device_index, cudaDevAttrComputeCapabilityMajor);
  const int minor = device_attribute(minor_cache, device_index, cudaDevAttrComputeCapabilityMinor);
  return major < 0 || minor < 0 ? -1 : major * 10 + minor;
}

int max_smem_per_block(int device_index) {
  static std::atomic<int> cache[kMaxDevices];
  int v = device_attribute(cache, device_index, cudaDevAttrMaxSharedMemoryPerBlockOptin);
  if (v < 0) PAGEDMHA_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_index));
  return forced() == Forced::sm89 && v > kSm89SmemPerBlock ? kSm89SmemPerBlock : v;
}

KernelPath kernel_path(int device_index) {
  const bool forced_portable = forced() != Forced::none;
#if PAGEDMHA_WITH_SM90
  if (compute_capability(device_index) == 90 && !forced_portable) return KernelPath::sm90;
#else
  (void)device_index;
  (void)forced_portable;
#endif
  return KernelPath::portable;
}

const char* kernel_path_name(KernelPath path) { return path == KernelPath::sm90 ? "sm90" : "portable"; }

const char* built_archs() { return PAGEDMHA_CUDA_ARCHS; }

}  // namespace pagedmha::cuda
