// CUDA runtime error check of the replay tool (CUDA builds only): a failed call throws
// pagedmha::Error "<who>: <what>: <CUDA error string>".
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "pagedmha/error.h"

namespace pagedmha::tools {

inline void check_cuda(cudaError_t err, const char* who, const char* what) {
  if (err != cudaSuccess) throw Error(std::string(who) + ": " + what + ": " + cudaGetErrorString(err));
}

}  // namespace pagedmha::tools
