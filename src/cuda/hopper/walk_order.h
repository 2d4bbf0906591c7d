// The order in which the persistent grid's walkers (clusters) take the plan's units
// (plain C++: the kernels' Walk, params.cuh, and tests/cpu/arch read it).
#pragma once

#include "pagedmha/variant.h"  // PAGEDMHA_HD

namespace pagedmha::cuda::sm90 {

/// Units (a plan pair's items: schedule.cuh), sorted longest first, go to the S walkers
/// in rounds of S, serpentine: in round k walker c takes unit k S + c when k is even and
/// k S + S - 1 - c when k is odd. Round-robin (unit k S + c every round) gave walker 0
/// the longest unit of every round, so a short grid ended on it (a ramp of causal tiles
/// over 2.6 rounds: 87% of the ideal; serpentine: 98%). Every unit of a round goes to
/// one walker, so a round runs the same units either way.
/// The unit after `q` (of round k = q / S) for walker c of S.
PAGEDMHA_HD int serpentine_next(int q, int k, int c, int S) {
  return q + ((k & 1) != 0 ? 2 * c + 1 : 2 * (S - 1 - c) + 1);
}

}  // namespace pagedmha::cuda::sm90
