// gather_page_table_with_padding (docs/semantics.md section 3):
// out[r, c] = req_to_page[req_pool_indices[r], c] for c < ceil(seq_lens[r] / P), 0 (the
// dummy page) for the other c < cols; rows >= bs untouched. One CTA per row; graph-safe
// (grid from bs, lengths read on the device).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/elementwise.cuh"
#include "cuda/cuda_ops.h"

namespace pagedmha::cuda {
namespace {

__global__ void __launch_bounds__(128) gather_page_table_kernel(const detail::Int32Matrix req_to_page,
                                                                const int32_t* __restrict__ req_pool_indices,
                                                                const int32_t* __restrict__ seq_lens,
                                                                const detail::Int32Matrix out, int cols,
                                                                int page_size) {
  const int r = blockIdx.x;
  const int32_t req = req_pool_indices[r];
  const int32_t len = seq_lens[r];
  // A request index outside the table reads nothing (the row becomes all padding);
  // the front end cannot check device values, and a gather must never fault.
  const bool valid_req = req >= 0 && req < req_to_page.rows;
  const int64_t pages = len > 0 && valid_req ? div_up(len, page_size) : 0;
  const int32_t* src = req_to_page.data + (valid_req ? req * req_to_page.row_stride : 0);
  int32_t* dst = out.data + r * out.row_stride;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    dst[c] = c < pages ? src[c] : 0;
  }
}

}  // namespace

void gather_page_table(const detail::GatherPageTableProblem& p) {
  if (p.bs == 0 || p.cols == 0) return;
  DeviceGuard guard(p.device.index);
  gather_page_table_kernel<<<p.bs, 128, 0, as_stream(p.stream)>>>(p.req_to_page, p.req_pool_indices, p.seq_lens,
                                                                  p.out, p.cols, p.page_size);
  PAGEDMHA_CUDA_CHECK_LAUNCH();
}

}  // namespace pagedmha::cuda
