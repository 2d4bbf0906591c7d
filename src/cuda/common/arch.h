// Which kernel family runs on a device: the one place the compute capability is read.
#pragma once

namespace pagedmha::cuda {

enum class KernelPath {
  portable,  // mma.sync + cp.async (sm_80 and later)
  sm90,      // wgmma + TMA, warp-specialised (sm_90a: H100 / H200)
};

/// sm90 on compute capability 9.0 when this build has the Hopper kernels, else portable.
/// PAGEDMHA_KERNELS=portable in the environment (read once) forces the portable path,
/// so the GPU suite can run on it on a Hopper machine.
KernelPath kernel_path(int device_index);

/// "sm90" / "portable".
const char* kernel_path_name(KernelPath path);

}  // namespace pagedmha::cuda
