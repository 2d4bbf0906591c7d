// merge_attention_states on the CPU: per (row, head) the weights exp(lse_i - M) of the
// parts and the sink, then one fp32 weighted sum of the parts' rows, rounded once.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/convert.h"
#include "cpu/cpu_ops.h"

namespace pagedmha::cpu {

void merge_attention_states(const detail::MergeProblem& p) {
  const int K = p.num_parts, D = p.head_dim;
  const int64_t items = int64_t{p.num_rows} * p.num_heads;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#pragma omp parallel if (items * K * D > (1 << 16))
  {
    std::vector<float> acc(static_cast<std::size_t>(D)), row(static_cast<std::size_t>(D));
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t t = item / p.num_heads;
      const int h = static_cast<int>(item % p.num_heads);
      const float* lse = p.lse + t * p.lse_row_stride + h * p.lse_head_stride;
      const float sink = p.sinks ? p.sinks[h] : kNegInf;
      float m = sink;
      for (int i = 0; i < K; ++i) m = std::fmax(m, lse[i * p.lse_part_stride]);
      std::fill(acc.begin(), acc.end(), 0.0f);
      float z = 0.0f;
      // M = -inf: no key and no sink; every weight would be exp(-inf - -inf) = NaN.
      if (m != kNegInf) {
        z = sink == kNegInf ? 0.0f : std::exp(sink - m);
        for (int i = 0; i < K; ++i) {
          const float l = lse[i * p.lse_part_stride];
          const float w = l == kNegInf ? 0.0f : std::exp(l - m);
          if (w == 0.0f) continue;  // an empty part's o is never read
          z += w;
          load_row(offset(p.o, p.dtype, i * p.o_part_stride + t * p.o_row_stride + h * p.o_head_stride), p.dtype, D,
                   row.data());
          for (int d = 0; d < D; ++d) acc[d] += w * row[d];
        }
        for (int d = 0; d < D; ++d) acc[d] /= z;  // z >= 1: the largest term is exp(0)
      }
      // Written after every read of this (row, head): out may be o[i], out_lse lse[i].
      store_row(acc.data(), D, offset(p.out, p.dtype, t * p.out_row_stride + h * p.out_head_stride), p.dtype);
      if (p.out_lse) {
        p.out_lse[t * p.out_lse_row_stride + h * p.out_lse_head_stride] = m == kNegInf ? kNegInf : m + std::log(z);
      }
    }
  }
}

}  // namespace pagedmha::cpu
