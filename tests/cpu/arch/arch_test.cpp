// Which GPUs a PAGEDMHA_CUDA_ARCHS list runs on (the rule behind the "device" error of
// every op on a GPU the build has no kernels for). Expectations from the CUDA binary
// compatibility rules: sm_XY SASS runs on X.y for y >= Y; compute_XY PTX is compiled by
// the driver for any newer GPU; sm_XYa runs on X.Y only.
#include <gtest/gtest.h>

#include "cuda/common/arch.h"

namespace {

using pagedmha::cuda::archs_run_on;

TEST(CudaArchs, DefaultList) {
  constexpr const char* kDefault = "80,89,90a";
  for (int cc : {50, 61, 70, 75}) EXPECT_FALSE(archs_run_on(kDefault, cc)) << cc;
  // A100, A10 / RTX 3090, Orin, L40 / RTX 4090, H100 / H200; Blackwell through
  // compute_89 PTX.
  for (int cc : {80, 86, 87, 89, 90, 100, 120}) EXPECT_TRUE(archs_run_on(kDefault, cc)) << cc;
}

TEST(CudaArchs, ArchSpecificRunsOnItsOwnCapabilityOnly) {
  EXPECT_TRUE(archs_run_on("90a", 90));
  for (int cc : {80, 89, 100}) EXPECT_FALSE(archs_run_on("90a", cc)) << cc;
  EXPECT_FALSE(archs_run_on("90a-real", 100));
}

TEST(CudaArchs, RealIsSassOfOneMajor) {
  for (int cc : {80, 86, 89}) EXPECT_TRUE(archs_run_on("80-real", cc)) << cc;
  for (int cc : {75, 90, 100}) EXPECT_FALSE(archs_run_on("80-real", cc)) << cc;
  EXPECT_FALSE(archs_run_on("89-real", 86));
}

TEST(CudaArchs, VirtualIsPtxForEveryNewerGpu) {
  for (int cc : {80, 89, 90, 120}) EXPECT_TRUE(archs_run_on("80-virtual", cc)) << cc;
  EXPECT_FALSE(archs_run_on("80-virtual", 75));
  EXPECT_FALSE(archs_run_on("89-virtual", 86));
}

TEST(CudaArchs, AnyEntryCovers) {
  EXPECT_TRUE(archs_run_on("90a,80-real", 86));
  EXPECT_TRUE(archs_run_on("80-real,90a", 90));
  EXPECT_FALSE(archs_run_on("80-real,90a", 100));
  EXPECT_FALSE(archs_run_on("", 90));
}

}  // namespace

namespace {

// The per-device cache of device attributes, occupancy and kernel properties: computed
// once per device; a -1 ("could not be read") is computed again; devices past the cache
// every time.
TEST(OncePerDevice, ComputesOncePerDeviceAndRetriesFailures) {
  static std::atomic<int> cache[pagedmha::cuda::kMaxDevices];
  int calls = 0;
  const auto seven = [&] { return ++calls, 7; };
  EXPECT_EQ(pagedmha::cuda::once_per_device(cache, 3, seven), 7);
  EXPECT_EQ(pagedmha::cuda::once_per_device(cache, 3, seven), 7);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(pagedmha::cuda::once_per_device(cache, 4, [] { return 0; }), 0);
  EXPECT_EQ(pagedmha::cuda::once_per_device(cache, 4, seven), 0) << "0 is a value, kept";
  EXPECT_EQ(calls, 1);
  int failures = 0;
  const auto fail = [&] { return ++failures, -1; };
  EXPECT_EQ(pagedmha::cuda::once_per_device(cache, 5, fail), -1);
  EXPECT_EQ(pagedmha::cuda::once_per_device(cache, 5, fail), -1);
  EXPECT_EQ(failures, 2);
  for (int device : {-1, pagedmha::cuda::kMaxDevices}) {
    calls = 0;
    pagedmha::cuda::once_per_device(cache, device, seven);
    pagedmha::cuda::once_per_device(cache, device, seven);
    EXPECT_EQ(calls, 2) << "device " << device;
  }
}

}  // namespace
