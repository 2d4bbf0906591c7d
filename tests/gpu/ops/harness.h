// GPU test harness: host/device tensor pairs with poisoning, a paged attention case
// builder, and runners that compute one case on CUDA, on the CPU path and in the fp64
// oracle (tests/oracle/oracle.h). Poisoning: every byte outside the valid region is
// 0xFF (NaN for bf16/fp16/fp32, NaN for fp8 e4m3), page-table tails hold garbage ids,
// outputs start as NaN; a kernel reading or writing outside the contract shows up as a
// NaN or a changed byte.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "oracle/oracle.h"
#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#include "pagedmha/ops.h"
#include "pagedmha/tensor.h"

namespace gpu_test {

using pagedmha::Buffer;
using pagedmha::Device;
using pagedmha::DType;
using pagedmha::TensorView;

#define CUDA_OK(expr) ASSERT_EQ(cudaSuccess, (expr)) << cudaGetErrorString(cudaGetLastError())

inline oracle::Format format_of(DType t) {
  switch (t) {
    case DType::bf16: return oracle::Format::bf16;
    case DType::fp16: return oracle::Format::fp16;
    case DType::fp8_e4m3: return oracle::Format::fp8_e4m3;
    default: return oracle::Format::fp32;
  }
}

/// A strided tensor held on the host (the CPU path works on it directly) with a device
/// twin. Shapes and strides in elements; `host` spans the largest offset.
struct Tensor {
  DType dtype = DType::fp32;
  std::vector<int64_t> shape, strides;
  std::vector<uint8_t> host;
  Buffer dev;

  Tensor() = default;
  Tensor(DType dt, std::vector<int64_t> shp, std::vector<int64_t> str = {}, uint8_t fill = 0xFF)
      : dtype(dt), shape(std::move(shp)), strides(std::move(str)) {
    if (strides.empty()) {
      strides.assign(shape.size(), 1);
      for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
    }
    int64_t span = 1;
    for (size_t i = 0; i < shape.size(); ++i) span += (shape[i] - 1) * strides[i];
    bool empty = false;
    for (int64_t s : shape) empty = empty || s == 0;
    host.assign(static_cast<size_t>(empty ? 1 : span) * pagedmha::dtype_size(dt), fill);
  }
  size_t elem() const { return pagedmha::dtype_size(dtype); }
  int64_t offset(std::initializer_list<int64_t> idx) const {
    int64_t o = 0, i = 0;
    for (int64_t x : idx) o += x * strides[i++];
    return o;
  }
  void* ptr(int64_t off) { return host.data() + off * elem(); }
  const void* ptr(int64_t off) const { return host.data() + off * elem(); }
  double get(int64_t off) const { return oracle::load(format_of(dtype), ptr(off)); }
  void set(int64_t off, double x) { oracle::store(format_of(dtype), x, ptr(off)); }
  int32_t& i32(int64_t off) { return reinterpret_cast<int32_t*>(host.data())[off]; }
  int32_t i32(int64_t off) const { return reinterpret_cast<const int32_t*>(host.data())[off]; }

  TensorView view_on(void* data, Device d) const {
    return TensorView::from_arrays(data, dtype, d, static_cast<int>(shape.size()), shape.data(), strides.data());
  }
  TensorView cpu() { return view_on(host.data(), Device::cpu()); }
  TensorView gpu() { return view_on(dev.data(), Device::cuda(0)); }
  void upload() {
    if (!dev.data()) dev = Buffer(host.size(), Device::cuda(0));
    pagedmha::copy_bytes(dev.data(), Device::cuda(0), host.data(), Device::cpu(), host.size());
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(host.size());
    pagedmha::copy_bytes(out.data(), Device::cpu(), dev.data(), Device::cuda(0), host.size());
    return out;
  }
  /// A host-only copy (same bytes, no device twin).
  Tensor clone() const {
    Tensor t;
    t.dtype = dtype;
    t.shape = shape;
    t.strides = strides;
    t.host = host;
    return t;
  }
};

inline Tensor int32_tensor(const std::vector<int32_t>& v) {
  Tensor t(DType::int32, {static_cast<int64_t>(v.size())});
  if (!v.empty()) std::memcpy(t.host.data(), v.data(), v.size() * 4);
  return t;
}

/// Random values of realistic magnitude, never zero; `outlier` scales a few channels.
struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  double normal() {
    std::normal_distribution<double> d(0.0, 1.0);
    double x = d(gen);
    return x == 0 ? 0.5 : x;
  }
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }  // [lo, hi]
};

// ---------------------------------------------------------------------------------
// Paged attention cases.

struct AttnSpec {
  int num_q_heads = 8, num_kv_heads = 2, head_dim = 128, page_size = 16;
  DType q_dtype = DType::bf16, kv_dtype = DType::bf16;
  std::vector<int> seq_lens;
  bool decode = true;
  int q_len_per_req = 1;    // decode
  std::vector<int> q_lens;  // prefill (ragged)
  int window_left = -1;
  float soft_cap = 0.0f;
  std::vector<float> sinks;  // empty: none
  bool causal = true;
  bool lse = true;
  int num_splits = 0;
  double sm_scale = 0.0;  // 0: head_dim^-0.5
  float k_scale = 1.0f, v_scale = 1.0f;
  int row_pad = 0;         // extra elements per q/out row: strided views
  bool hnd = false;        // cache viewed as [pages, Hkv, P, D] through strides
  bool release_before_window = false;  // window pages wholly before the first key -> 0
  double outlier = 0.0;    // > 0: channel 3 of K and V scaled by this
  double value_scale = 1.0;
  uint64_t seed = 1;
};

struct AttnCase {
  AttnSpec spec;
  int batch = 0, rows = 0, cols = 0;
  int64_t num_pages = 0;
  std::vector<int> qlen;  // per request
  std::vector<int> first_row;
  Tensor q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, sinks, out, lse;
  std::vector<std::vector<int32_t>> pages;  // real page ids per request

  float bmm1() const {
    const double sm = spec.sm_scale > 0 ? spec.sm_scale : 1.0 / std::sqrt(static_cast<double>(spec.head_dim));
    return static_cast<float>(sm * spec.k_scale);
  }
  float bmm2() const { return spec.v_scale; }
  pagedmha::AttentionParams params(bool gpu) {
    pagedmha::AttentionParams p;
    p.bmm1_scale = bmm1();
    p.bmm2_scale = bmm2();
    p.window_left = spec.window_left;
    p.logits_soft_cap = spec.soft_cap;
    p.causal = spec.causal;
    p.num_splits = spec.num_splits;
    if (!spec.sinks.empty()) p.sinks = gpu ? sinks.gpu() : sinks.cpu();
    return p;
  }
};

/// Builds a case: pages assigned at random (page 0 reserved and zero), unused pages and
/// slots past seq_len poisoned, table tails garbage, q random, out/lse NaN.
inline AttnCase build_case(const AttnSpec& s) {
  AttnCase c;
  c.spec = s;
  Rng rng(s.seed);
  const int B = static_cast<int>(s.seq_lens.size());
  const int P = s.page_size, Hkv = s.num_kv_heads, D = s.head_dim, Hq = s.num_q_heads;
  c.batch = B;
  c.first_row.resize(B + 1, 0);
  for (int b = 0; b < B; ++b) {
    c.qlen.push_back(s.decode ? s.q_len_per_req : s.q_lens.at(b));
    c.first_row[b + 1] = c.first_row[b] + c.qlen[b];
  }
  c.rows = c.first_row[B];
  int total_pages = 0, max_pages = 0;
  for (int L : s.seq_lens) {
    const int n = (L + P - 1) / P;
    total_pages += n;
    max_pages = std::max(max_pages, n);
  }
  const int spare = 3;  // poisoned pages nobody owns; table tails point at them
  c.num_pages = 1 + total_pages + spare;
  c.cols = max_pages + 2;

  // Cache: [num_pages, P, Hkv, D] in NHD or HND order, all 0xFF, page 0 zero.
  const int64_t page_elems = static_cast<int64_t>(P) * Hkv * D;
  std::vector<int64_t> strides = s.hnd ? std::vector<int64_t>{page_elems, D, static_cast<int64_t>(P) * D, 1}
                                       : std::vector<int64_t>{page_elems, static_cast<int64_t>(Hkv) * D, D, 1};
  for (Tensor* t : {&c.k_cache, &c.v_cache}) {
    *t = Tensor(s.kv_dtype, {c.num_pages, P, Hkv, D}, strides);
    std::fill(t->host.begin(), t->host.begin() + page_elems * t->elem(), 0);
  }
  std::vector<int32_t> ids(c.num_pages - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng.gen);
  size_t next = 0;
  const int spare_id = ids[ids.size() - 1];

  c.page_table = Tensor(DType::int32, {B, c.cols});
  std::vector<int32_t> lens(s.seq_lens.begin(), s.seq_lens.end());
  c.pages.resize(B);
  for (int b = 0; b < B; ++b) {
    const int L = s.seq_lens[b];
    const int used = (L + P - 1) / P;
    const int first_key = s.window_left >= 0 ? std::max(0, L - c.qlen[b] - s.window_left) : 0;
    for (int col = 0; col < c.cols; ++col) {
      int32_t id;
      if (col < used) {
        id = ids[next++];
        c.pages[b].push_back(id);
      } else {
        const int32_t garbage[] = {-1, 0x7fffff00, spare_id, -7};
        id = garbage[col % 4];
      }
      c.page_table.i32(static_cast<int64_t>(b) * c.cols + col) = id;
    }
    for (int p = 0; p < L; ++p) {
      const int32_t id = c.pages[b][p / P];
      for (int h = 0; h < Hkv; ++h) {
        for (int d = 0; d < D; ++d) {
          const double boost = (s.outlier > 0 && d == 3) ? s.outlier : 1.0;
          // fp8 caches hold stored values: dequantised value = stored * scale.
          const double kx = rng.normal() * boost / (s.kv_dtype == DType::fp8_e4m3 ? s.k_scale : 1.0);
          const double vx = rng.normal() * boost * s.value_scale / (s.kv_dtype == DType::fp8_e4m3 ? s.v_scale : 1.0);
          c.k_cache.set(c.k_cache.offset({id, p % P, h, d}), kx);
          c.v_cache.set(c.v_cache.offset({id, p % P, h, d}), vx);
        }
      }
    }
    if (s.release_before_window) {
      for (int col = 0; col < first_key / P; ++col) c.page_table.i32(static_cast<int64_t>(b) * c.cols + col) = 0;
    }
  }
  c.seq_lens = int32_tensor(lens);
  std::vector<int32_t> cu(c.first_row.begin(), c.first_row.end());
  c.cu_seqlens_q = int32_tensor(cu);
  if (!s.sinks.empty()) {
    c.sinks = Tensor(DType::fp32, {Hq});
    for (int h = 0; h < Hq; ++h) std::memcpy(c.sinks.ptr(h), &s.sinks[h], 4);
  }
  const int64_t row = static_cast<int64_t>(Hq) * D + s.row_pad;
  c.q = Tensor(s.q_dtype, {c.rows, Hq, D}, {row, D, 1});
  for (int r = 0; r < c.rows; ++r)
    for (int h = 0; h < Hq; ++h)
      for (int d = 0; d < D; ++d) c.q.set(c.q.offset({r, h, d}), rng.normal());
  const DType out_dtype = s.q_dtype == DType::fp8_e4m3 ? DType::bf16 : s.q_dtype;
  c.out = Tensor(out_dtype, {c.rows, Hq, D}, {row, D, 1});
  c.lse = Tensor(DType::fp32, {c.rows, Hq});
  return c;
}

/// The fp64 oracle's o and lse of every row (dequantised cache: value = stored * scale,
/// scales folded into bmm1/bmm2 as the library does).
struct Reference {
  std::vector<double> o, lse;
  std::vector<int> visible;
};

inline Reference oracle_reference(const AttnCase& c) {
  const AttnSpec& s = c.spec;
  const int Hq = s.num_q_heads, Hkv = s.num_kv_heads, D = s.head_dim, P = s.page_size;
  Reference ref;
  ref.o.assign(static_cast<size_t>(c.rows) * Hq * D, 0);
  ref.lse.assign(static_cast<size_t>(c.rows) * Hq, 0);
  ref.visible.assign(static_cast<size_t>(c.rows) * Hq, 0);
  std::vector<double> sinks(s.sinks.begin(), s.sinks.end());
  oracle::AttentionSpec os;
  os.num_q_heads = Hq;
  os.num_kv_heads = Hkv;
  os.head_dim = D;
  os.bmm1_scale = c.bmm1();
  os.bmm2_scale = c.bmm2();
  os.window_left = s.window_left;
  os.soft_cap = s.soft_cap;
  os.causal = s.causal;
  os.sinks = s.sinks.empty() ? nullptr : &sinks;
#pragma omp parallel for schedule(dynamic)
  for (int b = 0; b < c.batch; ++b) {
    const int L = s.seq_lens[b], n = c.qlen[b];
    std::vector<double> q(static_cast<size_t>(n) * Hq * D), k(static_cast<size_t>(L) * Hkv * D),
        v(static_cast<size_t>(L) * Hkv * D);
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < Hq; ++h)
        for (int d = 0; d < D; ++d) q[(static_cast<size_t>(i) * Hq + h) * D + d] = c.q.get(c.q.offset({c.first_row[b] + i, h, d}));
    for (int j = 0; j < L; ++j) {
      // Through the table as the kernels must (released columns read page 0: masked).
      const int32_t id = c.page_table.i32(static_cast<int64_t>(b) * c.cols + j / P);
      for (int h = 0; h < Hkv; ++h)
        for (int d = 0; d < D; ++d) {
          k[(static_cast<size_t>(j) * Hkv + h) * D + d] = c.k_cache.get(c.k_cache.offset({id, j % P, h, d}));
          v[(static_cast<size_t>(j) * Hkv + h) * D + d] = c.v_cache.get(c.v_cache.offset({id, j % P, h, d}));
        }
    }
    oracle::attention(os, n, L, q.data(), k.data(), v.data(), ref.o.data() + static_cast<size_t>(c.first_row[b]) * Hq * D,
                      ref.lse.data() + static_cast<size_t>(c.first_row[b]) * Hq,
                      ref.visible.data() + static_cast<size_t>(c.first_row[b]) * Hq);
  }
  return ref;
}

/// Output of one run: out and lse tensors (host bytes, same layout as the case's).
struct Result {
  Tensor out, lse;
};

inline void call_op(AttnCase& c, bool gpu, Tensor& out, Tensor& lse, const TensorView& workspace,
                    pagedmha::Stream stream = {}) {
  auto v = [&](Tensor& t) { return gpu ? t.gpu() : t.cpu(); };
  const TensorView lse_view = c.spec.lse ? v(lse) : TensorView{};
  if (c.spec.decode) {
    pagedmha::batch_decode(v(c.q), v(c.k_cache), v(c.v_cache), v(c.page_table), v(c.seq_lens), c.spec.page_size,
                           c.spec.q_len_per_req, v(out), c.params(gpu), lse_view, workspace, stream);
  } else {
    const int max_q = c.qlen.empty() ? 0 : *std::max_element(c.qlen.begin(), c.qlen.end());
    pagedmha::batch_prefill(v(c.q), v(c.k_cache), v(c.v_cache), v(c.page_table), v(c.seq_lens), v(c.cu_seqlens_q),
                            c.spec.page_size, max_q, v(out), c.params(gpu), lse_view, stream);
  }
}

inline Result run_cpu(AttnCase& c) {
  Result r{c.out.clone(), c.lse.clone()};
  call_op(c, false, r.out, r.lse, {});
  return r;
}

/// Uploads the case (inputs once), runs on the GPU with a NaN-poisoned workspace.
inline Result run_gpu(AttnCase& c, int num_splits = -1) {
  for (Tensor* t : {&c.q, &c.k_cache, &c.v_cache, &c.page_table, &c.seq_lens, &c.cu_seqlens_q})
    if (!t->dev.data()) t->upload();
  if (!c.spec.sinks.empty() && !c.sinks.dev.data()) c.sinks.upload();
  Result r{c.out.clone(), c.lse.clone()};
  r.out.upload();
  r.lse.upload();
  const int saved = c.spec.num_splits;
  if (num_splits >= 0) c.spec.num_splits = num_splits;
  Buffer ws;
  TensorView wsv;
  if (c.spec.decode) {
    const size_t bytes = pagedmha::decode_workspace_size(Device::cuda(0), c.batch, c.spec.q_len_per_req,
                                                         c.spec.num_q_heads, c.spec.num_kv_heads, c.spec.head_dim);
    if (bytes > 0) {
      ws = Buffer(bytes, Device::cuda(0));
      pagedmha::fill_bytes(ws.data(), Device::cuda(0), 0xFF, bytes);
      wsv = ws.bytes_view();
    }
  }
  call_op(c, true, r.out, r.lse, wsv);
  c.spec.num_splits = saved;
  pagedmha::synchronize();
  r.out.host = r.out.download();
  r.lse.host = r.lse.download();
  return r;
}

// ---------------------------------------------------------------------------------
// Comparisons. Tolerances (TESTING.md): 16-bit outputs rel L2 <= 1e-2 and max-abs
// <= 2e-2 * max(1, max |ref|); lse within 1e-3 + 1e-4 |lse|; NaN never passes; empty
// rows exactly 0 with lse -inf (or the sink); strided padding bytes never written.

inline void expect_matches(const AttnCase& c, const Result& got, const Reference& ref, const std::string& what) {
  const int Hq = c.spec.num_q_heads, D = c.spec.head_dim;
  double err2 = 0, ref2 = 0, max_err = 0, max_ref = 0;
  int64_t bad = 0, not_written = 0;
  for (int r = 0; r < c.rows; ++r)
    for (int h = 0; h < Hq; ++h) {
      const size_t rh = static_cast<size_t>(r) * Hq + h;
      for (int d = 0; d < D; ++d) {
        const double x = got.out.get(got.out.offset({r, h, d}));
        const double y = ref.o[rh * D + d];
        if (!std::isfinite(x)) {
          ++not_written;
          continue;
        }
        if (ref.visible[rh] == 0 && x != 0.0) ++bad;
        err2 += (x - y) * (x - y);
        ref2 += y * y;
        max_err = std::max(max_err, std::fabs(x - y));
        max_ref = std::max(max_ref, std::fabs(y));
      }
      if (c.spec.lse) {
        float l;
        std::memcpy(&l, got.lse.ptr(got.lse.offset({r, h})), 4);
        const double y = ref.lse[rh];
        if (std::isinf(y)) {
          EXPECT_TRUE(std::isinf(l) && l < 0) << what << ": lse[" << r << ", " << h << "] = " << l << ", expected -inf";
        } else {
          EXPECT_NEAR(l, y, 1e-3 + 1e-4 * std::fabs(y)) << what << ": lse[" << r << ", " << h << "]";
        }
      }
    }
  EXPECT_EQ(not_written, 0) << what << ": output elements NaN/Inf (unwritten or poisoned reads)";
  EXPECT_EQ(bad, 0) << what << ": rows with no visible key must be exactly 0";
  const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  EXPECT_LE(rel, 1e-2) << what << ": relative L2 error";
  EXPECT_LE(max_err, 2e-2 * std::max(1.0, max_ref)) << what << ": max abs error";
  // Row padding of strided outputs stays poisoned (never written).
  if (c.spec.row_pad > 0) {
    int64_t touched = 0;
    for (int r = 0; r < c.rows; ++r) {
      const uint8_t* p = static_cast<const uint8_t*>(got.out.ptr(got.out.offset({r, Hq - 1, D})));
      for (size_t b = 0; b < static_cast<size_t>(c.spec.row_pad) * got.out.elem(); ++b) touched += p[b] != 0xFF;
    }
    EXPECT_EQ(touched, 0) << what << ": bytes written in the padding of strided out rows";
  }
}

/// Reference from a Result (e.g. the CPU path), for GPU-vs-CPU comparison.
inline Reference as_reference(const AttnCase& c, const Result& r, const Reference& oracle_ref) {
  Reference out = oracle_ref;  // keeps `visible`
  const int Hq = c.spec.num_q_heads, D = c.spec.head_dim;
  for (int row = 0; row < c.rows; ++row)
    for (int h = 0; h < Hq; ++h) {
      const size_t rh = static_cast<size_t>(row) * Hq + h;
      for (int d = 0; d < D; ++d) out.o[rh * D + d] = r.out.get(r.out.offset({row, h, d}));
      if (c.spec.lse) {
        float l;
        std::memcpy(&l, r.lse.ptr(r.lse.offset({row, h})), 4);
        out.lse[rh] = l;
      }
    }
  return out;
}

/// The full check of one case: GPU vs oracle, CPU path vs oracle, GPU vs CPU path.
inline void check_case(AttnCase& c, const std::string& what) {
  const Reference ref = oracle_reference(c);
  const Result cpu = run_cpu(c);
  const Result gpu = run_gpu(c);
  expect_matches(c, cpu, ref, what + " [cpu vs oracle]");
  expect_matches(c, gpu, ref, what + " [gpu vs oracle]");
  expect_matches(c, gpu, as_reference(c, cpu, ref), what + " [gpu vs cpu]");
}

inline std::string describe(const AttnSpec& s) {
  std::string r = std::string(s.decode ? "decode" : "prefill") + " Hq=" + std::to_string(s.num_q_heads) +
                  " Hkv=" + std::to_string(s.num_kv_heads) + " D=" + std::to_string(s.head_dim) +
                  " P=" + std::to_string(s.page_size) + " q=" + pagedmha::dtype_name(s.q_dtype) +
                  " kv=" + pagedmha::dtype_name(s.kv_dtype) + " B=" + std::to_string(s.seq_lens.size()) +
                  " n=" + std::to_string(s.q_len_per_req) + " W=" + std::to_string(s.window_left) +
                  " cap=" + std::to_string(s.soft_cap) + " sinks=" + std::to_string(!s.sinks.empty()) +
                  " causal=" + std::to_string(s.causal) + " splits=" + std::to_string(s.num_splits) +
                  " pad=" + std::to_string(s.row_pad) + " hnd=" + std::to_string(s.hnd);
  return r;
}

inline bool have_gpu() { return pagedmha::cuda_available(); }

// The gpu label runs only where a device is expected: a missing one is a failure.
#define REQUIRE_GPU() ASSERT_TRUE(::gpu_test::have_gpu()) << "no CUDA device visible"

}  // namespace gpu_test
