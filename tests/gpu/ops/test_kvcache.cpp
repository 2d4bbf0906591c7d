// append_kv on CUDA: bf16/fp16 copies and fp8 e4m3 quantisation against the oracle's
// encoding, byte for byte over the whole pool (no other slot changes); check_append
// is in harness.h.
#include <gtest/gtest.h>

#include "gpu/ops/harness.h"

namespace gpu_test {
namespace {

TEST(GpuAppendKv, Grid) {
  REQUIRE_GPU();
  const DType pairs[][2] = {{DType::bf16, DType::bf16},
                            {DType::fp16, DType::fp16},
                            {DType::bf16, DType::fp8_e4m3},
                            {DType::fp16, DType::fp8_e4m3}};
  const int pages[] = {1, 3, 16, 64, 256};
  const int tokens[] = {0, 1, 37, 300};
  int i = 0;
  for (const auto& pr : pairs)
    for (int D : {64, 128, 256})
      for (int Hkv : {1, 8}) {
        const CacheLayout layout = i % 2 == 1 ? CacheLayout::hnd4 : CacheLayout::nhd4;
        check_append({pr[0], pr[1], pages[i % 5], D, Hkv, tokens[i % 4], layout, i % 3 == 0, 0.37f, 2.5f}, 3000 + i);
        ++i;
      }
}

TEST(GpuAppendKv, UnitScaleAndSmallScaleSaturation) {
  REQUIRE_GPU();
  check_append({DType::bf16, DType::fp8_e4m3, 16, 128, 4, 64, CacheLayout::nhd4, false, 1.0f, 1.0f}, 3100);
  check_append({DType::bf16, DType::fp8_e4m3, 16, 128, 4, 64, CacheLayout::nhd4, false, 0.01f, 0.02f}, 3101);
}

}  // namespace
}  // namespace gpu_test
