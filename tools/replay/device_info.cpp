// Device names and the ceilings of PERFORMANCE.md, in their own file because they need
// the CUDA runtime in CUDA builds.
#include <unistd.h>

#include <cctype>
#include <string>

#include "pagedmha/error.h"
#include "pagedmha/tensor.h"
#include "replay/device_info.h"

#if defined(PAGEDMHA_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace pagedmha::tools {

std::string device_name(Device device) {
  if (device.is_cpu()) return "cpu";
#if defined(PAGEDMHA_WITH_CUDA)
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device.index) == cudaSuccess) return prop.name;
#endif
  return device.str();
}

std::string device_file_tag(const std::string& name) {
  std::string tag = name.rfind("NVIDIA ", 0) == 0 ? name.substr(7) : name;
  tag = tag.substr(0, tag.find(' '));
  for (char& ch : tag) {
    const auto u = static_cast<unsigned char>(ch);
    ch = std::isalnum(u) ? static_cast<char>(std::tolower(u)) : '-';
  }
  return tag;
}

DeviceCeilings device_ceilings_of(Device device) {
  DeviceCeilings c;
  if (device.is_cpu()) return c;
  c.gpu = device_name(device);
  // Measured on the H200 (PERFORMANCE.md): pure read stream 4.6 TB/s, bf16 GEMM ~760 TFLOP/s.
  if (c.gpu.find("H200") != std::string::npos) c.read_tbps = 4.6, c.copy_tbps = 4.25, c.bf16_tflops = 760.0;
  return c;
}

double memory_bytes(Device device) {
  if (device.is_cpu()) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? double(pages) * double(page) : 0.0;
  }
#if defined(PAGEDMHA_WITH_CUDA)
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device.index) == cudaSuccess) return double(prop.totalGlobalMem);
  cudaGetLastError();
#endif
  return 0.0;
}

int cuda_device_count() {
#if defined(PAGEDMHA_WITH_CUDA)
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

void set_thread_device(Device device) {
  if (!device.is_cuda()) return;
#if defined(PAGEDMHA_WITH_CUDA)
  const cudaError_t err = cudaSetDevice(device.index);
  if (err != cudaSuccess)
    throw Error("replay: cudaSetDevice(" + std::to_string(device.index) + "): " + cudaGetErrorString(err));
#else
  throw Error("replay: --device cuda: this build has no CUDA support");
#endif
}

}  // namespace pagedmha::tools
