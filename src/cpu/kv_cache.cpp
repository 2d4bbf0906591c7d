// append_kv on the CPU: copies (or quantises to fp8) each new token into its slot.
#include <cstring>
#include <vector>

#include "cpu/convert.h"
#include "cpu/cpu_ops.h"

namespace pagedmha::cpu {

void append_kv(const detail::AppendKvProblem& p) {
  const detail::KvCacheDesc& kv = p.kv;
  const int D = kv.head_dim;
  const int H = kv.num_kv_heads;
  const std::size_t row_bytes = static_cast<std::size_t>(D) * dtype_size(kv.dtype);
  // One task per (K or V, head) walks the tokens in order: no two threads touch one
  // slot, and a slot named twice (padding rows aimed at the dummy page) keeps the last.
#pragma omp parallel if (p.num_tokens * H > 256)
  {
    std::vector<float> row(D);
#pragma omp for schedule(static)
    for (int task = 0; task < 2 * H; ++task) {
      const bool is_v = task >= H;
      const int h = is_v ? task - H : task;
      const detail::PagedCache& c = is_v ? kv.v : kv.k;
      const void* src = is_v ? p.v : p.k;
      const int64_t src_row = is_v ? p.v_row_stride : p.k_row_stride;
      const int64_t src_head = is_v ? p.v_head_stride : p.k_head_stride;
      const float scale = is_v ? p.v_scale : p.k_scale;
      for (int64_t t = 0; t < p.num_tokens; ++t) {
        const int64_t slot = p.out_cache_loc[t];
        const int64_t dst_off =
            (slot / kv.page_size) * c.page_stride + (slot % kv.page_size) * c.token_stride + h * c.head_stride;
        const void* s = offset(src, p.src_dtype, t * src_row + h * src_head);
        void* d = offset(c.data, kv.dtype, dst_off);
        if (kv.dtype == p.src_dtype) {
          std::memcpy(d, s, row_bytes);
        } else {  // fp8 e4m3: saturate_rne(x / scale)
          load_row(s, p.src_dtype, D, row.data());
          auto* out = static_cast<uint8_t*>(d);
          for (int x = 0; x < D; ++x) out[x] = float_to_fp8_e4m3(row[x] / scale);
        }
      }
    }
  }
}

}  // namespace pagedmha::cpu
