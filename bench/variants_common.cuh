// Pieces shared by the kernel-variant micro-benchmarks (prefill_sm90_variants.cu,
// decode_sm90_variants.cu): the CUDA check, random fills, the bf16 problem both set up on a
// paged cache, and main's loop over the selected shapes.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstddef>
#include <cstdlib>
#include <vector>

#include "core/problem.h"

#define CHECK(x)                                                                             \
  do {                                                                                       \
    cudaError_t e = (x);                                                                     \
    if (e != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

namespace variants {

/// x[i] uniform in [-scale / 2, scale / 2) from a hash of i (X: bf16, or fp8 e4m3, saturating).
template <class X>
__global__ void fill_random(X* x, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    x[i] = X((static_cast<float>(h & 0xffffff) / 16777216.0f - 0.5f) * scale);
  }
}

/// A bf16 query / output [rows][hq][D] over an NHD paged cache [pages][page][hkv][D] of
/// `kv_dtype`; the caller sets the page table, lengths, rows and the op's own fields.
inline pagedmha::detail::AttentionProblem bf16_problem(void* q, void* o, int hq, int hkv, int d, void* k, void* v,
                                                       pagedmha::DType kv_dtype, int page, int64_t num_pages) {
  pagedmha::detail::AttentionProblem p;
  p.q = q;
  p.q_dtype = pagedmha::DType::bf16;
  p.q_row_stride = int64_t{hq} * d;
  p.q_head_stride = d;
  p.out = o;
  p.out_dtype = pagedmha::DType::bf16;
  p.out_row_stride = int64_t{hq} * d;
  p.out_head_stride = d;
  p.kv.k = {k, int64_t{page} * hkv * d, int64_t{hkv} * d, d};
  p.kv.v = {v, int64_t{page} * hkv * d, int64_t{hkv} * d, d};
  p.kv.dtype = kv_dtype;
  p.kv.num_pages = num_pages;
  p.kv.page_size = page;
  p.kv.num_kv_heads = hkv;
  p.kv.head_dim = d;
  p.num_q_heads = hq;
  p.num_kv_heads = hkv;
  p.head_dim = d;
  p.bmm1_scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.device = pagedmha::Device::cuda(0);
  return p;
}

/// The median over 5 samples of the time per call, in us: each sample times `enqueue()`,
/// which enqueues `calls` calls on `stream` (launches, or one graph replaying them),
/// between two events.
template <class Enqueue>
double median_us(cudaStream_t stream, int calls, Enqueue enqueue) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < 5; ++i) {
    CHECK(cudaEventRecord(e0, stream));
    enqueue();
    CHECK(cudaEventRecord(e1, stream));
    CHECK(cudaEventSynchronize(e1));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t / calls);
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e3;
}

/// median_us of `launch()` (one call) after two warm-up calls, 10 calls per sample.
template <class Launch>
double launches_median_us(cudaStream_t stream, Launch launch) {
  launch();
  launch();
  CHECK(cudaStreamSynchronize(stream));
  return median_us(stream, 10, [&] {
    for (int i = 0; i < 10; ++i) launch();
  });
}

/// Which of n shapes to run: all without the argument, else a comma list of indices.
/// Exits with status 2 on a bad list.
inline std::vector<bool> shape_selection(int argc, char** argv, int arg, size_t n) {
  std::vector<bool> run(n, argc <= arg);
  if (argc <= arg) return run;
  for (const char* c = argv[arg]; *c;) {
    char* end = nullptr;
    const long i = std::strtol(c, &end, 10);
    if (end == c || i < 0 || i >= static_cast<long>(n)) {
      std::fprintf(stderr, "shape indices: expected a comma list of 0..%zu, got %s\n", n - 1, argv[arg]);
      std::exit(2);
    }
    run[static_cast<size_t>(i)] = true;
    c = *end == ',' ? end + 1 : end;
  }
  return run;
}

/// A micro-benchmark's main: argv is the variant name, the JSON-lines file to append to
/// and optional shape indices; each selected shape goes to run(shape, sms, stream, out)
/// in order (out: the open file, or null when it cannot be opened).
template <class Shape, std::size_t N, class Run>
int run_shapes(int argc, char** argv, const Shape (&shapes)[N], Run run) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <variant name> <out.jsonl> [shape indices, e.g. 0,3]\n", argv[0]);
    return 2;
  }
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  const std::vector<bool> selected = shape_selection(argc, argv, 3, N);
  FILE* out = std::fopen(argv[2], "a");
  for (std::size_t i = 0; i < N; ++i) {
    if (selected[i]) run(shapes[i], sms, stream, out);
  }
  if (out) std::fclose(out);
  return 0;
}

}  // namespace variants
