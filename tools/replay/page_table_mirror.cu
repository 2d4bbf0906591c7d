// Scatter of the replay's page-table updates: one launch per step and group.
#include <cuda_runtime.h>

#include <string>

#include "pagedmha/error.h"
#include "replay/cuda_check.h"
#include "replay/page_table_mirror.h"

namespace pagedmha::tools {
namespace {

__global__ void scatter_pairs_kernel(int32_t* out, const int2* pairs, int64_t n) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) out[pairs[i].x] = pairs[i].y;
}

}  // namespace

void scatter_pairs_cuda(int32_t* out, const int32_t* pairs, int64_t n, Stream stream) {
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  scatter_pairs_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream.handle)>>>(
      out, reinterpret_cast<const int2*>(pairs), n);
  check_cuda(cudaGetLastError(), "scatter_pairs_cuda", "launch failed");
}

}  // namespace pagedmha::tools
