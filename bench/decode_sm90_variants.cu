// Micro-benchmark of the decode kernels' compile-time variants (decode/policy.h,
// decode_sm90/policy.h, the mainloop's knobs): one binary per variant, built in about a
// minute by `KERNEL=decode bash bench/prefill_variants.sh`, all variants in parallel. Each
// shape runs batch_decode's own path: the Hopper decode where the build switches it on
// (-DPAGEDMHA_DECODE_SM90=1) and the call fits it, else the portable decode. Timed by
// CUDA-graph replay of 2 x `copies` launches that rotate over `copies` page tables of
// disjoint pages (together >= 3x the 60 MB L2), median of 5 replays. Prints one line per
// shape and appends JSON records (PERFORMANCE.md's schema plus "variant") to the file given.
// Not a test and not the library's figures (bench_attention.py is).
//
//   decode_sm90_variants <variant name> <out.jsonl> [shape indices, e.g. 0,3]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "variants_common.cuh"
#include "cuda/decode/decode_args.cuh"
#include "cuda/decode/decode_kernel.cuh"
#include "cuda/decode_sm90/launch.cuh"

#ifndef PAGEDMHA_BENCH_TABLE_KEYS
#define PAGEDMHA_BENCH_TABLE_KEYS 0
#endif

namespace pagedmha::cuda {
// decode_sm90/launch.cuh declares the merges extern (the library instantiates them in
// decode_hd*.cu); this binary has no other translation unit.
template void launch_decode_merge<64, __nv_bfloat16>(const AttentionArgs&, int, int, cudaStream_t);
template void launch_decode_merge<128, __nv_bfloat16>(const AttentionArgs&, int, int, cudaStream_t);
}  // namespace pagedmha::cuda

namespace {

using namespace pagedmha;
using namespace pagedmha::cuda;

using variants::fill_random;

struct Shape {
  const char* model;
  int hq, hkv, d, batch, ctx, page;
  int window = -1;
  bool fp8 = false;  // e4m3 K / V
  int q_len = 1;     // query rows per request (verify)
};

struct Timing {
  double us, bytes;  // per call; K + V bytes of the visible keys + Q + O
  double diff;       // max |o - o_portable| / max |o_portable| (0 when the portable decode ran)
};

template <int D, bool kFp8>
Timing run_shape(const Shape& s, int sms, cudaStream_t stream) {
  using T = __nv_bfloat16;
  using KV = std::conditional_t<kFp8, __nv_fp8_e4m3, T>;
  constexpr int64_t kv_es = sizeof(KV);
  const int B = s.batch, L = s.ctx, P = s.page, N = s.q_len;
  const int cols = (L + P - 1) / P;
  // Page-table width: the columns the lengths need, or (PAGEDMHA_BENCH_TABLE_KEYS) a
  // table as wide as an engine's CUDA-graph tables (the unused columns hold page 0).
  const int tcols = std::max(cols, PAGEDMHA_BENCH_TABLE_KEYS / P);
  // Only the columns a decode row reads get pages (docs/semantics.md 8.1: the rest may
  // hold anything); each copy of the page tables has its own pages.
  const int first_col = s.window >= 0 ? std::max(0, L - 1 - s.window) / P : 0;
  const int64_t live = int64_t{B} * (cols - first_col);
  const int64_t visible = s.window >= 0 ? std::min<int64_t>(L, s.window + 1) : L;
  const double read = double(B) * s.hkv * visible * D * 2 * kv_es + 2.0 * B * N * s.hq * D * 2;
  const int copies = static_cast<int>(std::clamp(std::ceil(3 * 60e6 / read), 1.0, 8.0));
  const int64_t num_pages = copies * live + 1;
  const int64_t slots = num_pages * P;
  T *q, *o;
  KV *k, *v;
  CHECK(cudaMalloc(&q, int64_t{B} * N * s.hq * D * 2));
  CHECK(cudaMalloc(&o, int64_t{B} * N * s.hq * D * 2));
  CHECK(cudaMalloc(&k, slots * s.hkv * D * kv_es));
  CHECK(cudaMalloc(&v, slots * s.hkv * D * kv_es));
  fill_random<T><<<1024, 256, 0, stream>>>(q, int64_t{B} * N * s.hq * D, 1, 2.0f);
  fill_random<KV><<<1024, 256, 0, stream>>>(k, slots * s.hkv * D, 2, 2.0f);
  fill_random<KV><<<1024, 256, 0, stream>>>(v, slots * s.hkv * D, 3, 2.0f);
  std::vector<int32_t> ids(copies * live);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));  // random page order
  std::vector<int32_t> tables(int64_t{copies} * B * tcols, 0), lens(B, L);
  for (int64_t c = 0, next = 0; c < copies; ++c) {
    for (int b = 0; b < B; ++b) {
      for (int j = first_col; j < cols; ++j) tables[(c * B + b) * tcols + j] = ids[next++];
    }
  }
  int32_t *d_tables, *d_lens;
  CHECK(cudaMalloc(&d_tables, tables.size() * 4));
  CHECK(cudaMalloc(&d_lens, B * 4));
  CHECK(cudaMemcpy(d_tables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_lens, lens.data(), B * 4, cudaMemcpyHostToDevice));
  std::vector<float> sinks_h(s.hq, 0.5f);
  float* sinks;
  CHECK(cudaMalloc(&sinks, s.hq * 4));
  CHECK(cudaMemcpy(sinks, sinks_h.data(), s.hq * 4, cudaMemcpyHostToDevice));
  const int cap = DecodeSplitPolicy::make(D, 2, s.hkv).max_splits;
  const std::size_t ws_bytes = DecodeWorkspaceLayout::kAlign + DecodeWorkspaceLayout(int64_t{B} * N, s.hq, D, cap).total;
  void* ws;
  CHECK(cudaMalloc(&ws, ws_bytes));

  detail::AttentionProblem p =
      variants::bf16_problem(q, o, s.hq, s.hkv, D, k, v, kFp8 ? DType::fp8_e4m3 : DType::bf16, P, num_pages);
  p.page_table_row_stride = tcols;
  p.page_table_cols = tcols;
  p.seq_lens = d_lens;
  p.batch = B;
  p.num_rows = B * N;
  p.q_len_per_req = N;
  p.max_q_len = N;
  p.window_left = s.window;
  p.sinks = std::string(s.model) == "gpt-oss" ? sinks : nullptr;
  p.workspace = ws;
  p.workspace_bytes = ws_bytes;
  p.stream = stream;
  // batch_decode's path for this one instantiation (decode.cu).
  const auto launch = [&](int copy) {
    p.page_table = d_tables + int64_t{copy} * B * tcols;
    const AttentionArgs a = decode_args(p);
    bool done = false;
    if (sm90::kDecodeSm90 && (!kFp8 || sm90::kDecodeSm90Fp8) && kernel_path(0) == KernelPath::sm90) {
      done = sm90::run_decode<D, T, KV>(p, a, sms, stream);
    }
    if (!done) launch_decode<D, T, KV>(a, 0, sms, stream);
  };
  // A sanity check, not a test (the GPU suite tests every path against the fp64 oracle):
  // this build's path against the portable decode on the first page table.
  const int64_t o_elems = int64_t{B} * N * s.hq * D;
  std::vector<T> o_var(o_elems), o_ref(o_elems);
  launch(0);
  CHECK(cudaMemcpyAsync(o_var.data(), o, o_elems * 2, cudaMemcpyDeviceToHost, stream));
  p.page_table = d_tables;
  launch_decode<D, T, KV>(decode_args(p), 0, sms, stream);
  CHECK(cudaMemcpyAsync(o_ref.data(), o, o_elems * 2, cudaMemcpyDeviceToHost, stream));
  CHECK(cudaStreamSynchronize(stream));
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < o_elems; ++i) {
    const double x = static_cast<float>(o_var[i]), y = static_cast<float>(o_ref[i]);
    diff = std::isnan(x - y) ? INFINITY : std::max(diff, std::fabs(x - y));
    scale = std::max(scale, std::fabs(y));
  }
  for (int c = 0; c < copies; ++c) launch(c);
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaGetLastError());
  const int reps = 2 * copies;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int r = 0; r < reps; ++r) launch(r % copies);
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, stream));  // warm-up
  const double us = variants::median_us(stream, reps, [&] { CHECK(cudaGraphLaunch(exec, stream)); });
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  for (void* x : {static_cast<void*>(q), static_cast<void*>(o), static_cast<void*>(k), static_cast<void*>(v),
                  static_cast<void*>(d_tables), static_cast<void*>(d_lens), static_cast<void*>(sinks), ws}) {
    cudaFree(x);
  }
  return {us, read, scale > 0 ? diff / scale : diff};
}

// bench_attention.py --decode's shapes at page 16 (bf16 KV unless marked).
const Shape kShapes[] = {
    {"llama3-8b", 32, 8, 128, 1, 32768, 16},          {"llama3-8b", 32, 8, 128, 16, 8192, 16},
    {"llama3-8b", 32, 8, 128, 64, 4096, 16},          {"llama3-8b", 32, 8, 128, 256, 2048, 16},
    {"llama3-8b", 32, 8, 128, 128, 32768, 16},        {"gpt-oss", 64, 8, 64, 1, 32768, 16},
    {"gpt-oss", 64, 8, 64, 64, 4096, 16},             {"gpt-oss", 64, 8, 64, 128, 32768, 16},
    {"llama3-8b", 32, 8, 128, 128, 32768, 16, 127},   {"gpt-oss", 64, 8, 64, 128, 32768, 16, 127},
    {"llama3-70b-tp8", 8, 1, 128, 1, 32768, 16},      {"llama3-70b-tp8", 8, 1, 128, 32, 2048, 16},
    {"llama3-70b-tp8", 8, 1, 128, 256, 2048, 16},     {"llama3-70b-tp8", 8, 1, 128, 64, 8192, 16},
    {"llama3-8b", 32, 8, 128, 64, 4096, 16, -1, true}, {"llama3-8b", 32, 8, 128, 128, 32768, 16, -1, true},
    {"gpt-oss", 64, 8, 64, 64, 4096, 16, -1, true},  {"llama3-8b", 32, 8, 128, 1, 32768, 16, -1, true},
    {"gpt-oss", 64, 8, 64, 128, 32768, 16, -1, true}, {"gpt-oss", 64, 8, 64, 1, 32768, 16, -1, true},
    {"llama3-70b-tp8", 8, 1, 128, 64, 8192, 16, -1, true}, {"gpt-oss", 64, 8, 64, 256, 2048, 16},
    {"gpt-oss", 64, 8, 64, 16, 8192, 16},
    // Verify at q_len 4 (G q_len rows: gpt-oss 32, the 32-row tile; llama3-8b 16).
    {"gpt-oss", 64, 8, 64, 64, 4096, 16, -1, false, 4}, {"gpt-oss", 64, 8, 64, 64, 4096, 16, -1, true, 4},
    {"llama3-8b", 32, 8, 128, 64, 4096, 16, -1, false, 4},
};

}  // namespace

int main(int argc, char** argv) {
  return variants::run_shapes(argc, argv, kShapes, [&](const Shape& s, int sms, cudaStream_t stream, FILE* out) {
    const Timing t = s.d == 128 ? (s.fp8 ? run_shape<128, true>(s, sms, stream) : run_shape<128, false>(s, sms, stream))
                                : (s.fp8 ? run_shape<64, true>(s, sms, stream) : run_shape<64, false>(s, sms, stream));
    const double tbps = t.bytes / (t.us * 1e-6) / 1e12;
    std::printf("%-16s %-15s %3dx%-6d q%d p%-3d %-4s w%-4d %10.1f us %6.2f TB/s  diff %.1e\n", argv[1], s.model,
                s.batch, s.ctx, s.q_len, s.page, s.fp8 ? "fp8" : "bf16", s.window, t.us, tbps, t.diff);
    if (out) {
      std::fprintf(out,
                   "{\"op\": \"decode\", \"impl\": \"pagedmha-variant\", \"variant\": \"%s\", \"model\": \"%s\", "
                   "\"batch\": %d, \"ctx\": %d, \"q_len\": %d, \"page_size\": %d, \"kv_dtype\": \"%s\", "
                   "\"window_left\": %d, \"time_us\": %.2f, \"tbps\": %.3f, \"max_rel_diff_vs_portable\": %.3g}\n",
                   argv[1], s.model, s.batch, s.ctx, s.q_len, s.page, s.fp8 ? "fp8_e4m3" : "bf16", s.window, t.us, tbps,
                   std::isfinite(t.diff) ? t.diff : 1e30);
    }
  });
}
