// FlashAttention-3's dense causal forward (Hopper) timed beside the Hopper prefill
// variants: the peer the prefill targets are set against (docs/perf-notes/
// prefill-sm90-schedule.md section 15). Not part of the library or its build: compiled by
// bench/prefill_variants.sh when FA3_DIR names a checkout of Dao-AILab/flash-attention
// (its hopper/ headers and CUTLASS's), one instantiation per head dim, the one its own
// dispatch picks for a dense causal bf16 call without splits, paging or GQA packing.
// The bf16 shapes of bench/prefill_sm90_variants.cu (a list and indices of its own), the
// same timing and JSON, on a dense [batch][seq][heads][D] layout (page_order "dense").
//
//   build/variants-prefill/fa3-dense <variant name> <out.jsonl> [shape indices]
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>

#include "variants_common.cuh"
#include "flash_fwd_launch_template.h"  // from $FA3_DIR/hopper

namespace {

struct PeerShape {
  const char* model;
  int hq, hkv, d, batch, seq;
};

template <int D>
void launch_fa3(Flash_fwd_params& params, cudaStream_t stream) {
  run_flash_fwd<90, D, D, /*ClusterM=*/1, cutlass::bfloat16_t, cutlass::bfloat16_t, /*Is_causal=*/true,
                /*Is_local=*/false, /*Has_softcap=*/false, /*Varlen=*/false, /*PagedKVNonTMA=*/false,
                /*AppendKV=*/false, /*HasQv=*/false, /*PackGQA=*/false, /*Split=*/false, /*V_colmajor=*/false>(params,
                                                                                                             stream);
}

template <int D>
double run_shape(const PeerShape& s, int sms, cudaStream_t stream) {
  const int64_t rows = int64_t{s.batch} * s.seq;
  __nv_bfloat16 *q, *k, *v, *o;
  float* lse;
  int* semaphore;  // the dynamic persistent scheduler's tile counter, zero at each launch
  CHECK(cudaMalloc(&q, rows * s.hq * D * 2));
  CHECK(cudaMalloc(&o, rows * s.hq * D * 2));
  CHECK(cudaMalloc(&k, rows * s.hkv * D * 2));
  CHECK(cudaMalloc(&v, rows * s.hkv * D * 2));
  CHECK(cudaMalloc(&lse, rows * s.hq * 4));
  CHECK(cudaMalloc(&semaphore, 4));
  variants::fill_random<__nv_bfloat16><<<1024, 256, 0, stream>>>(q, rows * s.hq * D, 1, 2.0f);
  variants::fill_random<__nv_bfloat16><<<1024, 256, 0, stream>>>(k, rows * s.hkv * D, 2, 2.0f);
  variants::fill_random<__nv_bfloat16><<<1024, 256, 0, stream>>>(v, rows * s.hkv * D, 3, 2.0f);

  Flash_fwd_params p{};
  p.q_ptr = q;
  p.k_ptr = k;
  p.v_ptr = v;
  p.o_ptr = o;
  p.q_row_stride = int64_t{s.hq} * D;
  p.o_row_stride = p.q_row_stride;
  p.k_row_stride = int64_t{s.hkv} * D;
  p.v_row_stride = p.k_row_stride;
  p.q_head_stride = p.o_head_stride = p.k_head_stride = p.v_head_stride = D;
  p.v_dim_stride = 1;
  p.q_batch_stride = int64_t{s.seq} * p.q_row_stride;
  p.o_batch_stride = p.q_batch_stride;
  p.k_batch_stride = int64_t{s.seq} * p.k_row_stride;
  p.v_batch_stride = p.k_batch_stride;
  p.h = s.hq;
  p.h_k = s.hkv;
  p.b = p.b_k = s.batch;
  p.seqlen_q = p.seqlen_k = s.seq;
  p.total_q = p.total_k = static_cast<int>(rows);
  p.seqlen_q_rounded = p.seqlen_k_rounded = (s.seq + 127) / 128 * 128;
  p.d = p.dv = p.d_rounded = p.dv_rounded = D;
  p.softmax_lse_ptr = lse;
  p.scale_softmax = 1.0f / std::sqrt(static_cast<float>(D));
  p.window_size_left = s.seq - 1;  // causal, as FA3's API fills it
  p.window_size_right = 0;
  p.p_dropout = 1.0f;  // the probability of keeping (no dropout)
  p.rp_dropout = 1.0f;
  p.is_bf16 = true;
  p.is_causal = true;
  p.num_splits = 1;
  p.head_swizzle = true;  // what FA3's API sets for causal calls
  p.tile_count_semaphore = semaphore;
  p.arch = 90;
  p.num_sm = sms;

  auto launch = [&] {
    CHECK(cudaMemsetAsync(semaphore, 0, 4, stream));
    launch_fa3<D>(p, stream);
  };
  const double us = variants::launches_median_us(stream, launch);
  for (void* x : {static_cast<void*>(q), static_cast<void*>(o), static_cast<void*>(k), static_cast<void*>(v),
                  static_cast<void*>(lse), static_cast<void*>(semaphore)}) {
    cudaFree(x);
  }
  return us;
}

// The bf16 shapes of bench/prefill_sm90_variants.cu, by model and batch x seq.
const PeerShape kShapes[] = {
    {"llama3-8b", 32, 8, 128, 1, 16384}, {"llama3-8b", 32, 8, 128, 4, 4096}, {"llama3-8b", 32, 8, 128, 16, 1024},
    {"gpt-oss", 64, 8, 64, 1, 16384},    {"gpt-oss", 64, 8, 64, 4, 4096},    {"gpt-oss", 64, 8, 64, 16, 1024},
    {"gemma", 16, 8, 256, 1, 16384},     {"gemma", 16, 8, 256, 4, 4096},     {"gemma", 16, 8, 256, 16, 1024},
};

}  // namespace

int main(int argc, char** argv) {
  return variants::run_shapes(argc, argv, kShapes, [&](const PeerShape& s, int sms, cudaStream_t stream, FILE* out) {
    const double us = s.d == 256   ? run_shape<256>(s, sms, stream)
                      : s.d == 128 ? run_shape<128>(s, sms, stream)
                                   : run_shape<64>(s, sms, stream);
    const double pairs = double(s.batch) * s.seq * (s.seq + 1) / 2.0;
    const double tflops = 4.0 * s.hq * s.d * pairs / (us * 1e-6) / 1e12;
    std::printf("%-24s %-10s %2dx%-6d dense     bf16 %10.1f us %8.1f TFLOP/s\n", argv[1], s.model, s.batch, s.seq, us,
                tflops);
    if (out) {
      std::fprintf(out,
                   "{\"op\": \"prefill\", \"impl\": \"fa3\", \"variant\": \"%s\", \"model\": \"%s\", "
                   "\"batch\": %d, \"ctx\": %d, \"q_len\": %d, \"page_size\": 0, \"page_order\": \"dense\", "
                   "\"kv_dtype\": \"bf16\", \"time_us\": %.2f, \"tflops\": %.2f}\n",
                   argv[1], s.model, s.batch, s.seq, s.seq, us, tflops);
    }
  });
}
