// The independent fp64 reference of pagedmha (docs/semantics.md sections 1-3, 6).
//
// Deliberately naive: dense loops, explicit masks, every input decoded to double.
// It shares no code with src/ and includes no pagedmha header, so a bug in the
// library's number formats or addressing cannot hide in the reference too.
// Header-only so that the CPU and the GPU suites use the same reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace oracle {

// ---------------------------------------------------------------------------------
// Number formats, written from their definitions: a value is
// (-1)^s * 2^(e - bias) * (1 + m / 2^mbits) for a normal exponent field e, and
// (-1)^s * 2^(1 - bias) * (m / 2^mbits) for e == 0.

enum class Format { bf16, fp16, fp8_e4m3, fp32 };

struct FormatInfo {
  int exp_bits, man_bits, bias;
  bool has_inf;      // IEEE-like (bf16, fp16); e4m3fn has none and saturates
  double max_finite;
};

inline FormatInfo info(Format f) {
  switch (f) {
    case Format::bf16: return {8, 7, 127, true, std::ldexp(255.0 / 128.0, 127)};
    case Format::fp16: return {5, 10, 15, true, 65504.0};
    case Format::fp8_e4m3: return {4, 3, 7, false, 448.0};
    case Format::fp32: return {8, 23, 127, true, static_cast<double>(std::numeric_limits<float>::max())};
  }
  return {};
}

inline int storage_bytes(Format f) {
  return f == Format::fp8_e4m3 ? 1 : (f == Format::fp32 ? 4 : 2);
}

/// Decodes the bits of one element (low `storage_bytes` bytes of `bits`).
inline double decode_bits(Format f, uint32_t bits) {
  const FormatInfo fi = info(f);
  const int total = 1 + fi.exp_bits + fi.man_bits;
  const uint32_t sign = (bits >> (total - 1)) & 1u;
  const uint32_t e = (bits >> fi.man_bits) & ((1u << fi.exp_bits) - 1);
  const uint32_t m = bits & ((1u << fi.man_bits) - 1);
  const uint32_t e_max = (1u << fi.exp_bits) - 1;
  double mag;
  if (fi.has_inf && e == e_max) {
    mag = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (!fi.has_inf && e == e_max && m == (1u << fi.man_bits) - 1) {
    mag = std::numeric_limits<double>::quiet_NaN();  // e4m3fn: S.1111.111 is NaN
  } else if (e == 0) {
    mag = std::ldexp(static_cast<double>(m), 1 - fi.bias - fi.man_bits);
  } else {
    mag = std::ldexp(static_cast<double>((1u << fi.man_bits) + m), static_cast<int>(e) - fi.bias - fi.man_bits);
  }
  return sign ? -mag : mag;
}

/// Rounds x to the nearest value of the format, ties to an even mantissa;
/// overflow gives inf (bf16, fp16, fp32) or saturates to +-max (e4m3fn).
inline double round_to(Format f, double x) {
  if (std::isnan(x) || std::isinf(x)) {
    if (std::isinf(x) && !info(f).has_inf) return std::copysign(info(f).max_finite, x);
    return x;
  }
  if (x == 0) return x;
  const FormatInfo fi = info(f);
  const int emin = 1 - fi.bias;  // exponent of the smallest normal
  int e;
  std::frexp(std::fabs(x), &e);  // |x| = frac * 2^e, frac in [0.5, 1)
  const int unbiased = std::max(e - 1, emin);
  const double quantum = std::ldexp(1.0, unbiased - fi.man_bits);
  // x / quantum is exact (power-of-two scaling); nearbyint rounds ties to even.
  double r = std::nearbyint(x / quantum) * quantum;
  if (std::fabs(r) > fi.max_finite) {
    if (fi.has_inf) {
      // IEEE: overflow iff |x| >= max + half an ulp at the top binade.
      const double top_half_ulp = std::ldexp(1.0, fi.bias - fi.man_bits - 1);
      r = std::fabs(x) >= fi.max_finite + top_half_ulp ? std::copysign(std::numeric_limits<double>::infinity(), x)
                                                       : std::copysign(fi.max_finite, x);
    } else {
      r = std::copysign(fi.max_finite, x);
    }
  }
  return r;
}

/// Bits of a value already representable in the format (see round_to).
inline uint32_t bits_of_exact(Format f, double r) {
  const FormatInfo fi = info(f);
  const int total = 1 + fi.exp_bits + fi.man_bits;
  const uint32_t sign = std::signbit(r) ? (1u << (total - 1)) : 0u;
  const uint32_t e_max = (1u << fi.exp_bits) - 1;
  if (std::isnan(r)) {
    return fi.has_inf ? (sign | (e_max << fi.man_bits) | (1u << (fi.man_bits - 1)))
                      : (sign | (e_max << fi.man_bits) | ((1u << fi.man_bits) - 1));
  }
  double a = std::fabs(r);
  if (std::isinf(a)) return sign | (e_max << fi.man_bits);
  if (a == 0) return sign;
  const int emin = 1 - fi.bias;
  if (a < std::ldexp(1.0, emin)) {
    const uint32_t m = static_cast<uint32_t>(std::ldexp(a, fi.man_bits - emin));
    return sign | m;
  }
  int e;
  const double frac = std::frexp(a, &e);  // a = frac * 2^e
  const uint32_t m = static_cast<uint32_t>(std::ldexp(frac * 2.0 - 1.0, fi.man_bits));
  const uint32_t ef = static_cast<uint32_t>(e - 1 + fi.bias);
  return sign | (ef << fi.man_bits) | m;
}

/// Encodes x with round-to-nearest-even (saturating for e4m3fn).
inline uint32_t encode_bits(Format f, double x) { return bits_of_exact(f, round_to(f, x)); }

inline double load(Format f, const void* p) {
  uint32_t bits = 0;
  switch (storage_bytes(f)) {
    case 1: bits = *static_cast<const uint8_t*>(p); break;
    case 2: { uint16_t b; std::memcpy(&b, p, 2); bits = b; break; }
    default: std::memcpy(&bits, p, 4); break;
  }
  return decode_bits(f, bits);
}

inline void store(Format f, double x, void* p) {
  const uint32_t bits = encode_bits(f, x);
  switch (storage_bytes(f)) {
    case 1: *static_cast<uint8_t*>(p) = static_cast<uint8_t>(bits); break;
    case 2: { const uint16_t b = static_cast<uint16_t>(bits); std::memcpy(p, &b, 2); break; }
    default: std::memcpy(p, &bits, 4); break;
  }
}

// ---------------------------------------------------------------------------------
// Attention (docs/semantics.md section 1), one request at a time.

struct AttentionSpec {
  int num_q_heads = 1, num_kv_heads = 1, head_dim = 64;
  double bmm1_scale = 1.0, bmm2_scale = 1.0;
  int window_left = -1;
  double soft_cap = 0.0;
  bool causal = true;
  const std::vector<double>* sinks = nullptr;  // [Hq] or null
};

/// q: [n, Hq, D], k, v: [L, Hkv, D] (stored values, decoded). Writes o [n, Hq, D],
/// lse [n, Hq] and the number of visible keys per (query, head) [n, Hq]. key_set: optional
/// [L]; keys j with key_set[j] == 0 are left out, as if masked (one part of a split KV).
inline void attention(const AttentionSpec& s, int n, int L, const double* q, const double* k, const double* v,
                      double* o, double* lse, int* visible_count = nullptr, const char* key_set = nullptr) {
  const int Hq = s.num_q_heads, Hkv = s.num_kv_heads, D = s.head_dim;
  const int G = Hq / Hkv;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> logit(static_cast<size_t>(std::max(L, 1)));
  std::vector<char> visible(static_cast<size_t>(std::max(L, 1)));
  for (int i = 0; i < n; ++i) {
    const long p = static_cast<long>(L) - n + i;  // bottom-right aligned position
    for (int h = 0; h < Hq; ++h) {
      const int g = h / G;
      const double* qv = q + (static_cast<size_t>(i) * Hq + h) * D;
      int count = 0;
      double m = neg_inf;
      for (int j = 0; j < L; ++j) {
        const double* kv = k + (static_cast<size_t>(j) * Hkv + g) * D;
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += qv[d] * kv[d];
        double sj = s.bmm1_scale * dot;
        if (s.soft_cap > 0) sj = s.soft_cap * std::tanh(sj / s.soft_cap);
        bool vis = true;
        if (s.causal && j > p) vis = false;
        if (s.window_left >= 0 && j < p - s.window_left) vis = false;
        if (key_set && !key_set[j]) vis = false;
        visible[j] = vis;
        logit[j] = sj;
        if (vis) {
          ++count;
          m = std::max(m, sj);
        }
      }
      const double sink = s.sinks ? (*s.sinks)[h] : neg_inf;
      m = std::max(m, sink);
      double* out = o + (static_cast<size_t>(i) * Hq + h) * D;
      std::fill(out, out + D, 0.0);
      if (visible_count) visible_count[static_cast<size_t>(i) * Hq + h] = count;
      if (count == 0) {  // empty visible set: o = 0, lse = sink (or -inf)
        lse[static_cast<size_t>(i) * Hq + h] = sink;
        continue;
      }
      double z = std::isinf(sink) && sink < 0 ? 0.0 : std::exp(sink - m);
      for (int j = 0; j < L; ++j) {
        if (!visible[j]) continue;
        const double w = std::exp(logit[j] - m);
        z += w;
        const double* vv = v + (static_cast<size_t>(j) * Hkv + g) * D;
        for (int d = 0; d < D; ++d) out[d] += w * vv[d];
      }
      for (int d = 0; d < D; ++d) out[d] = s.bmm2_scale * out[d] / z;
      lse[static_cast<size_t>(i) * Hq + h] = m + std::log(z);
    }
  }
}

// ---------------------------------------------------------------------------------
// Paged-cache and metadata rules (docs/semantics.md sections 2, 3, 6). Tables are
// row-major int32 [rows, cols].

inline int64_t slot_of(const int32_t* table_row, int64_t pos, int page_size) {
  return static_cast<int64_t>(table_row[pos / page_size]) * page_size + pos % page_size;
}

inline std::vector<int32_t> cumsum_lengths(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> out(lengths.size() + 1, 0);
  for (size_t i = 0; i < lengths.size(); ++i) out[i + 1] = out[i] + lengths[i];
  return out;
}

/// out[i * repeat + j] = min(max(seq_lens[i], min_len), max_len) for j < repeat.
inline std::vector<int32_t> clamp_seq_lens(const std::vector<int32_t>& seq_lens, int min_len,
                                           int max_len = std::numeric_limits<int32_t>::max(), int repeat = 1) {
  std::vector<int32_t> out;
  for (int32_t x : seq_lens)
    for (int j = 0; j < repeat; ++j) out.push_back(std::min(std::max(x, min_len), max_len));
  return out;
}

/// out[r * N + j] = slot(r, max(seq_len - N + j, 0)).
inline std::vector<int32_t> decode_write_slots(const std::vector<int32_t>& table, int cols,
                                               const std::vector<int32_t>& seq_lens, int page_size, int n) {
  std::vector<int32_t> out;
  for (size_t r = 0; r < seq_lens.size(); ++r) {
    for (int j = 0; j < n; ++j) {
      const int64_t pos = std::max<int64_t>(static_cast<int64_t>(seq_lens[r]) - n + j, 0);
      out.push_back(static_cast<int32_t>(slot_of(table.data() + r * cols, pos, page_size)));
    }
  }
  return out;
}

/// Positions [prefix, prefix + extend_len) per request, in order.
inline std::vector<int32_t> extend_write_slots(const std::vector<int32_t>& table, int cols,
                                               const std::vector<int32_t>& prefix_lens,
                                               const std::vector<int32_t>& cu_seqlens_q, int page_size) {
  std::vector<int32_t> out;
  for (size_t r = 0; r < prefix_lens.size(); ++r) {
    const int len = cu_seqlens_q[r + 1] - cu_seqlens_q[r];
    for (int i = 0; i < len; ++i) {
      out.push_back(static_cast<int32_t>(slot_of(table.data() + r * cols, prefix_lens[r] + i, page_size)));
    }
  }
  return out;
}

/// out[r, c] = req_to_page[pool_idx[r], c] for c < ceil(seq_len / P), else 0; rows < bs.
inline void gather_page_table(const std::vector<int32_t>& req_to_page, int max_pages,
                              const std::vector<int32_t>& req_pool_indices, const std::vector<int32_t>& seq_lens,
                              std::vector<int32_t>& out, int out_cols, int bs, int cols, int page_size) {
  for (int r = 0; r < bs; ++r) {
    const int used = (seq_lens[r] + page_size - 1) / page_size;
    for (int c = 0; c < cols; ++c) {
      out[static_cast<size_t>(r) * out_cols + c] =
          c < used ? req_to_page[static_cast<size_t>(req_pool_indices[r]) * max_pages + c] : 0;
    }
  }
}

}  // namespace oracle
