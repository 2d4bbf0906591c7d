// Error checking for CUDA runtime calls and kernel launches.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "pagedmha/error.h"

namespace pagedmha::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  // No driver or device is the user's situation, not a failure of this call: one sentence.
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    throw Error(std::string("CUDA is not available: ") +
                (err == cudaErrorNoDevice ? "no CUDA device is visible"
                                          : "no CUDA driver is loaded, or it is older than this build's CUDA runtime"));
  }
  // The file's name only: an absolute build path says nothing to the user.
  const char* base = file;
  for (const char* c = file; *c; ++c)
    if (*c == '/') base = c + 1;
  throw Error(std::string("CUDA error: ") + what + " returned " + cudaGetErrorName(err) + " (" +
              cudaGetErrorString(err) + ") at " + base + ":" + std::to_string(line));
}

}  // namespace pagedmha::cuda

#define PAGEDMHA_CUDA_CHECK(expr)                                                         \
  do {                                                                                    \
    const cudaError_t pagedmha_err_ = (expr);                                             \
    if (pagedmha_err_ != cudaSuccess) {                                                   \
      ::pagedmha::cuda::throw_cuda_error(pagedmha_err_, #expr, __FILE__, __LINE__);       \
    }                                                                                     \
  } while (0)

// After a launch: reports configuration errors without synchronising.
#define PAGEDMHA_CUDA_CHECK_LAUNCH() PAGEDMHA_CUDA_CHECK(cudaGetLastError())
