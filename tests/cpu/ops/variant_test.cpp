// MaskVariant (include/pagedmha/variant.h) against brute force over (query, key) pairs:
// the one place every path reads the visible keys from.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>

#include "pagedmha/variant.h"

namespace {

using pagedmha::KeySpan;
using pagedmha::MaskVariant;

// Docs/semantics.md section 1, written out independently: j < L, causal j <= p,
// window j >= p - w.
bool visible(bool causal, int w, int64_t L, int64_t p, int64_t j) {
  return j >= 0 && j < L && (!causal || j <= p) && (w < 0 || j >= p - w);
}

TEST(MaskVariant, RowsPairsAndKeysMatchBruteForce) {
  for (bool causal : {true, false}) {
    for (int L : {1, 5, 64, 130}) {
      for (int n : {1, 3, L, L + 4}) {  // n > L: the first queries see no key (causal)
        for (int w : {-1, 0, 1, 7, 127}) {
          const MaskVariant m{causal, w};
          int64_t pairs = 0;
          std::set<int64_t> keys;
          for (int i = 0; i < n; ++i) {
            const int64_t p = int64_t{L} - n + i;
            int64_t lo = L, hi = 0, count = 0;
            for (int64_t j = 0; j < L; ++j) {
              if (!visible(causal, w, L, p, j)) continue;
              ++count, ++pairs, keys.insert(j);
              lo = std::min(lo, j), hi = std::max(hi, j + 1);
            }
            const KeySpan r = m.row(L, p);
            EXPECT_EQ(r.size(), count) << causal << " L=" << L << " n=" << n << " w=" << w << " i=" << i;
            if (count > 0) {
              EXPECT_EQ(r.lo, lo);
              EXPECT_EQ(r.hi, hi);
            }
          }
          const std::string at = std::string(causal ? "causal" : "non-causal") + " L=" + std::to_string(L) +
                                 " n=" + std::to_string(n) + " w=" + std::to_string(w);
          EXPECT_EQ(m.pairs(L, n), pairs) << at;
          if (causal) EXPECT_EQ(m.keys_read(L, n), static_cast<int64_t>(keys.size())) << at;
          if (!keys.empty()) EXPECT_LE(m.first_key(L, n), *keys.begin()) << at;  // no read page is skipped
        }
      }
    }
  }
}

// max_keys_read bounds the distinct keys of any request's n queries (decode's host split
// bound): the largest brute-force key set over the lengths L, attained once L is long
// enough; no bound without a window.
TEST(MaskVariant, MaxKeysReadIsTheLargestKeySetOverLengths) {
  for (bool causal : {true, false}) {
    for (int n : {1, 2, 4}) {
      EXPECT_EQ((MaskVariant{causal, -1}.max_keys_read(n)), -1);
      for (int w : {0, 1, 7, 127}) {
        int64_t most = 0;
        for (int L = 1; L <= 200; ++L) {
          std::set<int64_t> keys;
          for (int i = 0; i < n; ++i) {
            for (int64_t j = 0; j < L; ++j) {
              if (visible(causal, w, L, int64_t{L} - n + i, j)) keys.insert(j);
            }
          }
          most = std::max(most, static_cast<int64_t>(keys.size()));
        }
        EXPECT_EQ((MaskVariant{causal, w}.max_keys_read(n)), most) << causal << " n=" << n << " w=" << w;
      }
    }
  }
}

// A tile's union holds every key one of its rows sees; its common span only keys all of
// them see (tiles inside it run without the mask).
TEST(MaskVariant, TileUnionAndCommonSpans) {
  for (bool causal : {true, false}) {
    for (int w : {-1, 0, 5, 40}) {
      const MaskVariant m{causal, w};
      const int64_t L = 100;
      for (int64_t p0 : {-3, 0, 10, 60, 95}) {
        const int64_t p1 = std::min<int64_t>(p0 + 7, L - 1);
        const KeySpan u = m.rows_union(L, p0, p1), c = m.rows_common(L, p0, p1);
        for (int64_t j = 0; j < L; ++j) {
          bool any = false, all = true;
          for (int64_t p = p0; p <= p1; ++p) {
            any |= visible(causal, w, L, p, j);
            all &= visible(causal, w, L, p, j);
          }
          if (any) EXPECT_TRUE(j >= u.lo && j < u.hi) << causal << " w=" << w << " p0=" << p0 << " j=" << j;
          if (j >= c.lo && j < c.hi) EXPECT_TRUE(all) << causal << " w=" << w << " p0=" << p0 << " j=" << j;
        }
      }
    }
  }
}

}  // namespace
