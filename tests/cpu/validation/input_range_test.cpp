// docs/semantics.md "Input range": values up to 2^56 give finite results whatever the
// lengths; beyond it (bf16 V near 3e38, q.k whose products overflow) debug validation
// rejects the call naming the tensor and the request instead of returning NaN or inf.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "pagedmha/error.h"
#include "pagedmha/numeric.h"
#include "pagedmha/ops.h"

namespace {

using namespace pagedmha;

// One decode request of 40 keys over pages 1..10 (page size 4), Hq 2, Hkv 1, D 64.
struct Problem {
  int D = 64, P = 4, L = 40;
  std::vector<uint16_t> q, k, v, o;
  std::vector<int32_t> table, lens;
  Problem(float qv, float kv, float vv) {
    q.assign(2 * D, float_to_bf16(qv));
    k.assign(static_cast<size_t>(11 * P * D), float_to_bf16(kv));
    v.assign(k.size(), float_to_bf16(vv));
    o.assign(q.size(), 0);
    for (int c = 0; c < 10; ++c) table.push_back(c + 1);
    lens = {L};
  }
  void run() {
    AttentionParams prm;
    prm.bmm1_scale = 0.125f;
    batch_decode(TensorView(q.data(), DType::bf16, Device::cpu(), {1, 2, D}),
                 TensorView(k.data(), DType::bf16, Device::cpu(), {11 * P, 1, D}),
                 TensorView(v.data(), DType::bf16, Device::cpu(), {11 * P, 1, D}),
                 TensorView(table.data(), DType::int32, Device::cpu(), {1, 10}),
                 TensorView(lens.data(), DType::int32, Device::cpu(), {1}), P, 1,
                 TensorView(o.data(), DType::bf16, Device::cpu(), {1, 2, D}), prm);
  }
};

struct DebugOn {
  DebugOn() { set_debug_validation(true); }
  ~DebugOn() { set_debug_validation(false); }
};

std::string error_of(Problem& p) {
  try {
    p.run();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(InputRange, AtTheBoundResultsAreFinite) {
  const float big = std::ldexp(1.0f, 56);
  Problem p(big, big, big);  // q.k = 64 * 2^112 before the scale: finite; V mean = 2^56
  DebugOn on;
  p.run();
  for (uint16_t x : p.o) EXPECT_EQ(bf16_to_float(x), big);
}

TEST(InputRange, DebugValidationNamesTheTensorBeyondIt) {
  DebugOn on;
  {
    Problem p(1.0f, 1.0f, 3.0e38f);  // V sums overflow
    const std::string e = error_of(p);
    EXPECT_NE(e.find("batch_decode: v_cache"), std::string::npos) << e;
    EXPECT_NE(e.find("2^56"), std::string::npos) << e;
    EXPECT_NE(e.find("request 0"), std::string::npos) << e;
  }
  {
    Problem p(1.0e30f, 1.0e30f, 1.0f);  // products overflow: inf - inf in the dot products
    const std::string e = error_of(p);
    EXPECT_NE(e.find("batch_decode: q"), std::string::npos) << e;
  }
  {
    Problem p(1.0f, std::nanf(""), 1.0f);
    const std::string e = error_of(p);
    EXPECT_NE(e.find("batch_decode: k_cache"), std::string::npos) << e;
  }
}

}  // namespace
