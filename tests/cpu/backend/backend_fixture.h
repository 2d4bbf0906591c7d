// Helpers of the backend suites: host int32 tensors, a paged pool filled with random
// values, and the oracle reference of one request read through its page-table row.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "oracle/oracle.h"
#include "pagedmha/backend.h"
#include "pagedmha/memory.h"
#include "pagedmha/registry.h"

namespace btest {

using namespace pagedmha;

inline oracle::Format fmt(DType t) {
  return t == DType::fp8_e4m3 ? oracle::Format::fp8_e4m3
                              : (t == DType::fp16 ? oracle::Format::fp16 : oracle::Format::bf16);
}

/// A host int32 tensor owning its values.
struct Ints {
  std::vector<int32_t> v;
  std::vector<int64_t> shape;
  explicit Ints(std::vector<int32_t> values) : v(std::move(values)), shape{static_cast<int64_t>(v.size())} {}
  Ints(std::vector<int32_t> values, int64_t rows, int64_t cols) : v(std::move(values)), shape{rows, cols} {}
  TensorView view() {
    return shape.size() == 1 ? TensorView(v.data(), DType::int32, Device::cpu(), {shape[0]})
                             : TensorView(v.data(), DType::int32, Device::cpu(), {shape[0], shape[1]});
  }
};

inline std::vector<int32_t> values(const TensorView& t) {
  std::vector<int32_t> out;
  if (t.ndim == 1) {
    for (int64_t i = 0; i < t.size(0); ++i) out.push_back(t.ptr<int32_t>()[i * t.stride(0)]);
  } else {
    for (int64_t r = 0; r < t.size(0); ++r)
      for (int64_t c = 0; c < t.size(1); ++c) out.push_back(t.ptr<int32_t>()[r * t.stride(0) + c * t.stride(1)]);
  }
  return out;
}

/// Row-major float storage of `dtype` elements (bf16 / fp16 / fp8) on the host.
struct Floats {
  DType dtype;
  std::vector<uint8_t> bytes;
  std::vector<int64_t> shape;
  Floats(DType t, std::vector<int64_t> s) : dtype(t), shape(std::move(s)) {
    int64_t n = 1;
    for (int64_t x : shape) n *= x;
    bytes.assign(static_cast<size_t>(n) * dtype_size(t), 0);
  }
  int64_t numel() const { return static_cast<int64_t>(bytes.size() / dtype_size(dtype)); }
  void* at(int64_t i) { return bytes.data() + i * dtype_size(dtype); }
  double get(int64_t i) { return oracle::load(fmt(dtype), at(i)); }
  void set(int64_t i, double x) { oracle::store(fmt(dtype), x, at(i)); }
  void randomize(std::mt19937& rng, double scale = 1.0) {
    std::normal_distribution<double> nd(0.0, scale);
    for (int64_t i = 0; i < numel(); ++i) set(i, nd(rng));
  }
  TensorView view() {
    return TensorView::from_arrays(bytes.data(), dtype, Device::cpu(), static_cast<int>(shape.size()), shape.data());
  }
};

/// A model layer with its paged pool [num_pages * P, Hkv, D]; page 0 is zero.
struct Layer {
  LayerSpec spec;
  Floats k, v;
  int P;
  Layer(int Hq, int Hkv, int D, int P_, int num_pages, DType kv_dtype, std::mt19937& rng)
      : k(kv_dtype, {int64_t{num_pages} * P_, Hkv, D}), v(kv_dtype, {int64_t{num_pages} * P_, Hkv, D}), P(P_) {
    spec.num_q_heads = Hq;
    spec.num_kv_heads = Hkv;
    spec.head_dim = D;
    spec.scaling = 1.0f / std::sqrt(static_cast<float>(D));
    k.randomize(rng);
    v.randomize(rng);
    const int64_t page0 = int64_t{P_} * Hkv * D;  // the dummy page stays zero
    for (int64_t i = 0; i < page0; ++i) k.set(i, 0), v.set(i, 0);
  }
  KvCacheView kv() { return {k.view(), v.view()}; }
  bool fp8() const { return k.dtype == DType::fp8_e4m3; }

  /// Oracle output [n, Hq, D] of queries q[rows] of one request with KV length L read
  /// through `table_row`; causal bottom-right as in docs/semantics.md section 1.
  std::vector<double> reference(const std::vector<double>& q, int n, int L, const int32_t* table_row) {
    const int Hkv = spec.num_kv_heads, D = spec.head_dim;
    std::vector<double> kk(static_cast<size_t>(std::max(L, 1)) * Hkv * D), vv(kk.size());
    for (int j = 0; j < L; ++j) {
      const int64_t slot = oracle::slot_of(table_row, j, P);
      for (int e = 0; e < Hkv * D; ++e) {
        kk[static_cast<size_t>(j) * Hkv * D + e] = k.get(slot * Hkv * D + e);
        vv[static_cast<size_t>(j) * Hkv * D + e] = v.get(slot * Hkv * D + e);
      }
    }
    oracle::AttentionSpec s;
    s.num_q_heads = spec.num_q_heads;
    s.num_kv_heads = Hkv;
    s.head_dim = D;
    s.bmm1_scale = double(spec.scaling) * (fp8() ? spec.k_scale : 1.0);
    s.bmm2_scale = fp8() ? spec.v_scale : 1.0;
    s.window_left = spec.window_left;
    s.soft_cap = spec.logits_soft_cap;
    std::vector<double> sinks;
    for (int h = 0; spec.sinks.defined() && h < spec.num_q_heads; ++h) sinks.push_back(spec.sinks.ptr<const float>()[h]);
    if (!sinks.empty()) s.sinks = &sinks;
    std::vector<double> o(static_cast<size_t>(n) * spec.num_q_heads * D), lse(static_cast<size_t>(n) * spec.num_q_heads);
    oracle::attention(s, n, L, q.data(), kk.data(), vv.data(), o.data(), lse.data());
    return o;
  }
};

/// Rows [row0, row0 + n) of a [T, H * D] tensor as doubles.
inline std::vector<double> rows_of(Floats& t, int row0, int n) {
  const int64_t w = t.shape[1];
  std::vector<double> out;
  for (int64_t i = row0 * w; i < (row0 + n) * w; ++i) out.push_back(t.get(i));
  return out;
}

/// Max |out - ref| relative to max |ref| (bf16 output: about 4e-3).
inline ::testing::AssertionResult close(const std::vector<double>& got, const std::vector<double>& ref,
                                        double tol = 1e-2) {
  double err = 0, mag = 1e-6;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return ::testing::AssertionFailure() << "non-finite output at " << i;
    err = std::max(err, std::fabs(got[i] - ref[i]));
    mag = std::max(mag, std::fabs(ref[i]));
  }
  if (err > tol * mag) return ::testing::AssertionFailure() << "max error " << err << " vs max |ref| " << mag;
  return ::testing::AssertionSuccess();
}

/// A decode step's batch: batch_size = seq_lens' length, the rest of the fields unset.
inline ForwardBatch decode_batch(const TensorView& seq_lens, const TensorView& req_pool_indices,
                                 const TensorView& req_to_page) {
  ForwardBatch fb;
  fb.forward_mode = ForwardMode::decode;
  fb.batch_size = static_cast<int>(seq_lens.size(0));
  fb.seq_lens = seq_lens;
  fb.req_pool_indices = req_pool_indices;
  fb.req_to_page = req_to_page;
  return fb;
}

/// A backend config of `page_size`, `context_len`, `max_bs` and N speculative tokens
/// (everything else the defaults).
inline BackendConfig make_config(int page_size, int context_len, int max_bs, int N = 1) {
  BackendConfig c;
  c.page_size = page_size;
  c.context_len = context_len;
  c.max_bs = max_bs;
  c.spec_num_tokens = N;
  return c;
}

}  // namespace btest
