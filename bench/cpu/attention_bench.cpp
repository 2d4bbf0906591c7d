// CPU decode and prefill on PERFORMANCE.md standard shapes, scaled to sizes a CPU
// finishes (llama3-8b: Hq 32, Hkv 8, D 128). Rate counters per second of wall time:
// `bytes` = effective bandwidth (K and V bytes of the visible keys + Q + O; shown as
// e.g. 1.2G/s = 1.2 GB/s) and `FLOP` = 4 * Hq * D per visible (query, key) pair.
//
//   bench_cpu_attention --benchmark_out=bench/results/cpu-attention.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "oracle/paged_problem.h"

namespace {

using pagedmha::DType;
using ptest::AttnCase;
using ptest::AttnProblem;

struct Shape {
  int hq = 32, hkv = 8, d = 128;  // llama3-8b
};

/// Visible (query, key) pairs of a causal request with n queries over L keys.
int64_t causal_pairs(int64_t n, int64_t L) {
  int64_t pairs = 0;
  for (int64_t i = 0; i < n; ++i) pairs += std::max<int64_t>(0, L - n + i + 1);
  return pairs;
}

/// Builds a problem once per configuration (building is much slower than one call).
const AttnProblem& cached(const AttnCase& c) {
  static std::map<std::tuple<bool, int, int, int, int, int>, std::unique_ptr<AttnProblem>> cache;
  const auto key = std::make_tuple(c.decode, static_cast<int>(c.kv_lens.size()), c.kv_lens[0], c.page_size,
                                   static_cast<int>(c.kv_dtype), c.q_len_per_req);
  auto& slot = cache[key];
  if (!slot) slot = std::make_unique<AttnProblem>(ptest::build(c));
  return *slot;
}

void report(benchmark::State& state, const AttnProblem& p, int64_t pairs, int64_t kv_tokens) {
  const double kv_bytes = static_cast<double>(kv_tokens) * p.c.Hkv * p.c.D * 2 * ptest::elem_size(p.c.kv_dtype);
  const double qo_bytes = 2.0 * p.rows * p.c.Hq * p.c.D * ptest::elem_size(p.c.q_dtype);
  const double flops = 4.0 * p.c.Hq * p.c.D * static_cast<double>(pairs);
  using C = benchmark::Counter;
  state.counters["bytes"] = C(kv_bytes + qo_bytes, C::kIsIterationInvariantRate, C::kIs1000);
  state.counters["FLOP"] = C(flops, C::kIsIterationInvariantRate, C::kIs1000);
}

// Decode: batch x ctx, page size, KV dtype (0 bf16, 1 fp8), q_len_per_req.
void BM_Decode(benchmark::State& state) {
  const Shape s;
  AttnCase c;
  c.Hq = s.hq, c.Hkv = s.hkv, c.D = s.d;
  c.kv_lens.assign(state.range(0), static_cast<int>(state.range(1)));
  c.page_size = static_cast<int>(state.range(2));
  c.kv_dtype = state.range(3) ? DType::fp8_e4m3 : DType::bf16;
  c.q_len_per_req = static_cast<int>(state.range(4));
  c.with_lse = false, c.keep_values = false, c.spare_pages = 0;
  const AttnProblem& p = cached(c);
  const auto views = p.host_views();
  for (auto _ : state) ptest::run_attention(p, views);
  int64_t pairs = 0, tokens = 0;
  for (int L : c.kv_lens) pairs += causal_pairs(c.q_len_per_req, L), tokens += L;
  report(state, p, pairs, tokens);
}
BENCHMARK(BM_Decode)
    ->ArgNames({"batch", "ctx", "page", "fp8", "q_len"})
    ->Args({4, 4096, 16, 0, 1})
    ->Args({4, 4096, 64, 0, 1})
    ->Args({4, 4096, 16, 1, 1})
    ->Args({4, 4096, 16, 0, 4})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Prefill: batch x ctx, causal, no prefix, page 16; or a chunk of n new tokens over
// ctx - n cached ones (range 2).
void BM_Prefill(benchmark::State& state) {
  const Shape s;
  AttnCase c;
  c.decode = false;
  c.Hq = s.hq, c.Hkv = s.hkv, c.D = s.d, c.page_size = 16;
  const int ctx = static_cast<int>(state.range(1)), n = static_cast<int>(state.range(2));
  c.kv_lens.assign(state.range(0), ctx);
  c.q_lens.assign(state.range(0), n);
  c.q_len_per_req = n;  // distinguishes the cached problems
  c.with_lse = false, c.keep_values = false, c.spare_pages = 0;
  const AttnProblem& p = cached(c);
  const auto views = p.host_views();
  for (auto _ : state) ptest::run_attention(p, views);
  const int64_t pairs = c.kv_lens.size() * causal_pairs(n, ctx);
  // K/V bytes: each key read once per request (the ideal for a tiled kernel).
  report(state, p, pairs, static_cast<int64_t>(c.kv_lens.size()) * ctx);
}
BENCHMARK(BM_Prefill)
    ->ArgNames({"batch", "ctx", "q_len"})
    ->Args({1, 1024, 1024})
    ->Args({1, 1536, 512})  // chunked prefill: 512 new tokens over 1k cached
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
