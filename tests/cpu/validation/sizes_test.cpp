// Size arithmetic that user-given counts turn into elements or bytes is checked (a wrapped
// size defeated the size and overlap checks and let append_kv write outside the pool), and
// the two caches append_kv writes may not share an element.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/error_text.h"
#include "pagedmha/backend.h"
#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#include "pagedmha/numeric.h"
#include "pagedmha/ops.h"

namespace {

using namespace pagedmha;

using testutil::error_of;

void expect_has(const std::string& msg, std::initializer_list<const char*> frags) {
  for (const char* f : frags) EXPECT_NE(msg.find(f), std::string::npos) << "missing \"" << f << "\" in: " << msg;
}

// The replay's wild write: slots x Hkv x D x 2 bytes wrapped to 0. Views this large over a
// small buffer are rejected before anything is read or written.
TEST(Sizes, AppendKvHugeViewsAreErrorsNotWrites) {
  std::vector<uint16_t> k(2 * 64, float_to_bf16(1.0f)), kc(64 * 64, 0);
  const int64_t heads = 2097152, slots = int64_t{16777216} * 4096;
  const TensorView kk(k.data(), DType::bf16, Device::cpu(), {1, heads, 64});
  const TensorView cache(kc.data(), DType::bf16, Device::cpu(), {slots, heads, 64});  // 2^69 elements
  std::vector<int32_t> loc{0};
  const std::vector<uint16_t> before = kc;
  expect_has(error_of([&] { append_kv(kk, kk, cache, cache, TensorView(loc.data(), DType::int32, Device::cpu(), {1}), 4096); }),
             {"append_kv", "2^63"});
  EXPECT_EQ(kc, before);
}

TEST(Sizes, NumelOverflowIsAnError) {
  std::vector<uint8_t> b(16);
  const int64_t big = int64_t{1} << 40;
  expect_has(error_of([&] { (void)TensorView(b.data(), DType::uint8, Device::cpu(), {big, big}, {1, 1}).numel(); }),
             {"TensorView", "shape", "2^63"});
  expect_has(error_of([&] { (void)TensorView(b.data(), DType::uint8, Device::cpu(), {big, big, big}); }),
             {"TensorView", "shape"});
  expect_has(error_of([&] { (void)Buffer::empty({big, big}, DType::fp32, Device::cpu()); }),
             {"Buffer::empty", "shape", "2^63"});
}

// A host buffer within 63 bytes of 2^64 (a workspace_bytes from the config): rounding it
// up to the 64-byte alignment would wrap to 0 and "allocate" it.
TEST(Sizes, HostBufferNearTwoTo64IsAnError) {
  expect_has(error_of([] { Buffer b(~std::size_t{0}, Device::cpu()); }), {"Buffer", "bytes", "18446744073709551615"});
  expect_has(error_of([] { Buffer b(~std::size_t{0} - 62, Device::cpu()); }),
             {"Buffer", "bytes", "18446744073709551553"});
}

// K and V in one allocation: interleaved pages (disjoint elements) are fine; V shifted by
// 64 elements over K (the same rows) is an error, and nothing is written.
TEST(Sizes, AppendKvCachesSharingElementsAreErrors) {
  const int P = 4, H = 2, D = 64, pages = 3;
  std::vector<uint16_t> pool(static_cast<size_t>(2 * pages * P * H * D) + 64, 0);
  std::vector<uint16_t> k(H * D, float_to_bf16(1.0f)), v(H * D, float_to_bf16(2.0f));
  std::vector<int32_t> loc{5};
  const TensorView kk(k.data(), DType::bf16, Device::cpu(), {1, H, D}), vv(v.data(), DType::bf16, Device::cpu(), {1, H, D});
  const TensorView slots(loc.data(), DType::int32, Device::cpu(), {1});
  const int64_t page = int64_t{P} * H * D;
  // Interleaved: page p of K at 2p, of V at 2p + 1.
  const TensorView ki(pool.data(), DType::bf16, Device::cpu(), {pages, P, H, D}, {2 * page, H * D, D, 1});
  const TensorView vi(pool.data() + page, DType::bf16, Device::cpu(), {pages, P, H, D}, {2 * page, H * D, D, 1});
  append_kv(kk, vv, ki, vi, slots, P);
  EXPECT_EQ(bf16_to_float(pool[static_cast<size_t>(2 * page + 1 * H * D)]), 1.0f);  // K slot 5 = page 1, row 1
  EXPECT_EQ(bf16_to_float(pool[static_cast<size_t>(3 * page + 1 * H * D)]), 2.0f);  // V slot 5
  const std::vector<uint16_t> before = pool;
  const TensorView vs(pool.data() + 64, DType::bf16, Device::cpu(), {pages, P, H, D}, {2 * page, H * D, D, 1});
  expect_has(error_of([&] { append_kv(kk, vv, ki, vs, slots, P); }), {"append_kv", "v_cache", "k_cache"});
  EXPECT_EQ(pool, before);
}

TEST(Sizes, BackendMaxBsOutOfRangeNamesTheField) {
  BackendConfig c;
  c.page_size = 16;
  c.context_len = 4096;
  c.max_bs = std::numeric_limits<int>::max();
  expect_has(error_of([&] { MhaBackend be(c); }), {"config.max_bs", "2147483647"});
}

// A workspace no allocator gives names the field that sized it, not the internal Buffer.
TEST(Sizes, BackendUnallocatableWorkspaceNamesTheField) {
  BackendConfig c;
  c.page_size = 16;
  c.context_len = 4096;
  c.workspace_bytes = ~std::size_t{0};
  const std::string e = error_of([&] { MhaBackend be(c); });
  expect_has(e, {"config.workspace_bytes", "allocatable", "18446744073709551615"});
  EXPECT_EQ(e.find("Buffer"), std::string::npos) << e;
}

}  // namespace
