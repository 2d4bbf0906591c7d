#include "cuda/common/attention_args.cuh"

namespace pagedmha::cuda {

AttentionArgs make_attention_args(const detail::AttentionProblem& p) {
  AttentionArgs a{};
  a.q = p.q;
  a.q_fp8 = p.q_dtype == DType::fp8_e4m3;
  a.q_row_stride = p.q_row_stride;
  a.q_head_stride = p.q_head_stride;
  a.out = p.out;
  a.out_row_stride = p.out_row_stride;
  a.out_head_stride = p.out_head_stride;
  a.lse = p.lse;
  a.lse_row_stride = p.lse_row_stride;
  a.lse_head_stride = p.lse_head_stride;
  a.k = p.kv.k.data;
  a.v = p.kv.v.data;
  a.k_page_stride = p.kv.k.page_stride;
  a.k_token_stride = p.kv.k.token_stride;
  a.k_head_stride = p.kv.k.head_stride;
  a.v_page_stride = p.kv.v.page_stride;
  a.v_token_stride = p.kv.v.token_stride;
  a.v_head_stride = p.kv.v.head_stride;
  a.page_table = p.page_table;
  a.page_table_row_stride = p.page_table_row_stride;
  a.seq_lens = p.seq_lens;
  a.cu_seqlens_q = p.cu_seqlens_q;
  a.batch = p.batch;
  a.num_q_heads = p.num_q_heads;
  a.num_kv_heads = p.num_kv_heads;
  a.group = p.num_q_heads / p.num_kv_heads;
  a.q_len_per_req = p.q_len_per_req;
  a.page_size = p.kv.page_size;
  a.seq_len_bound = static_cast<int64_t>(p.page_table_cols) * p.kv.page_size;
  a.logit_scale_log2 = p.bmm1_scale * kLog2e;
  if (p.logits_soft_cap > 0.0f) {
    a.cap_inner = p.bmm1_scale / p.logits_soft_cap;
    a.cap_log2 = p.logits_soft_cap * kLog2e;
  }
  a.bmm2_scale = p.bmm2_scale;
  a.sinks = p.sinks;
  a.mask = p.mask();
  return a;
}

}  // namespace pagedmha::cuda
