// Micro-benchmark of the Hopper prefill kernel's compile-time variants (policy.h's
// PAGEDMHA_SM90_* knobs): one binary per variant, built in seconds by
// bench/prefill_variants.sh, timing causal prefill shapes on a paged cache with CUDA
// events (kernels of milliseconds: launch cost is noise). Prints one line per shape and
// appends JSON records (PERFORMANCE.md's schema plus "variant") to the file given.
//
//   [PREFILL_VARIANTS_DUMP=<dir>] prefill_sm90_variants <variant name> <out.jsonl> [shape indices, e.g. 0,3]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "variants_common.cuh"
#include "cuda/prefill_sm90/launch.cuh"

namespace {

using namespace pagedmha;
using namespace pagedmha::cuda;

using variants::fill_random;

struct Shape {
  const char* model;
  int hq, hkv, d, batch, seq, page;
  bool fp8 = false;     // e4m3 K / V
  bool linear = false;  // pages in order: with page >= the key tile, the dense NHD layout
  int q = 0;            // queries per request, the last q of its seq keys (a chunk over a cached prefix); 0: seq
  int queries() const { return q > 0 ? q : seq; }
};

/// With PREFILL_VARIANTS_DUMP=<dir>: every 61st output value (fp32) of the shape to
/// <dir>/<variant>-<model>-<batch>x<seq>-p<page>-<kv>.bin, so that a script can compare a
/// variant's output with the default build's (same inputs: fixed seeds and page order;
/// bench/prefill_variants.sh COMPARE=1). And the lse of every row and head to the same
/// name with .lse.bin. Nothing is timed then (the records say 0 us).
const char* g_variant = "";
const char* dump_dir() {
  const char* dir = std::getenv("PREFILL_VARIANTS_DUMP");
  return dir != nullptr && *dir != 0 ? dir : nullptr;
}
void dump_output(const Shape& s, const __nv_bfloat16* o, int64_t n, const float* lse, int64_t n_lse) {
  std::vector<__nv_bfloat16> h(n);
  CHECK(cudaMemcpy(h.data(), o, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> sample, l(n_lse);
  for (int64_t i = 0; i < n; i += 61) sample.push_back(__bfloat162float(h[i]));
  CHECK(cudaMemcpy(l.data(), lse, n_lse * 4, cudaMemcpyDeviceToHost));
  const std::string path = std::string(dump_dir()) + "/" + g_variant + "-" + s.model + "-" + std::to_string(s.batch) +
                           "x" + std::to_string(s.seq) + (s.q > 0 ? "-q" + std::to_string(s.q) : "") + "-p" +
                           std::to_string(s.page) + (s.linear ? "-inorder" : "") +
                           "-" + (s.fp8 ? "fp8" : "bf16");
  for (const auto& [name, v] : {std::pair{path + ".bin", &sample}, std::pair{path + ".lse.bin", &l}}) {
    if (FILE* f = std::fopen(name.c_str(), "wb")) {
      std::fwrite(v->data(), 4, v->size(), f);
      std::fclose(f);
    }
  }
}

template <int D, bool kFp8>
double run_shape(const Shape& s, int sms, cudaStream_t stream) {
  using KV = std::conditional_t<kFp8, __nv_fp8_e4m3, __nv_bfloat16>;
  constexpr int64_t kv_es = sizeof(KV);
  const int B = s.batch, S = s.seq, P = s.page, Q = s.queries();
  const int64_t rows = int64_t{B} * Q;
  const int pages_per_req = (S + P - 1) / P;
  const int64_t num_pages = int64_t{B} * pages_per_req + 1;
  const int64_t slots = num_pages * P;
  __nv_bfloat16 *q, *o;
  KV *k, *v;
  CHECK(cudaMalloc(&q, rows * s.hq * D * 2));
  CHECK(cudaMalloc(&o, rows * s.hq * D * 2));
  CHECK(cudaMalloc(&k, slots * s.hkv * D * kv_es));
  CHECK(cudaMalloc(&v, slots * s.hkv * D * kv_es));
  fill_random<__nv_bfloat16><<<1024, 256, 0, stream>>>(q, rows * s.hq * D, 1, 2.0f);
  fill_random<KV><<<1024, 256, 0, stream>>>(k, slots * s.hkv * D, 2, 2.0f);
  fill_random<KV><<<1024, 256, 0, stream>>>(v, slots * s.hkv * D, 3, 2.0f);
  std::vector<int32_t> table(int64_t{B} * pages_per_req), lens(B, S), cu(B + 1);
  std::iota(table.begin(), table.end(), 1);
  if (!s.linear) std::shuffle(table.begin(), table.end(), std::mt19937(7));  // random page order
  for (int b = 0; b <= B; ++b) cu[b] = b * Q;
  int32_t *d_table, *d_lens, *d_cu;
  CHECK(cudaMalloc(&d_table, table.size() * 4));
  CHECK(cudaMalloc(&d_lens, B * 4));
  CHECK(cudaMalloc(&d_cu, (B + 1) * 4));
  CHECK(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_lens, lens.data(), B * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_cu, cu.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
  const int64_t ws_bytes = sm90::PlanLayout::bytes(B, rows);
  void* ws;
  CHECK(cudaMalloc(&ws, ws_bytes));
  std::vector<float> sinks_h(s.hq, 0.5f);
  float* sinks;
  CHECK(cudaMalloc(&sinks, s.hq * 4));
  CHECK(cudaMemcpy(sinks, sinks_h.data(), s.hq * 4, cudaMemcpyHostToDevice));

  detail::AttentionProblem p =
      variants::bf16_problem(q, o, s.hq, s.hkv, D, k, v, kFp8 ? DType::fp8_e4m3 : DType::bf16, P, num_pages);
  p.page_table = d_table;
  p.page_table_row_stride = pages_per_req;
  p.page_table_cols = pages_per_req;
  p.seq_lens = d_lens;
  p.batch = B;
  p.num_rows = static_cast<int>(rows);
  p.cu_seqlens_q = d_cu;
  p.max_q_len = Q;
  p.sinks = std::string(s.model) == "gpt-oss" ? sinks : nullptr;
  p.workspace = ws;
  p.workspace_bytes = ws_bytes;
  if (dump_dir() != nullptr) {
    float* lse;
    CHECK(cudaMalloc(&lse, rows * s.hq * 4));
    detail::AttentionProblem pl = p;
    pl.lse = lse;
    pl.lse_row_stride = s.hq;
    pl.lse_head_stride = 1;
    sm90::run_prefill<D, __nv_bfloat16, KV>(pl, make_attention_args(pl), sms, stream);
    CHECK(cudaStreamSynchronize(stream));
    dump_output(s, o, rows * s.hq * D, lse, rows * s.hq);
    cudaFree(lse);
  }
  const AttentionArgs a = make_attention_args(p);
  auto launch = [&] { sm90::run_prefill<D, __nv_bfloat16, KV>(p, a, sms, stream); };
  const double us = dump_dir() != nullptr ? 0.0 : variants::launches_median_us(stream, launch);
  for (void* x : {static_cast<void*>(q), static_cast<void*>(o), static_cast<void*>(k), static_cast<void*>(v),
                  static_cast<void*>(d_table), static_cast<void*>(d_lens), static_cast<void*>(d_cu), ws,
                  static_cast<void*>(sinks)}) {
    cudaFree(x);
  }
  return us;
}

const Shape kShapes[] = {
    {"llama3-8b", 32, 8, 128, 1, 16384, 16}, {"llama3-8b", 32, 8, 128, 1, 16384, 64},
    {"llama3-8b", 32, 8, 128, 4, 4096, 16},  {"gpt-oss", 64, 8, 64, 1, 16384, 16},
    {"gpt-oss", 64, 8, 64, 4, 4096, 16},     {"llama3-8b", 32, 8, 128, 16, 1024, 16},
    {"gpt-oss", 64, 8, 64, 16, 1024, 16},    {"llama3-8b", 32, 8, 128, 1, 16384, 16, true},
    {"llama3-8b", 32, 8, 128, 4, 4096, 16, true},   {"gemma", 16, 8, 256, 4, 4096, 16},
    {"gemma", 16, 8, 256, 16, 1024, 16},     {"gpt-oss", 64, 8, 64, 1, 16384, 16, true},
    {"gpt-oss", 64, 8, 64, 4, 4096, 16, true},      {"llama3-8b", 32, 8, 128, 4, 4096, 1},
    {"gpt-oss-tp8", 8, 1, 64, 2, 8192, 16, true},   // one TP-8 rank (the Mooncake replay's extends)
    {"gemma", 16, 8, 256, 1, 16384, 16},     // 15
    // 16-18: pages in order; at page 256 (>= every key tile: one TMA box per tile and
    // panel) the cache is laid out as a dense [tokens][Hkv][D] one, FlashAttention-3
    // dense's and cuDNN's layout: what paging itself costs.
    {"llama3-8b", 32, 8, 128, 1, 16384, 16, false, true}, {"llama3-8b", 32, 8, 128, 1, 16384, 256, false, true},
    {"llama3-8b", 32, 8, 128, 4, 4096, 256, false, true},
    // 19-22: chunked prefill, 2k-query chunks over 8k keys (the benchmark's chunked batch),
    // and the Mooncake replay's TP-8 extend (8k queries over 16k keys, fp8).
    {"llama3-8b", 32, 8, 128, 8, 8192, 16, false, false, 2048}, {"gpt-oss", 64, 8, 64, 8, 8192, 16, false, false, 2048},
    {"gemma", 16, 8, 256, 8, 8192, 16, false, false, 2048},
    {"gpt-oss-tp8", 8, 1, 64, 1, 16384, 16, true, false, 8192},
    // 23-25: short grids of one TP-8 rank (policy.h kPlanPairRounds): the bf16 extend of
    // 22, a 2k chunk over a 28k prefix and two 3k chunks over 17k (fp8).
    {"gpt-oss-tp8", 8, 1, 64, 1, 16384, 16, false, false, 8192},
    {"gpt-oss-tp8", 8, 1, 64, 1, 30000, 16, true, false, 2000},
    {"gpt-oss-tp8", 8, 1, 64, 2, 20000, 16, true, false, 3000},
    // 26-28: gemma with fp8 KV (D = 256's producer warpgroup in two converting teams, or
    // as one with PAGEDMHA_SM90_FP8_D256_TEAMS=0).
    {"gemma", 16, 8, 256, 4, 4096, 16, true}, {"gemma", 16, 8, 256, 16, 1024, 16, true},
    {"gemma", 16, 8, 256, 1, 16384, 16, true},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_variant = argv[1];
  return variants::run_shapes(argc, argv, kShapes, [&](const Shape& s, int sms, cudaStream_t stream, FILE* out) {
    const double us = s.d == 256   ? (s.fp8 ? run_shape<256, true>(s, sms, stream) : run_shape<256, false>(s, sms, stream))
                      : s.d == 128 ? (s.fp8 ? run_shape<128, true>(s, sms, stream) : run_shape<128, false>(s, sms, stream))
                                   : (s.fp8 ? run_shape<64, true>(s, sms, stream) : run_shape<64, false>(s, sms, stream));
    // Causal, bottom-right, counted by the variant object (pagedmha/variant.h).
    const double pairs = double(s.batch) * double(MaskVariant{true, -1}.pairs(s.seq, s.queries()));
    const double tflops = us > 0 ? 4.0 * s.hq * s.d * pairs / (us * 1e-6) / 1e12 : 0.0;
    std::printf("%-24s %-10s %2dx%-6d q%-6d p%-3d%s %-4s %10.1f us %8.1f TFLOP/s\n", argv[1], s.model, s.batch, s.seq,
                s.queries(), s.page, s.linear ? " in order" : "", s.fp8 ? "fp8" : "bf16", us, tflops);
    if (out) {
      std::fprintf(out,
                   "{\"op\": \"prefill\", \"impl\": \"pagedmha-variant\", \"variant\": \"%s\", \"model\": \"%s\", "
                   "\"batch\": %d, \"ctx\": %d, \"q_len\": %d, \"page_size\": %d, \"page_order\": \"%s\", "
                   "\"kv_dtype\": \"%s\", \"time_us\": %.2f, \"tflops\": %.2f}\n",
                   argv[1], s.model, s.batch, s.seq, s.queries(), s.page, s.linear ? "in order" : "random",
                   s.fp8 ? "fp8_e4m3" : "bf16", us, tflops);
    }
  });
}
