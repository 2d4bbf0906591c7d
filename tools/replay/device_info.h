// Device names and measured ceilings for reports.
#pragma once

#include <string>

#include "pagedmha/tensor.h"

namespace pagedmha::tools {

struct DeviceCeilings {
  std::string gpu;           // empty on the CPU
  double read_tbps = 0.0;    // 0: unknown device
  double copy_tbps = 0.0;
  double bf16_tflops = 0.0;
};

/// "NVIDIA H200" (cudaGetDeviceProperties) or "cpu".
std::string device_name(Device device);
/// Ceilings of PERFORMANCE.md for a known GPU (H200), zeros otherwise.
DeviceCeilings device_ceilings_of(Device device);

}  // namespace pagedmha::tools
