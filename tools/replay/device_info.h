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
/// A report file's prefix for a device name: the model's first word after "NVIDIA ",
/// lower case, letters and digits only ("NVIDIA H100 80GB HBM3" -> "h100", "cpu" -> "cpu",
/// "cuda:0" -> "cuda-0"); scripts/gpu.sh names the replays' files the same way.
std::string device_file_tag(const std::string& name);
/// Ceilings of PERFORMANCE.md for a known GPU (H200), zeros otherwise.
DeviceCeilings device_ceilings_of(Device device);

/// Bytes of memory of `device`: the host's physical memory for the CPU, the GPU's global
/// memory for CUDA; 0 where unknown.
double memory_bytes(Device device);

/// Visible CUDA devices (0 in builds without CUDA or without a driver).
int cuda_device_count();
/// Makes `device` the calling thread's current CUDA device (no-op for the CPU); the
/// tool's own kernels and events use the current device.
void set_thread_device(Device device);

}  // namespace pagedmha::tools
