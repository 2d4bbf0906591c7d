// Page-table gathering and the small metadata helpers on the CPU.
#include <algorithm>

#include "cpu/cpu_ops.h"

namespace pagedmha::cpu {

void gather_page_table(const detail::GatherPageTableProblem& p) {
  const int64_t P = p.page_size;
#pragma omp parallel for schedule(static) if (int64_t{p.bs} * p.cols > (1 << 16))
  for (int r = 0; r < p.bs; ++r) {
    const int64_t used = std::min<int64_t>((int64_t{p.seq_lens[r]} + P - 1) / P, p.cols);
    const int32_t* src = p.req_to_page.data + int64_t{p.req_pool_indices[r]} * p.req_to_page.row_stride;
    int32_t* dst = p.out.data + int64_t{r} * p.out.row_stride;
    std::copy_n(src, used, dst);
    std::fill(dst + used, dst + p.cols, 0);  // the dummy page
  }
}

namespace {
int32_t slot(const detail::MetadataProblem& p, int64_t r, int64_t pos) {
  const int64_t page = p.page_table.data[r * p.page_table.row_stride + pos / p.page_size];
  return static_cast<int32_t>(page * p.page_size + pos % p.page_size);
}
}  // namespace

void metadata(const detail::MetadataProblem& p) {
  switch (p.op) {
    case detail::MetadataOp::cumsum_lengths: {
      int32_t total = 0;
      p.out[0] = 0;
      for (int64_t i = 0; i < p.n; ++i) p.out[i + 1] = total += p.in[i];
      break;
    }
    case detail::MetadataOp::clamp_seq_lens:
      // Backwards, so that out == in stays correct for any repeat.
      for (int64_t i = p.n - 1; i >= 0; --i) {
        const int32_t v = std::min(std::max(p.in[i], p.value), p.max_value);
        for (int j = p.repeat - 1; j >= 0; --j) p.out[i * p.repeat + j] = v;
      }
      break;
    case detail::MetadataOp::decode_write_slots: {
      const int N = p.value;
      for (int64_t r = 0; r < p.n; ++r) {
        for (int j = 0; j < N; ++j) p.out[r * N + j] = slot(p, r, std::max<int64_t>(int64_t{p.in[r]} - N + j, 0));
      }
      break;
    }
    case detail::MetadataOp::extend_write_slots:
      for (int64_t r = 0; r < p.n; ++r) {
        const int64_t n = int64_t{p.cu_seqlens_q[r + 1]} - p.cu_seqlens_q[r];
        for (int64_t i = 0; i < n; ++i) p.out[p.cu_seqlens_q[r] + i] = slot(p, r, p.in[r] + i);
      }
      break;
  }
}

}  // namespace pagedmha::cpu
