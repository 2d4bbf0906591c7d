// Host tensors over plain byte storage and a paged-attention problem builder with
// poisoning, shared by the test suites (through test_util.h) and the benchmarks.
//
// A problem lives entirely in host std::vector storage. A GPU suite copies each
// distinct storage (AttnProblem::tensors(), deduplicated by storage pointer) to the
// device, builds the views with AttnProblem::views(base_of, device), runs, copies the
// `out` and `lse` storage back and calls check_attention as the CPU suite does.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "oracle/oracle.h"
#include "pagedmha/ops.h"
#include "pagedmha/tensor.h"

namespace ptest {

using pagedmha::AttentionParams;
using pagedmha::Device;
using pagedmha::DType;
using pagedmha::TensorView;

inline oracle::Format format_of(DType t) {
  switch (t) {
    case DType::bf16: return oracle::Format::bf16;
    case DType::fp16: return oracle::Format::fp16;
    case DType::fp8_e4m3: return oracle::Format::fp8_e4m3;
    case DType::fp32: return oracle::Format::fp32;
    default: break;
  }
  throw std::invalid_argument("format_of: not a floating-point dtype");
}

inline size_t elem_size(DType t) {
  switch (t) {
    case DType::fp8_e4m3:
    case DType::uint8: return 1;
    case DType::bf16:
    case DType::fp16: return 2;
    case DType::int64: return 8;
    default: return 4;
  }
}

/// Bytes that mark "never written / never to be read": NaN for bf16/fp16/fp32,
/// 0xFF (NaN) for fp8, a huge page id for int32.
inline uint32_t poison_bits(DType t) {
  switch (t) {
    case DType::bf16: return 0x7FC1;
    case DType::fp16: return 0x7E01;
    case DType::fp32: return 0x7FC00001;
    case DType::fp8_e4m3:
    case DType::uint8: return 0xFF;
    default: return 0x3FFFFFF1;
  }
}

/// A strided view into shared host byte storage (several tensors may share one,
/// e.g. K and V interleaved, or q inside a fused QKV buffer).
struct HostTensor {
  std::shared_ptr<std::vector<uint8_t>> storage;
  DType dtype = DType::fp32;
  std::vector<int64_t> shape, strides;  // elements
  int64_t offset = 0;                   // elements from the storage start

  uint8_t* base() const { return storage->data(); }
  void* data() const { return base() + offset * elem_size(dtype); }
  int64_t numel() const {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
  /// Element offset (from data()) of a multi-index.
  int64_t index(std::initializer_list<int64_t> idx) const {
    int64_t o = 0;
    int d = 0;
    for (auto i : idx) o += i * strides[d++];
    return o;
  }
  void* at(std::initializer_list<int64_t> idx) const {
    return static_cast<uint8_t*>(data()) + index(idx) * elem_size(dtype);
  }
  double get(std::initializer_list<int64_t> idx) const { return oracle::load(format_of(dtype), at(idx)); }
  void set(std::initializer_list<int64_t> idx, double x) const { oracle::store(format_of(dtype), x, at(idx)); }
  template <class T>
  T* typed() const {
    return static_cast<T*>(data());
  }
  /// The view of this tensor whose storage starts at `storage_base` on `device`.
  TensorView view_at(void* storage_base, Device device) const {
    return TensorView::from_arrays(static_cast<uint8_t*>(storage_base) + offset * elem_size(dtype), dtype, device,
                                   static_cast<int>(shape.size()), shape.data(), strides.data());
  }
  TensorView view() const { return view_at(base(), Device::cpu()); }
};

inline std::vector<int64_t> dense_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * shape[d + 1];
  return s;
}

inline void fill_poison(std::vector<uint8_t>& bytes, DType t) {
  const size_t es = elem_size(t);
  const uint32_t bits = poison_bits(t);
  for (size_t i = 0; i + es <= bytes.size(); i += es) std::memcpy(bytes.data() + i, &bits, es);
}

/// A new storage of `numel` elements filled with poison, viewed as `shape`/`strides`.
inline HostTensor make_tensor(DType t, std::vector<int64_t> shape, std::vector<int64_t> strides = {},
                              int64_t storage_numel = -1) {
  HostTensor h;
  h.dtype = t;
  h.shape = std::move(shape);
  h.strides = strides.empty() ? dense_strides(h.shape) : std::move(strides);
  if (storage_numel < 0) {
    storage_numel = 1;
    for (size_t d = 0; d < h.shape.size(); ++d) storage_numel += (h.shape[d] - 1) * h.strides[d];
    if (h.numel() == 0) storage_numel = 1;
  }
  h.storage = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(storage_numel) * elem_size(t));
  fill_poison(*h.storage, t);
  return h;
}

inline HostTensor make_int32(const std::vector<int32_t>& values) {
  HostTensor h = make_tensor(DType::int32, {static_cast<int64_t>(values.size())});
  if (!values.empty()) std::memcpy(h.data(), values.data(), values.size() * 4);
  return h;
}

// ---------------------------------------------------------------------------------
// Paged KV cache.

/// 3-d token-major [slots, Hkv, D]; 4-d NHD [pages, P, Hkv, D]; 4-d view of an HND
/// buffer [pages, Hkv, P, D]; K and V interleaved in one [pages, 2, P, Hkv, D] buffer.
enum class CacheLayout { nhd3, nhd4, hnd4, interleaved };

inline const char* layout_name(CacheLayout l) {
  switch (l) {
    case CacheLayout::nhd3: return "nhd3";
    case CacheLayout::nhd4: return "nhd4";
    case CacheLayout::hnd4: return "hnd4";
    case CacheLayout::interleaved: return "kvint";
  }
  return "?";
}

struct PagedKv {
  HostTensor k, v;
  CacheLayout layout = CacheLayout::nhd3;
  int64_t num_pages = 0;
  int page_size = 0, num_kv_heads = 0, head_dim = 0;
  DType dtype = DType::bf16;
  int64_t page_stride = 0, token_stride = 0, head_stride = 0;  // elements

  void* elem(const HostTensor& t, int64_t page, int64_t off, int head, int d) const {
    return static_cast<uint8_t*>(t.data()) +
           (page * page_stride + off * token_stride + head * head_stride + d) * static_cast<int64_t>(elem_size(dtype));
  }
  void* kp(int64_t slot, int head, int d) const { return elem(k, slot / page_size, slot % page_size, head, d); }
  void* vp(int64_t slot, int head, int d) const { return elem(v, slot / page_size, slot % page_size, head, d); }
  double kget(int64_t slot, int h, int d) const { return oracle::load(format_of(dtype), kp(slot, h, d)); }
  double vget(int64_t slot, int h, int d) const { return oracle::load(format_of(dtype), vp(slot, h, d)); }
  /// Fills every element of page `page` (K and V) with the poison pattern or zero.
  void fill_page(int64_t page, bool zero) const {
    const size_t es = elem_size(dtype);
    const uint32_t bits = zero ? 0u : poison_bits(dtype);
    for (int64_t off = 0; off < page_size; ++off)
      for (int h = 0; h < num_kv_heads; ++h)
        for (int d = 0; d < head_dim; ++d) {
          std::memcpy(elem(k, page, off, h, d), &bits, es);
          std::memcpy(elem(v, page, off, h, d), &bits, es);
        }
  }
};

/// A poisoned pool with page 0 zeroed.
inline PagedKv make_paged_kv(CacheLayout layout, int64_t num_pages, int P, int Hkv, int D, DType dtype) {
  PagedKv kv;
  kv.layout = layout;
  kv.num_pages = num_pages;
  kv.page_size = P;
  kv.num_kv_heads = Hkv;
  kv.head_dim = D;
  kv.dtype = dtype;
  const int64_t page_elems = static_cast<int64_t>(P) * Hkv * D;
  switch (layout) {
    case CacheLayout::nhd3:
      kv.k = make_tensor(dtype, {num_pages * P, Hkv, D});
      kv.v = make_tensor(dtype, {num_pages * P, Hkv, D});
      kv.page_stride = page_elems, kv.token_stride = Hkv * D, kv.head_stride = D;
      break;
    case CacheLayout::nhd4:
      kv.k = make_tensor(dtype, {num_pages, P, Hkv, D});
      kv.v = make_tensor(dtype, {num_pages, P, Hkv, D});
      kv.page_stride = page_elems, kv.token_stride = Hkv * D, kv.head_stride = D;
      break;
    case CacheLayout::hnd4: {
      const std::vector<int64_t> st = {page_elems, D, static_cast<int64_t>(P) * D, 1};
      kv.k = make_tensor(dtype, {num_pages, P, Hkv, D}, st, num_pages * page_elems);
      kv.v = make_tensor(dtype, {num_pages, P, Hkv, D}, st, num_pages * page_elems);
      kv.page_stride = page_elems, kv.token_stride = D, kv.head_stride = static_cast<int64_t>(P) * D;
      break;
    }
    case CacheLayout::interleaved: {
      const std::vector<int64_t> st = {2 * page_elems, static_cast<int64_t>(Hkv) * D, D, 1};
      kv.k = make_tensor(dtype, {num_pages, P, Hkv, D}, st, 2 * num_pages * page_elems);
      kv.v = kv.k;
      kv.v.offset = page_elems;
      kv.page_stride = 2 * page_elems, kv.token_stride = Hkv * D, kv.head_stride = D;
      break;
    }
  }
  kv.fill_page(0, /*zero=*/true);
  return kv;
}

// ---------------------------------------------------------------------------------
// Attention problems.

enum class SinkMode { none, mixed, extreme, custom };
/// contiguous; a slice of a fused QKV buffer (q, out: padded head dim); a transposed
/// view of a head-major buffer; size-1 dims with stride 0; rows AttnCase::row_pad
/// elements longer than H * D (the last row's padding included in the storage).
enum class RowLayout { contiguous, fused, transposed, degenerate, padded };

struct AttnCase {
  std::string name = "case";
  bool decode = true;
  int q_len_per_req = 1;      // decode / verify
  std::vector<int> kv_lens;   // L per request (including this step's tokens)
  std::vector<int> q_lens;    // prefill: queries per request
  int Hq = 8, Hkv = 8, D = 128, page_size = 16;
  DType q_dtype = DType::bf16, kv_dtype = DType::bf16;
  double q_scale = 1.0, k_scale = 1.0, v_scale = 1.0, sm_scale = 0.0;  // 0: D^-0.5
  int window_left = -1;
  double soft_cap = 0.0;
  bool causal = true;
  SinkMode sinks = SinkMode::none;
  std::vector<double> custom_sinks;  // SinkMode::custom, [Hq]
  bool with_lse = true;
  CacheLayout layout = CacheLayout::nhd3;
  RowLayout q_layout = RowLayout::contiguous, out_layout = RowLayout::contiguous;
  int row_pad = 0;  // RowLayout::padded: elements past H * D in each row
  bool release_window_pages = true;  // table entries of pages wholly before the window -> 0
  int spare_pages = 3;
  int extra_cols = 2;
  double outlier_gain = 0.0;  // > 0: K channels d % 29 == 5 scaled by it
  uint64_t seed = 1;
  bool keep_values = true;  // false: skip the decoded per-request K/V copies (benchmarks)
};

/// A case prints as its name with every character but [A-Za-z0-9_] as '_': the
/// parameterised suites' test names (::testing::PrintToStringParamName) and the
/// "GetParam() = ..." of gtest's listings (a 248-byte dump otherwise).
inline void PrintTo(const AttnCase& c, std::ostream* os) {
  std::string s = c.name;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  *os << s;
}

struct Reference {
  std::vector<double> o;    // [rows, Hq, D]
  std::vector<double> lse;  // [rows, Hq]
  std::vector<int> visible; // [rows, Hq]
};

struct AttnViews {
  TensorView q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, out, lse, sinks, workspace;
};

struct AttnProblem {
  AttnCase c;
  int batch = 0, rows = 0, cols = 0, max_q_len = 0;
  std::vector<int> q_start, q_lens;  // per request
  PagedKv kv;
  HostTensor q, out, lse, page_table, seq_lens, cu_seqlens_q, sinks;
  std::vector<double> sink_values;            // [Hq]
  std::vector<std::vector<int64_t>> slots;    // per request, slot of each position < L
  std::vector<std::vector<double>> k_log, v_log;  // per request [L, Hkv, D], stored values decoded

  double bmm1_scale() const {
    const double sm = c.sm_scale > 0 ? c.sm_scale : 1.0 / std::sqrt(static_cast<double>(c.D));
    return c.q_scale * c.k_scale * sm;
  }
  AttentionParams params(const TensorView& sinks_view) const {
    AttentionParams p;
    p.bmm1_scale = static_cast<float>(bmm1_scale());
    p.bmm2_scale = static_cast<float>(c.v_scale);
    p.window_left = c.window_left;
    p.logits_soft_cap = static_cast<float>(c.soft_cap);
    p.causal = c.causal;
    if (c.sinks != SinkMode::none) p.sinks = sinks_view;
    return p;
  }
  /// Every distinct storage, for copying to a device.
  std::vector<const HostTensor*> tensors() const {
    return {&q, &kv.k, &kv.v, &page_table, &seq_lens, &cu_seqlens_q, &out, &lse, &sinks};
  }
  AttnViews views(const std::function<void*(const HostTensor&)>& base_of, Device device) const {
    AttnViews v;
    v.q = q.view_at(base_of(q), device);
    v.k_cache = kv.k.view_at(base_of(kv.k), device);
    v.v_cache = kv.v.view_at(base_of(kv.v), device);
    v.page_table = page_table.view_at(base_of(page_table), device);
    v.seq_lens = seq_lens.view_at(base_of(seq_lens), device);
    if (!c.decode) v.cu_seqlens_q = cu_seqlens_q.view_at(base_of(cu_seqlens_q), device);
    v.out = out.view_at(base_of(out), device);
    if (c.with_lse) v.lse = lse.view_at(base_of(lse), device);
    if (c.sinks != SinkMode::none) v.sinks = sinks.view_at(base_of(sinks), device);
    return v;
  }
  AttnViews host_views() const {
    return views([](const HostTensor& t) { return static_cast<void*>(t.base()); }, Device::cpu());
  }
  /// Decoded query values of rows [row, row + n): [n, Hq, D].
  std::vector<double> q_values(int row, int n) const {
    std::vector<double> r(static_cast<size_t>(n) * c.Hq * c.D);
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < c.Hq; ++h)
        for (int d = 0; d < c.D; ++d) r[(static_cast<size_t>(i) * c.Hq + h) * c.D + d] = q.get({row + i, h, d});
    return r;
  }
  /// Reads K/V of request b back from the cache (what the op sees), [L, Hkv, D].
  void kv_values(int b, std::vector<double>& k, std::vector<double>& v) const {
    const int L = c.kv_lens[b];
    k.assign(static_cast<size_t>(L) * c.Hkv * c.D, 0);
    v.assign(k.size(), 0);
    for (int j = 0; j < L; ++j)
      for (int h = 0; h < c.Hkv; ++h)
        for (int d = 0; d < c.D; ++d) {
          k[(static_cast<size_t>(j) * c.Hkv + h) * c.D + d] = kv.kget(slots[b][j], h, d);
          v[(static_cast<size_t>(j) * c.Hkv + h) * c.D + d] = kv.vget(slots[b][j], h, d);
        }
  }
  oracle::AttentionSpec spec() const {
    oracle::AttentionSpec s;
    s.num_q_heads = c.Hq, s.num_kv_heads = c.Hkv, s.head_dim = c.D;
    s.bmm1_scale = static_cast<float>(bmm1_scale());  // the op receives fp32 scales
    s.bmm2_scale = static_cast<float>(c.v_scale);
    s.window_left = c.window_left;
    s.soft_cap = static_cast<float>(c.soft_cap);
    s.causal = c.causal;
    s.sinks = c.sinks == SinkMode::none ? nullptr : &sink_values;
    return s;
  }
  /// The oracle's answer, from the logical (pre-paging) values when `from_cache` is
  /// false, or from the cache contents (after append_kv, say) when true.
  Reference reference(bool from_cache = false) const {
    Reference r;
    const size_t hd = static_cast<size_t>(c.Hq) * c.D;
    r.o.assign(rows * hd, 0);
    r.lse.assign(static_cast<size_t>(rows) * c.Hq, 0);
    r.visible.assign(static_cast<size_t>(rows) * c.Hq, 0);
    const auto s = spec();
    std::vector<std::vector<double>> kc(from_cache ? batch : 0), vc(kc.size());
#pragma omp parallel for schedule(dynamic)
    for (int b = 0; b < static_cast<int>(kc.size()); ++b) kv_values(b, kc[b], vc[b]);
    // Work items of up to 16 queries. Query i of n sits at position L - n + i; a causal
    // chunk [i0, i1) sees no key past L - n + i1 - 1, so the oracle runs it exactly on
    // that key prefix (then its positions come out the same). Non-causal: whole requests.
    struct Chunk {
      int b, i0, i1;
    };
    std::vector<Chunk> chunks;
    for (int b = 0; b < batch; ++b) {
      const int step = c.causal ? 16 : std::max(q_lens[b], 1);
      for (int i0 = 0; i0 < q_lens[b]; i0 += step) chunks.push_back({b, i0, std::min(q_lens[b], i0 + step)});
    }
#pragma omp parallel for schedule(dynamic)
    for (int t = 0; t < static_cast<int>(chunks.size()); ++t) {
      const Chunk ch = chunks[t];
      const int n = q_lens[ch.b], L = c.kv_lens[ch.b];
      const int keys = c.causal ? std::clamp(L - n + ch.i1, 0, L) : L;  // <= 0: no query sees a key
      const size_t row = static_cast<size_t>(q_start[ch.b] + ch.i0);
      const std::vector<double> qv = q_values(static_cast<int>(row), ch.i1 - ch.i0);
      const auto& kk = from_cache ? kc[ch.b] : k_log[ch.b];
      const auto& vv = from_cache ? vc[ch.b] : v_log[ch.b];
      oracle::attention(s, ch.i1 - ch.i0, keys, qv.data(), kk.data(), vv.data(), r.o.data() + row * hd,
                        r.lse.data() + row * c.Hq, r.visible.data() + row * c.Hq);
    }
    return r;
  }
};

/// [rows, H, D] tensor with a row layout (q, or out), poisoned. Rows of the fused
/// layout carry `extra_heads` more heads, those of the padded layout `row_pad` elements.
inline HostTensor make_rows(DType t, int rows, int H, int D, RowLayout layout, int extra_heads, int row_pad) {
  switch (layout) {
    case RowLayout::contiguous: return make_tensor(t, {rows, H, D});
    case RowLayout::fused:
    case RowLayout::padded: {
      const int64_t width = static_cast<int64_t>(H) * D +
                            (layout == RowLayout::fused ? static_cast<int64_t>(extra_heads) * D : row_pad);
      return make_tensor(t, {rows, H, D}, {width, D, 1}, std::max<int64_t>(rows, 1) * width);
    }
    case RowLayout::transposed:
      return make_tensor(t, {rows, H, D}, {D, static_cast<int64_t>(rows) * D, 1},
                         static_cast<int64_t>(std::max(rows, 1)) * H * D);
    case RowLayout::degenerate: {
      std::vector<int64_t> st = dense_strides({rows, H, D});
      if (rows == 1) st[0] = 0;
      if (H == 1) st[1] = 0;
      return make_tensor(t, {rows, H, D}, st, static_cast<int64_t>(std::max(rows, 1)) * H * D);
    }
  }
  return {};
}

inline std::vector<double> sink_values_for(const AttnCase& c) {
  static const double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> s(c.Hq, 0);
  for (int h = 0; h < c.Hq; ++h) {
    if (c.sinks == SinkMode::mixed) s[h] = std::vector<double>{-kInf, 0.0, 3.0, 20.0}[h % 4];
    if (c.sinks == SinkMode::extreme) s[h] = std::vector<double>{80.0, -80.0, 1e4, -1e4}[h % 4];
    if (c.sinks == SinkMode::custom) s[h] = c.custom_sinks.at(h);
  }
  return s;
}

/// Builds a random paged problem: pages in random order, page 0 reserved and zero,
/// everything outside the valid region poisoned, outputs pre-filled with NaN.
inline AttnProblem build(const AttnCase& c) {
  AttnProblem p;
  p.c = c;
  p.batch = static_cast<int>(c.kv_lens.size());
  std::mt19937_64 rng(c.seed * 0x9E3779B97F4A7C15ull + 12345);
  std::normal_distribution<double> normal(0.0, 1.0);
  const int P = c.page_size;

  p.q_lens = c.decode ? std::vector<int>(p.batch, c.q_len_per_req) : c.q_lens;
  p.q_start.resize(p.batch);
  std::vector<int32_t> cu(p.batch + 1, 0);
  for (int b = 0; b < p.batch; ++b) cu[b + 1] = cu[b] + p.q_lens[b];
  for (int b = 0; b < p.batch; ++b) p.q_start[b] = cu[b];
  p.rows = cu[p.batch];
  p.max_q_len = 0;
  for (int n : p.q_lens) p.max_q_len = std::max(p.max_q_len, n);

  // Pages: a random permutation of [1, num_pages), spare pages stay poisoned.
  std::vector<int> pages_of(p.batch);
  int64_t needed = 0;
  int max_used = 0;
  for (int b = 0; b < p.batch; ++b) {
    pages_of[b] = (c.kv_lens[b] + P - 1) / P;
    needed += pages_of[b];
    max_used = std::max(max_used, pages_of[b]);
  }
  const int64_t num_pages = 1 + needed + c.spare_pages;
  std::vector<int32_t> perm(num_pages - 1);
  std::iota(perm.begin(), perm.end(), 1);
  std::shuffle(perm.begin(), perm.end(), rng);
  p.kv = make_paged_kv(c.layout, num_pages, P, c.Hkv, c.D, c.kv_dtype);

  p.cols = std::max(1, max_used + c.extra_cols);
  p.page_table = make_tensor(DType::int32, {p.batch, p.cols});
  const int32_t spare = c.spare_pages > 0 ? perm.back() : 0;
  const int32_t garbage[4] = {-1, spare, 0x3FFFFFFF, static_cast<int32_t>(num_pages + 7)};
  const oracle::Format kf = format_of(c.kv_dtype);
  size_t next = 0;
  p.slots.resize(p.batch);
  p.k_log.resize(p.batch);
  p.v_log.resize(p.batch);
  for (int b = 0; b < p.batch; ++b) {
    int32_t* row = p.page_table.typed<int32_t>() + static_cast<int64_t>(b) * p.cols;
    for (int col = 0; col < p.cols; ++col) row[col] = col < pages_of[b] ? perm[next++] : garbage[(b + col) % 4];
    const int L = c.kv_lens[b];
    if (c.keep_values) {
      p.k_log[b].resize(static_cast<size_t>(L) * c.Hkv * c.D);
      p.v_log[b].resize(p.k_log[b].size());
    }
    for (int j = 0; j < L; ++j) {
      const int64_t slot = oracle::slot_of(row, j, P);
      p.slots[b].push_back(slot);
      for (int h = 0; h < c.Hkv; ++h)
        for (int d = 0; d < c.D; ++d) {
          double kx = normal(rng), vx = normal(rng);
          if (c.outlier_gain > 0 && d % 29 == 5) kx *= c.outlier_gain;
          oracle::store(kf, kx / c.k_scale, p.kv.kp(slot, h, d));
          oracle::store(kf, vx / c.v_scale, p.kv.vp(slot, h, d));
          if (!c.keep_values) continue;
          const size_t i = (static_cast<size_t>(j) * c.Hkv + h) * c.D + d;
          p.k_log[b][i] = p.kv.kget(slot, h, d);
          p.v_log[b][i] = p.kv.vget(slot, h, d);
        }
    }
    // Pages wholly before the first query's window were released by the engine:
    // the table holds 0 there and the page itself now belongs to someone else.
    if (c.window_left >= 0 && c.release_window_pages) {
      const int64_t first_visible = std::max<int64_t>(0, static_cast<int64_t>(L) - p.q_lens[b] - c.window_left);
      for (int col = 0; col < pages_of[b] && static_cast<int64_t>(col + 1) * P <= first_visible; ++col) {
        p.kv.fill_page(row[col], /*zero=*/false);
        row[col] = 0;
      }
    }
  }

  const DType out_dtype = c.q_dtype == DType::fp8_e4m3 ? DType::bf16 : c.q_dtype;
  p.q = make_rows(c.q_dtype, p.rows, c.Hq, c.D, c.q_layout, 2 * c.Hkv, c.row_pad);
  const oracle::Format qf = format_of(c.q_dtype);
  for (int r = 0; r < p.rows; ++r)
    for (int h = 0; h < c.Hq; ++h)
      for (int d = 0; d < c.D; ++d) oracle::store(qf, normal(rng) / c.q_scale, p.q.at({r, h, d}));
  p.out = make_rows(out_dtype, p.rows, c.Hq, c.D, c.out_layout, 1, c.row_pad);
  p.lse = make_tensor(DType::fp32, {p.rows, c.Hq});
  std::vector<int32_t> lens(c.kv_lens.begin(), c.kv_lens.end());
  p.seq_lens = make_int32(lens);
  p.cu_seqlens_q = make_int32(cu);
  p.sink_values = sink_values_for(c);
  p.sinks = make_tensor(DType::fp32, {c.Hq});
  for (int h = 0; h < c.Hq; ++h) p.sinks.typed<float>()[h] = static_cast<float>(p.sink_values[h]);
  // The op sees fp32 sinks; the oracle uses the same values.
  for (int h = 0; h < c.Hq; ++h) p.sink_values[h] = static_cast<double>(static_cast<float>(p.sink_values[h]));
  return p;
}

/// Runs batch_decode or batch_prefill on the given views (host or device).
inline void run_attention(const AttnProblem& p, const AttnViews& v, int num_splits = 0,
                          pagedmha::Stream stream = {}, int sm_margin = 0) {
  AttentionParams prm = p.params(v.sinks);
  prm.num_splits = num_splits;
  prm.sm_margin = sm_margin;
  if (p.c.decode) {
    pagedmha::batch_decode(v.q, v.k_cache, v.v_cache, v.page_table, v.seq_lens, p.c.page_size, p.c.q_len_per_req,
                           v.out, prm, v.lse, v.workspace, stream);
  } else {
    pagedmha::batch_prefill(v.q, v.k_cache, v.v_cache, v.page_table, v.seq_lens, v.cu_seqlens_q, p.c.page_size,
                            p.max_q_len, v.out, prm, v.lse, v.workspace, stream);
  }
}

inline void run_cpu(const AttnProblem& p) { run_attention(p, p.host_views()); }

}  // namespace ptest
