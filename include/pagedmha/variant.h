// The attention variant of docs/semantics.md section 1 in one place: which keys a query
// sees (bottom-right causal or not, window_left), which keys a tile of queries sees
// (their union, and the keys every one of them sees, where no mask is needed), and how
// many (query, key) pairs a request computes. Host and device callable; the CPU path,
// argument validation, the CUDA kernels (as a template parameter of the mainloops),
// the debug validator and the replay's work counting all use it.
//
// Query i of a request with n queries and L keys sits at position p = L - n + i
// (p < 0 when n > L: such queries see no key).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PAGEDMHA_HD __host__ __device__ __forceinline__
#else
#define PAGEDMHA_HD inline
#endif

namespace pagedmha {

/// Keys [lo, hi); empty when hi <= lo.
struct KeySpan {
  int64_t lo = 0, hi = 0;
  PAGEDMHA_HD bool empty() const { return hi <= lo; }
  PAGEDMHA_HD int64_t size() const { return hi > lo ? hi - lo : 0; }
};

/// The mask: key j is visible to the query at position p iff j < L, (causal) j <= p,
/// and (window_left >= 0) j >= p - window_left.
struct MaskVariant {
  bool causal = true;
  int window_left = -1;  // -1: no window

  PAGEDMHA_HD static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
  PAGEDMHA_HD static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

  /// Keys visible to the query at position p of a request with L keys.
  PAGEDMHA_HD KeySpan row(int64_t L, int64_t p) const {
    KeySpan s;
    s.lo = window_left >= 0 ? max64(p - window_left, 0) : 0;
    s.hi = causal ? min64(p + 1, L) : L;
    return s;
  }

  /// Keys seen by at least one query at positions [p0, p1] (both bounds move with p).
  PAGEDMHA_HD KeySpan rows_union(int64_t L, int64_t p0, int64_t p1) const {
    KeySpan s{row(L, p0).lo, row(L, p1).hi};
    if (s.empty()) s.lo = s.hi = 0;
    return s;
  }

  /// Keys seen by every query at positions [p0, p1]: a key tile inside it needs no mask.
  PAGEDMHA_HD KeySpan rows_common(int64_t L, int64_t p0, int64_t p1) const {
    return KeySpan{row(L, p1).lo, row(L, p0).hi};
  }

  /// The first key any of the n queries of a request with L keys can see: pages wholly
  /// before it are never read (the window's released pages).
  PAGEDMHA_HD int64_t first_key(int64_t L, int64_t n) const {
    return window_left >= 0 ? max64(0, L - n - window_left) : 0;
  }

  /// Distinct keys the n queries read (the bytes a decode or extend step streams).
  PAGEDMHA_HD int64_t keys_read(int64_t L, int64_t n) const {
    if (L <= 0 || n <= 0) return 0;
    return L - first_key(L, n);
  }

  /// The most distinct keys the n queries of any request read (keys_read over every L):
  /// window_left + n under a window, -1 (no bound) without one.
  PAGEDMHA_HD int64_t max_keys_read(int64_t n) const { return window_left >= 0 ? window_left + max64(n, 0) : -1; }

  /// Visible (query, key) pairs of the n queries (PERFORMANCE.md's flop count), closed form.
  PAGEDMHA_HD int64_t pairs(int64_t L, int64_t n) const {
    if (L <= 0 || n <= 0) return 0;
    const int64_t b = L - 1;  // position of the last query
    if (!causal) {
      // Query p sees [max(p - w, 0), L): n * L minus sum over p > w of (p - w).
      int64_t s = n * L;
      if (window_left >= 0) {
        const int64_t w = window_left, c = max64(L - n, w + 1);
        if (c <= b) s -= (b - w) * (b - w + 1) / 2 - (c - w - 1) * (c - w) / 2;
      }
      return s;
    }
    const int64_t a = max64(L - n, 0);  // queries before position 0 see no key
    if (window_left < 0) return (b + 1) * (b + 2) / 2 - a * (a + 1) / 2;
    // sum over p in [a, b] of min(p + 1, w + 1)
    const int64_t w = window_left;
    int64_t s = 0;
    const int64_t lo_end = min64(b, w - 1);
    if (lo_end >= a) s += (lo_end + 1) * (lo_end + 2) / 2 - a * (a + 1) / 2;
    const int64_t hi_start = max64(a, w);
    if (b >= hi_start) s += (b - hi_start + 1) * (w + 1);
    return s;
  }
};

}  // namespace pagedmha
