// Host rules of the persistent grids (plain C++: the launchers and tests/cpu/arch read
// them).
#pragma once

#include <cstdint>

namespace pagedmha::cuda {

/// What a persistent grid of `units` (SMs, or clusters of `width` SMs) keeps when it
/// leaves `sm_margin` SMs free (AttentionParams::sm_margin): the units that the margin
/// does not touch, at least one.
constexpr int units_left(int units, int sm_margin, int width = 1) {
  const int64_t kept = int64_t{units} - (int64_t{sm_margin} + width - 1) / width;
  return kept > 1 ? static_cast<int>(kept) : 1;
}

}  // namespace pagedmha::cuda
