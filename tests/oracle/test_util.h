// Comparison of op outputs against the fp64 oracle, for the gtest suites (CPU and
// GPU). The problem builder lives in paged_problem.h.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "oracle/paged_problem.h"

namespace pagedmha {
/// A DType parameter prints as its name ("bf16"): test names and gtest's listings.
inline void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }
}  // namespace pagedmha

namespace ptest {

// ---------------------------------------------------------------------------------
// Comparison.

struct Tolerance {
  double rel_l2 = 1e-2;      // whole output: |out - ref| / |ref|
  double row_rel_l2 = 2e-2;  // every (row, head) vector
  double max_abs = 1.0 / 64;  // every element, relative to its row's largest |ref|
  double abs_floor = 1e-6;   // of the output's RMS, for rows whose reference is ~0
  double lse_abs = 5e-4;     // natural-log units
  double lse_rel = 1e-6;

  /// TESTING.md: bf16 / fp16 outputs about 1e-2 relative L2.
  static Tolerance for_output(DType t) {
    Tolerance tol;
    if (t == DType::fp16) tol.rel_l2 = 5e-3, tol.row_rel_l2 = 1e-2, tol.max_abs = 1.0 / 256;
    return tol;
  }
};

/// Compares out and lse of `p` (host storage) with the reference: relative L2 over
/// the output and per (row, head), exact zeros and lse for empty visible sets, lse
/// within tolerance, no NaN or Inf anywhere, and no byte of out's storage outside
/// the view written.
inline ::testing::AssertionResult check_attention(const AttnProblem& p, const Reference& ref, const Tolerance& tol) {
  const int Hq = p.c.Hq, D = p.c.D;
  std::ostringstream msg;
  int failures = 0;
  auto fail = [&](const std::string& s) {
    if (failures++ < 8) msg << "\n  " << s;
  };
  double ref2_total = 0;
  for (double x : ref.o) ref2_total += x * x;
  const double rms = std::sqrt(ref2_total / std::max<size_t>(ref.o.size(), 1));
  double err2_total = 0, worst_row = 0;
  for (int r = 0; r < p.rows; ++r) {
    for (int h = 0; h < Hq; ++h) {
      const size_t rh = static_cast<size_t>(r) * Hq + h;
      const double* rv = ref.o.data() + rh * D;
      double err2 = 0, ref2 = 0, row_max = 0, max_err = 0;
      bool bad = false;
      for (int d = 0; d < D; ++d) row_max = std::max(row_max, std::fabs(rv[d]));
      for (int d = 0; d < D; ++d) {
        const double got = p.out.get({r, h, d});
        if (!std::isfinite(got)) bad = true;
        max_err = std::max(max_err, std::fabs(got - rv[d]));
        err2 += (got - rv[d]) * (got - rv[d]);
        ref2 += rv[d] * rv[d];
        if (ref.visible[rh] == 0 && got != 0.0) bad = true;
      }
      std::ostringstream where;
      where << "row " << r << " head " << h;
      if (bad) {
        fail(where.str() + (ref.visible[rh] == 0 ? ": empty visible set must give exact 0" : ": NaN/Inf") +
             ", got out[0]=" + std::to_string(p.out.get({r, h, 0})));
        continue;
      }
      err2_total += err2;
      const double rel = std::sqrt(err2) / std::max(std::sqrt(ref2), 1e-300);
      if (std::sqrt(err2) > tol.row_rel_l2 * std::sqrt(ref2) + tol.abs_floor * rms * std::sqrt(D)) {
        fail(where.str() + ": relative L2 " + std::to_string(rel) + " > " + std::to_string(tol.row_rel_l2) +
             " (ref[0]=" + std::to_string(rv[0]) + ", got[0]=" + std::to_string(p.out.get({r, h, 0})) + ")");
      }
      if (max_err > tol.max_abs * row_max + tol.abs_floor * rms) {
        fail(where.str() + ": max abs error " + std::to_string(max_err) + " > " + std::to_string(tol.max_abs) +
             " * " + std::to_string(row_max));
      }
      if (ref2 > 0) worst_row = std::max(worst_row, rel);
      if (p.c.with_lse) {
        const double got = p.lse.typed<float>()[rh];
        const double want = ref.lse[rh];
        const bool ok = std::isinf(want) ? got == want
                                         : std::isfinite(got) && std::fabs(got - want) <= tol.lse_abs + tol.lse_rel * std::fabs(want);
        if (!ok) fail(where.str() + ": lse " + std::to_string(got) + ", expected " + std::to_string(want));
      }
    }
  }
  if (ref2_total > 0 && std::sqrt(err2_total) > tol.rel_l2 * std::sqrt(ref2_total)) {
    fail("output relative L2 " + std::to_string(std::sqrt(err2_total / ref2_total)) + " > " + std::to_string(tol.rel_l2));
  }
  // Bytes of out's storage outside the view must still hold the poison.
  {
    const size_t es = elem_size(p.out.dtype);
    std::vector<char> covered(p.out.storage->size() / es, 0);
    for (int r = 0; r < p.rows; ++r)
      for (int h = 0; h < Hq; ++h)
        for (int d = 0; d < D; ++d) covered[p.out.offset + p.out.index({r, h, d})] = 1;
    const uint32_t bits = poison_bits(p.out.dtype);
    for (size_t i = 0; i < covered.size(); ++i) {
      if (!covered[i] && std::memcmp(p.out.base() + i * es, &bits, es) != 0) {
        fail("out storage element " + std::to_string(i) + " outside the view was written");
        break;
      }
    }
  }
  if (failures) {
    return ::testing::AssertionFailure() << p.c.name << ": " << failures << " failures (worst row rel L2 "
                                         << worst_row << ")" << msg.str();
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult check_attention(const AttnProblem& p, const Reference& ref) {
  return check_attention(p, ref, Tolerance::for_output(p.out.dtype));
}

/// `p` sharing its inputs, with new poisoned out and lse of the same layouts: for a
/// second run of the same problem.
inline AttnProblem with_new_outputs(const AttnProblem& p) {
  AttnProblem r = p;
  for (HostTensor* t : {&r.out, &r.lse}) {
    t->storage = std::make_shared<std::vector<uint8_t>>(t->storage->size());
    fill_poison(*t->storage, t->dtype);
  }
  return r;
}

/// After a test edits the page table or the lengths: sets c.kv_lens to `kv_lens`,
/// gives seq_lens a new storage holding them and re-derives every slot from the
/// table, so that reference(/*from_cache=*/true) reads exactly what the op reads.
inline void follow_table(AttnProblem& p, const std::vector<int>& kv_lens) {
  p.c.kv_lens = kv_lens;
  p.seq_lens = make_int32(std::vector<int32_t>(kv_lens.begin(), kv_lens.end()));
  for (int b = 0; b < p.batch; ++b) {
    const int32_t* row = p.page_table.typed<int32_t>() + static_cast<int64_t>(b) * p.cols;
    p.slots[b].resize(kv_lens[b]);
    for (int j = 0; j < kv_lens[b]; ++j) p.slots[b][j] = oracle::slot_of(row, j, p.c.page_size);
  }
}

/// Bitwise comparison of two (row, head) ranges of outputs (and lse when present).
inline ::testing::AssertionResult same_bits(const HostTensor& a, int a_row, const HostTensor& b, int b_row, int rows) {
  const int H = static_cast<int>(a.shape[1]), D = static_cast<int>(a.shape[2]);
  const size_t es = elem_size(a.dtype);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < D; ++d)
        if (std::memcmp(a.at({a_row + r, h, d}), b.at({b_row + r, h, d}), es) != 0) {
          return ::testing::AssertionFailure() << "rows " << a_row + r << " vs " << b_row + r << " head " << h << " dim "
                                               << d << ": " << a.get({a_row + r, h, d}) << " vs "
                                               << b.get({b_row + r, h, d});
        }
  return ::testing::AssertionSuccess();
}

}  // namespace ptest
