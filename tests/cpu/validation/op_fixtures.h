// Small CPU views and op fixtures shared by the validation and hand-computed tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <vector>

#include "pagedmha/numeric.h"
#include "pagedmha/ops.h"

namespace opfix {

using namespace pagedmha;

inline const Device kCpu = Device::cpu();
inline constexpr float kInf = std::numeric_limits<float>::infinity();

template <class T>
TensorView view(std::vector<T>& v, DType dtype, std::initializer_list<int64_t> shape) {
  return TensorView(v.data(), dtype, kCpu, shape);
}

inline std::vector<uint16_t> bf16_fill(std::size_t n, float x) { return std::vector<uint16_t>(n, float_to_bf16(x)); }

// append_kv: 3 tokens into a pool of 8 pages x 4 slots (32 slots), Hkv 2, D 64.
struct Append {
  std::vector<uint16_t> k = bf16_fill(3 * 2 * 64, 1.0f), v = bf16_fill(3 * 2 * 64, 2.0f);
  std::vector<uint16_t> kc = bf16_fill(32 * 2 * 64, 0.0f), vc = kc;
  std::vector<int32_t> loc{4, 5, 31};
  TensorView K() { return view(k, DType::bf16, {3, 2, 64}); }
  TensorView V() { return view(v, DType::bf16, {3, 2, 64}); }
  TensorView KC() { return view(kc, DType::bf16, {32, 2, 64}); }
  TensorView VC() { return view(vc, DType::bf16, {32, 2, 64}); }
  TensorView L() { return view(loc, DType::int32, {3}); }
};

// gather_page_table_with_padding: req_to_page [4, 8].
struct Gather {
  std::vector<int32_t> r2p, idx{2, 1, 0}, lens{9, 3, 1}, out = std::vector<int32_t>(3 * 8, -7);
  Gather() {
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 8; ++c) r2p.push_back(r == 0 ? 0 : 10 * r + c);
    }
  }
  void run(int bs, int cols, int P = 4) {
    gather_page_table_with_padding(view(r2p, DType::int32, {4, 8}), view(idx, DType::int32, {3}),
                                   view(lens, DType::int32, {3}), view(out, DType::int32, {3, 8}), bs, cols, P);
  }
};

}  // namespace opfix
