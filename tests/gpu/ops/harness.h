// GPU side of the test suites. Problems, poisoning, the fp64 oracle and the comparison
// are ptest's (tests/oracle/test_util.h), shared with the CPU suites; this header only
// mirrors a problem's host storages on the device, runs the op there and copies the
// outputs back into the host storages, so that check_attention judges a GPU run (the
// poison outside out's view included) exactly as it judges a CPU one.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "oracle/test_util.h"
#include "pagedmha/error.h"
#include "pagedmha/memory.h"

namespace gpu_test {

using namespace ptest;
using pagedmha::Buffer;

#define CUDA_OK(expr) ASSERT_EQ(cudaSuccess, (expr)) << cudaGetErrorString(cudaGetLastError())

inline Device gpu() { return Device::cuda(0); }

/// Device twins of host storages: one per distinct storage (interleaved K and V, or q
/// in a fused buffer, share theirs), copied to the device on first use.
class DeviceMirror {
 public:
  void* base_of(const HostTensor& t) {
    auto it = twins_.find(t.storage);
    if (it != twins_.end()) return it->second.data();
    Buffer& b = twins_[t.storage] = Buffer(t.storage->size(), gpu());
    pagedmha::copy_bytes(b.data(), gpu(), t.base(), Device::cpu(), t.storage->size());
    return b.data();
  }
  TensorView view(const HostTensor& t) { return t.view_at(base_of(t), gpu()); }
  AttnViews views(const AttnProblem& p) {
    return p.views([this](const HostTensor& t) { return base_of(t); }, gpu());
  }
  /// Host storage -> its twin again (after the test edited it), on `stream`.
  void upload(const HostTensor& t, cudaStream_t stream = nullptr) {
    pagedmha::copy_bytes(base_of(t), gpu(), t.base(), Device::cpu(), t.storage->size(), pagedmha::Stream{stream});
  }
  /// The twin -> host storage, whole (bytes outside t's view included).
  void download(const HostTensor& t) {
    pagedmha::synchronize();
    pagedmha::copy_bytes(t.base(), Device::cpu(), base_of(t), gpu(), t.storage->size());
    pagedmha::synchronize();
  }

 private:
  std::map<std::shared_ptr<std::vector<uint8_t>>, Buffer> twins_;
};

/// A workspace for `p` filled with 0xFF (decode: partial results never written read as
/// NaN; prefill: a plan entry never written is a wild tile); empty when none is needed.
inline Buffer poisoned_workspace(const AttnProblem& p) {
  const size_t bytes =
      p.c.decode ? pagedmha::decode_workspace_size(gpu(), p.batch, p.c.q_len_per_req, p.c.Hq, p.c.Hkv, p.c.D)
                 : pagedmha::prefill_workspace_size(gpu(), p.batch, p.rows);
  if (bytes == 0) return {};
  Buffer ws(bytes, gpu());
  pagedmha::fill_bytes(ws.data(), gpu(), 0xFF, bytes);
  return ws;
}

/// Runs `p` on the GPU with device views `v` (a poisoned workspace added) and waits.
inline void launch(const AttnProblem& p, AttnViews v, int num_splits = 0, int sm_margin = 0) {
  const Buffer ws = poisoned_workspace(p);
  if (ws.data()) v.workspace = ws.bytes_view();
  run_attention(p, v, num_splits, {}, sm_margin);
  pagedmha::synchronize();
}

/// Runs `p` on the GPU (inputs copied once per mirror) and copies out and lse back
/// into p's host storages.
inline void run_gpu(const AttnProblem& p, DeviceMirror& dev, int num_splits = 0, int sm_margin = 0) {
  launch(p, dev.views(p), num_splits, sm_margin);
  dev.download(p.out);
  if (p.c.with_lse) dev.download(p.lse);
}

inline void run_gpu(const AttnProblem& p, int num_splits = 0) {
  DeviceMirror dev;
  run_gpu(p, dev, num_splits);
}

/// Rows [start, start + rows) of a [R, H, D] view, every `step`-th row.
inline TensorView row_slice(TensorView v, int64_t start, int64_t rows, int64_t step = 1) {
  v.data = static_cast<uint8_t*>(v.data) + start * v.strides[0] * static_cast<int64_t>(elem_size(v.dtype));
  v.shape[0] = rows;
  v.strides[0] *= step;
  return v;
}

inline std::string describe(const AttnCase& c) {
  auto num = [](double x) {
    std::ostringstream o;
    o << x;
    return o.str();
  };
  std::string sinks;
  for (double x : sink_values_for(c)) sinks += (sinks.empty() ? "" : ",") + num(x);
  return (c.name == AttnCase().name ? "" : c.name + ": ") + (c.decode ? "decode" : "prefill") + " Hq=" + std::to_string(c.Hq) + " Hkv=" +
         std::to_string(c.Hkv) + " D=" + std::to_string(c.D) + " P=" + std::to_string(c.page_size) +
         " q=" + pagedmha::dtype_name(c.q_dtype) + " kv=" + pagedmha::dtype_name(c.kv_dtype) +
         " B=" + std::to_string(c.kv_lens.size()) + " n=" + std::to_string(c.q_len_per_req) +
         " W=" + std::to_string(c.window_left) + " cap=" + num(c.soft_cap) +
         " sinks=" + (c.sinks == SinkMode::none ? "none" : sinks) + " causal=" + std::to_string(c.causal) +
         " lse=" + std::to_string(c.with_lse) + " cache=" + layout_name(c.layout) +
         " row_pad=" + std::to_string(c.row_pad) + " seed=" + std::to_string(c.seed);
}

/// The GPU suites' base case: Hq 8, Hkv 2, D 128, P 16, bf16, a 4-d NHD cache, pages
/// before a window kept in the table unless a case releases them.
inline AttnCase gpu_case(bool decode = true) {
  AttnCase c;
  c.decode = decode;
  c.Hq = 8, c.Hkv = 2, c.D = 128, c.page_size = 16;
  c.layout = CacheLayout::nhd4;
  c.release_window_pages = false;
  return c;
}

/// Runs `p` on the GPU; a thrown error fails the case named `name` (and returns false), so
/// the cases after it still run.
inline bool run_gpu_or_fail(const AttnProblem& p, const std::string& name, int num_splits = 0) {
  try {
    run_gpu(p, num_splits);
  } catch (const std::exception& e) {
    ADD_FAILURE() << name << ": " << e.what();
    return false;
  }
  return true;
}

/// Every query entry of `p` set to value() (in row, head, dim order).
template <class Value>
void fill_q(const AttnProblem& p, int hq, int d, Value value) {
  for (int64_t r = 0; r < p.q.shape[0]; ++r)
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < d; ++i) p.q.set({r, h, i}, value());
}

/// Builds `c`, runs it on the GPU and checks it against the oracle. A thrown error
/// fails this case only, so the cases after it still run.
inline void check_case(AttnCase c, int num_splits = 0, const Tolerance* tol = nullptr) {
  c.name = describe(c) + " splits=" + std::to_string(num_splits);
  const AttnProblem p = build(c);
  if (!run_gpu_or_fail(p, c.name, num_splits)) return;
  EXPECT_TRUE(tol ? check_attention(p, p.reference(), *tol) : check_attention(p, p.reference()));
}

/// Elementwise differences between two runs of the same problem: how many out
/// elements differ by more than one ulp of the output dtype, how many lse values by
/// more than fp32 rounding, the worst of each and the first out element past the bound.
/// Besides the ulp, an element may differ by 2^-4 ulp of its row's largest |o|: the
/// fp32 sums of a split run add the same terms in another order, and an element that
/// cancels to near 0 keeps their rounding error (bounded by the terms, not the result).
struct RunDiff {
  int64_t out_count = 0, lse_count = 0, out_total = 0, lse_total = 0;
  double out_worst = 0, lse_worst = 0;
  std::string out_where, lse_where, out_first;
};

inline RunDiff diff_runs(const AttnProblem& a, const AttnProblem& b) {
  RunDiff r;
  const int ulp_bits = a.out.dtype == DType::fp16 ? 10 : 7;
  for (int row = 0; row < a.rows; ++row)
    for (int h = 0; h < a.c.Hq; ++h) {
      double row_max = 0;
      for (int d = 0; d < a.c.D; ++d) {
        const double y = std::fabs(b.out.get({row, h, d}));
        if (std::isfinite(y)) row_max = std::max(row_max, y);  // an inf must not widen the bound
      }
      const double slack = std::ldexp(row_max, -ulp_bits - 4) + 1e-7;
      for (int d = 0; d < a.c.D; ++d) {
        const double x = a.out.get({row, h, d}), y = b.out.get({row, h, d});
        const double e = std::fabs(x - y);
        ++r.out_total;
        const bool out = !(e <= std::ldexp(std::max(std::fabs(x), std::fabs(y)), -ulp_bits) + slack);
        if (out && r.out_count == 0) {
          char buf[160];
          std::snprintf(buf, sizeof buf, "row %d head %d dim %d: %.6g vs %.6g (row max %.6g)", row, h, d, x, y,
                        row_max);
          r.out_first = buf;
        }
        r.out_count += out;
        if (!(e <= r.out_worst)) {
          r.out_worst = e;
          r.out_where = "row " + std::to_string(row) + " head " + std::to_string(h) + " dim " + std::to_string(d) +
                        ": " + std::to_string(x) + " vs " + std::to_string(y);
        }
      }
      if (!a.c.with_lse) continue;
      const float x = a.lse.typed<float>()[row * a.c.Hq + h], y = b.lse.typed<float>()[row * a.c.Hq + h];
      ++r.lse_total;
      if (x == y) continue;
      const double e = std::fabs(static_cast<double>(x) - y);
      r.lse_count += !(e <= 1e-5 * std::max(1.0f, std::fabs(y)));
      if (!(e <= r.lse_worst)) {
        r.lse_worst = e;
        r.lse_where = "row " + std::to_string(row) + " head " + std::to_string(h) + ": " + std::to_string(x) +
                      " vs " + std::to_string(y);
      }
    }
  return r;
}

/// Runs `c` with num_splits = 1 and then with each count in `splits` (0: chosen by the
/// kernel; counts past the cap are clamped), each against the oracle, and each within one
/// output ulp (plus diff_runs' slack; lse: 1e-5 relative) of the one-split run.
inline void check_split_counts(AttnCase c, std::initializer_list<int> splits) {
  const AttnProblem one = build(c);
  const Reference ref = one.reference();
  DeviceMirror dev;
  run_gpu(one, dev, 1);
  EXPECT_TRUE(check_attention(one, ref)) << describe(c) << " num_splits=1";
  for (int k : splits) {
    const AttnProblem p = with_new_outputs(one);
    run_gpu(p, dev, k);
    EXPECT_TRUE(check_attention(p, ref)) << describe(c) << " num_splits=" << k;
    const RunDiff r = diff_runs(p, one);
    EXPECT_TRUE(r.out_count == 0 && r.lse_count == 0)
        << describe(c) << " num_splits=" << k << " differs from num_splits=1: " << r.out_count << " of "
        << r.out_total << " out elements beyond 1 ulp (first " << r.out_first << "; worst " << r.out_worst << " at "
        << r.out_where << "), "
        << r.lse_count << " of " << r.lse_total << " lse values beyond 1e-5 relative (worst " << r.lse_worst
        << " at " << r.lse_where << ")";
  }
}

/// AttentionParams::sm_margin sizes only the persistent grids: `c` with 1, 37, all but
/// one and more than all of the device's SMs left free agrees with the oracle and, when
/// `bitwise`, gives bitwise the outputs and lse of sm_margin 0.
inline void check_sm_margins(AttnCase c, bool bitwise = true) {
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  c.name = describe(c);
  const AttnProblem base = build(c);
  DeviceMirror dev;
  run_gpu(base, dev);
  EXPECT_TRUE(check_attention(base, base.reference())) << c.name << " sm_margin=0";
  for (int margin : {1, 37, sms - 1, sms + 100}) {
    const AttnProblem p = with_new_outputs(base);
    try {
      run_gpu(p, dev, 0, margin);
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.name << " sm_margin=" << margin << ": " << e.what();
      continue;
    }
    EXPECT_TRUE(check_attention(p, base.reference())) << c.name << " sm_margin=" << margin;
    if (!bitwise) continue;
    EXPECT_TRUE(same_bits(p.out, 0, base.out, 0, p.rows)) << c.name << " sm_margin=" << margin << " of " << sms;
    if (c.with_lse) {
      EXPECT_EQ(std::memcmp(p.lse.typed<float>(), base.lse.typed<float>(), sizeof(float) * p.rows * c.Hq), 0)
          << c.name << " sm_margin=" << margin << ": lse differs from sm_margin=0";
    }
  }
}

/// docs/semantics.md section 2: a bf16 query beside an fp8 cache, every entry 0 or
/// +-2^17, on the GPU against the oracle. Where the kernel runs S = Q K^T in fp16
/// (`saturates`) such entries become +-65504, which scales q by exactly 65504 / 2^17: the
/// oracle with sm_scale times that factor is the saturated answer; else the exact one.
/// The two differ far beyond the fp8 tolerance (logits about half), so the check also
/// shows which kind of kernel ran. `c` sets the geometry; dtypes and sm_scale are set here.
inline void check_queries_past_fp16_range(AttnCase c, bool saturates) {
  c.q_dtype = DType::bf16, c.kv_dtype = DType::fp8_e4m3;
  c.sm_scale = std::ldexp(0.25, -17);
  c.name = describe(c) + (saturates ? " (q saturated at 65504)" : " (q exact)");
  AttnProblem p = build(c);
  std::mt19937_64 rng(c.seed);
  fill_q(p, c.Hq, c.D, [&] { return rng() % 2 ? 0.0 : (rng() % 2 ? 131072.0 : -131072.0); });
  AttnProblem expect = p;
  if (saturates) expect.c.sm_scale *= 65504.0 / 131072.0;
  const Reference ref = expect.reference(/*from_cache=*/true);
  if (!run_gpu_or_fail(p, c.name)) return;
  EXPECT_TRUE(check_attention(p, ref)) << c.name;
}

/// Logits that overflow fp32 (docs/semantics.md section 8.1): q = 1, keys of slot s are
/// 1 (logit 64 * 1e37 -> +inf), -1 (-inf) or 0 by s % 3, V = s % 7 (all exact in a bf16
/// or an fp8 `kv` cache). The GPU must give no NaN and match the CPU path, which
/// tests/cpu/ops/overflow_logits_test.cpp pins by hand.
inline void check_overflowing_logits(AttnCase c, int num_splits = 0, DType kv = DType::bf16, int head_dim = 64) {
  c.Hq = 2, c.Hkv = 1, c.D = head_dim;
  c.sm_scale = 1e37;
  c.q_dtype = DType::bf16;
  c.kv_dtype = kv;
  c.k_scale = c.v_scale = 1.0;
  c.name = "overflowing logits " + describe(c) + " splits=" + std::to_string(num_splits);
  const AttnProblem p = build(c);
  fill_q(p, c.Hq, c.D, [] { return 1.0; });
  const oracle::Format f = format_of(p.kv.dtype);
  for (int64_t s = 0; s < p.kv.num_pages * p.kv.page_size; ++s)
    for (int d = 0; d < c.D; ++d) {
      oracle::store(f, s % 3 == 0 ? 1.0 : s % 3 == 1 ? -1.0 : 0.0, p.kv.kp(s, 0, d));
      oracle::store(f, static_cast<double>(s % 7), p.kv.vp(s, 0, d));
    }
  run_cpu(p);
  std::vector<double> want_o, want_lse;
  for (int64_t r = 0; r < p.out.shape[0]; ++r)
    for (int64_t h = 0; h < c.Hq; ++h) {
      want_lse.push_back(p.lse.get({r, h}));
      for (int64_t d = 0; d < c.D; ++d) want_o.push_back(p.out.get({r, h, d}));
    }
  if (!run_gpu_or_fail(p, c.name, num_splits)) return;
  size_t i = 0, j = 0;
  for (int64_t r = 0; r < p.out.shape[0]; ++r)
    for (int64_t h = 0; h < c.Hq; ++h, ++j) {
      const double lse = p.lse.get({r, h}), wl = want_lse[j];
      ASSERT_FALSE(std::isnan(wl)) << c.name << " CPU lse row " << r;
      ASSERT_TRUE(lse == wl || std::fabs(lse - wl) <= 1e-5 * std::fabs(wl))
          << c.name << " lse row " << r << " head " << h << ": " << lse << " vs CPU " << wl;
      for (int64_t d = 0; d < c.D; ++d, ++i) {
        const double x = p.out.get({r, h, d}), y = want_o[i];
        ASSERT_FALSE(std::isnan(y)) << c.name << " CPU out row " << r;
        ASSERT_TRUE(std::fabs(x - y) <= 1e-2 * std::fabs(y) + 2e-3)
            << c.name << " out row " << r << " head " << h << " dim " << d << ": " << x << " vs CPU " << y;
      }
    }
}

/// Rows of two outputs of the same math computed along different paths (a verify step
/// and single decodes, a prompt and its chunks): within 1e-2 relative + 2e-3.
inline ::testing::AssertionResult close_rows(const HostTensor& a, int a_row, const HostTensor& b, int b_row, int rows) {
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < a.shape[1]; ++h)
      for (int d = 0; d < a.shape[2]; ++d) {
        const double x = a.get({a_row + r, h, d}), y = b.get({b_row + r, h, d});
        if (!(std::fabs(x - y) <= 1e-2 * std::fabs(y) + 2e-3)) {
          return ::testing::AssertionFailure() << "row " << a_row + r << " vs " << b_row + r << " head " << h
                                               << " dim " << d << ": " << x << " vs " << y;
        }
      }
  return ::testing::AssertionSuccess();
}

/// The whole int32 storage of `t`.
inline std::vector<int32_t> int_values(const HostTensor& t) {
  std::vector<int32_t> v(t.storage->size() / 4);
  std::memcpy(v.data(), t.base(), v.size() * 4);
  return v;
}

// ---------------------------------------------------------------------------------
// append_kv: every byte of both pools after the call == the initial random bytes with
// exactly the named slots replaced by the oracle's encoding.

struct AppendCase {
  DType src, dst;
  int P, D, Hkv, T;
  CacheLayout layout;
  bool strided_src;  // k and v slices of rows 3 * Hkv * D long (a fused QKV buffer)
  float ks, vs;
};

inline void check_append(const AppendCase& a, uint64_t seed) {
  SCOPED_TRACE(std::string("append_kv ") + pagedmha::dtype_name(a.src) + "->" + pagedmha::dtype_name(a.dst) +
               " P=" + std::to_string(a.P) + " D=" + std::to_string(a.D) + " Hkv=" + std::to_string(a.Hkv) +
               " T=" + std::to_string(a.T) + " cache=" + layout_name(a.layout) +
               " strided=" + std::to_string(a.strided_src));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const int64_t num_pages = 2 + (a.T + a.P - 1) / a.P + 3;
  PagedKv kv = make_paged_kv(a.layout, num_pages, a.P, a.Hkv, a.D, a.dst);
  // Random bytes everywhere: any stray write changes a checked byte.
  for (const HostTensor* t : {&kv.k, &kv.v})
    for (auto& b : *t->storage) b = static_cast<uint8_t>(rng());
  const int64_t row = (a.strided_src ? 3 : 1) * static_cast<int64_t>(a.Hkv) * a.D;
  const HostTensor k = make_tensor(a.src, {a.T, a.Hkv, a.D}, {row, a.D, 1});
  const HostTensor v = make_tensor(a.src, {a.T, a.Hkv, a.D}, {row, a.D, 1});
  for (int t = 0; t < a.T; ++t)
    for (int h = 0; h < a.Hkv; ++h)
      for (int d = 0; d < a.D; ++d) {
        const double boost = d == 5 ? 20.0 : 1.0;  // an outlier channel (saturates fp8 at small scales)
        k.set({t, h, d}, normal(rng) * boost);
        v.set({t, h, d}, normal(rng) * boost * 3);
      }
  // Distinct slots outside page 0, in random order.
  std::vector<int32_t> slots;
  for (int64_t s = a.P; s < num_pages * a.P; ++s) slots.push_back(static_cast<int32_t>(s));
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(a.T);
  const HostTensor loc = make_int32(slots);

  // Expected pools: the initial bytes with each named slot replaced; fp8 stores
  // saturate_rne(x / scale) with the quotient taken in fp32.
  PagedKv want = kv;
  want.k.storage = std::make_shared<std::vector<uint8_t>>(*kv.k.storage);
  want.v.storage = std::make_shared<std::vector<uint8_t>>(*kv.v.storage);
  const oracle::Format f = format_of(a.dst);
  for (int t = 0; t < a.T; ++t)
    for (int h = 0; h < a.Hkv; ++h)
      for (int d = 0; d < a.D; ++d) {
        const double x = k.get({t, h, d}), y = v.get({t, h, d});
        const bool fp8 = a.dst == DType::fp8_e4m3;
        oracle::store(f, fp8 ? static_cast<double>(static_cast<float>(x) / a.ks) : x, want.kp(slots[t], h, d));
        oracle::store(f, fp8 ? static_cast<double>(static_cast<float>(y) / a.vs) : y, want.vp(slots[t], h, d));
      }
  DeviceMirror dev;
  pagedmha::append_kv(dev.view(k), dev.view(v), dev.view(kv.k), dev.view(kv.v), dev.view(loc), a.P, a.ks, a.vs);
  dev.download(kv.k);
  dev.download(kv.v);
  for (int kind = 0; kind < 2; ++kind) {
    const std::vector<uint8_t>& got = *(kind ? kv.v : kv.k).storage;
    const std::vector<uint8_t>& exp = *(kind ? want.v : want.k).storage;
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += got[i] != exp[i];
    EXPECT_EQ(bad, 0u) << (kind ? "V" : "K") << " pool bytes differing from expected";
  }
  // fp8 round trip: dequantised value within e4m3 rounding (2^-4 relative) unless saturated.
  if (a.dst == DType::fp8_e4m3) {
    for (int t = 0; t < a.T; ++t)
      for (int d = 0; d < a.D; ++d) {
        const double x = k.get({t, 0, d}), q = kv.kget(slots[t], 0, d) * a.ks;
        if (std::fabs(x / a.ks) < 448) {
          ASSERT_NEAR(q, x, std::fabs(x) * 0.0625 + std::ldexp(1.0, -10) * a.ks) << "t=" << t << " d=" << d;
        } else {
          ASSERT_EQ(q, std::copysign(448.0 * a.ks, x));
        }
      }
  }
}

// The gpu label runs only where a device is expected: a missing one is a failure.
#define REQUIRE_GPU() ASSERT_TRUE(pagedmha::cuda_available()) << "no CUDA device visible"

}  // namespace gpu_test
