// Which kernels run on a device: the one place the compute capability is read.
// Plain C++ (no CUDA headers): the front end (src/core) checks devices through it.
#pragma once

#include <atomic>
#include <string_view>

namespace pagedmha::cuda {

constexpr int kMaxDevices = 64;

/// compute() (an int >= -1) for `device`, computed once per device and kept in `cache`
/// (0: not yet; else value + 1, so -1, "could not be read", is computed again). Devices
/// past kMaxDevices are computed every time.
template <class F>
int once_per_device(std::atomic<int> (&cache)[kMaxDevices], int device, F compute) {
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    const int v = cache[device].load(std::memory_order_relaxed);
    if (v > 0) return v - 1;
  }
  const int v = compute();
  if (cached) cache[device].store(v + 1, std::memory_order_relaxed);
  return v;
}

enum class KernelPath {
  portable,  // mma.sync + cp.async (sm_80 and later)
  sm90,      // wgmma + TMA, warp-specialised (sm_90a: H100 / H200)
};

/// sm90 on compute capability 9.0 when this build has the Hopper kernels, else portable.
/// The environment variable PAGEDMHA_KERNELS (read once) forces the portable path:
/// `portable`, or `sm89`, which also caps shared memory per CTA at sm_89's 99 KB
/// (max_smem_per_block), so that a Hopper GPU runs the kernel configurations an L40 or
/// RTX 4090 gets. Any other non-empty value is an error.
KernelPath kernel_path(int device_index);

/// "sm90" / "portable".
const char* kernel_path_name(KernelPath path);

/// Compute capability of device `device_index` as major * 10 + minor (9.0 -> 90), read
/// once per device; -1 when it cannot be read (no driver, no such device: the op's own
/// CUDA calls report that).
int compute_capability(int device_index);

/// Shared memory one CTA may use on the device (the opt-in limit), read once per device.
int max_smem_per_block(int device_index);

/// The opt-in shared memory per CTA of sm_86 / sm_89, the smallest of the supported GPUs
/// (sm_80: 163 KB, sm_90: 227 KB). Every kernel configuration a GPU may fall back to
/// fits in it.
inline constexpr int kSm89SmemPerBlock = 99 * 1024;

/// This build's PAGEDMHA_CUDA_ARCHS, comma-separated ("80,89,90a").
const char* built_archs();

/// Whether code built for `archs` (PAGEDMHA_CUDA_ARCHS entries, comma-separated) runs on
/// compute capability `cc` (major * 10 + minor). An entry NN holds sm_NN SASS (runs on
/// major N.x from NN on) and compute_NN PTX (the driver compiles it for any cc >= NN);
/// NN-real only the SASS, NN-virtual only the PTX; NNa (arch-specific SASS) runs on
/// exactly NN.
constexpr bool archs_run_on(std::string_view archs, int cc) {
  while (!archs.empty()) {
    const std::size_t comma = archs.find(',');
    std::string_view e = archs.substr(0, comma);
    archs = comma == std::string_view::npos ? std::string_view{} : archs.substr(comma + 1);
    int n = 0, digits = 0;
    while (digits < static_cast<int>(e.size()) && e[digits] >= '0' && e[digits] <= '9') {
      n = n * 10 + (e[digits] - '0');
      ++digits;
    }
    if (digits == 0) continue;
    e.remove_prefix(digits);
    const bool specific = !e.empty() && e.front() == 'a';
    if (specific) e.remove_prefix(1);
    const bool sass = e != "-virtual", ptx = !specific && e != "-real";
    if (specific ? cc == n : (ptx && cc >= n) || (sass && cc >= n && cc / 10 == n / 10)) return true;
  }
  return false;
}

}  // namespace pagedmha::cuda
