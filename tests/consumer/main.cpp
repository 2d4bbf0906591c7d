// One batch_decode on the CPU through an installed or embedded pagedmha, checked against
// values computed by hand. Exit status 0 when they match.
//
// One request of two keys (page_size 1, page_table {1, 0}: position 0 in page 1, position
// 1 in page 0), one head, head dim 64, fp16. q = e0, k0 = 0, k1 = e0, so q.k = (0, 1);
// bmm1_scale = ln 3 gives the logits (0, ln 3) and the weights (1/4, 3/4). v0 = 0 and
// v1 = 4 everywhere give out = 3 in every column and lse = ln(1 + 3) = ln 4.
#include <pagedmha/pagedmha.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  using namespace pagedmha;
  constexpr int kD = 64;
  const Device cpu = Device::cpu();
  std::vector<uint16_t> q(kD, float_to_fp16(0.0f)), k_cache(2 * kD, float_to_fp16(0.0f)),
      v_cache(2 * kD, float_to_fp16(0.0f)), out(kD);
  q[0] = float_to_fp16(1.0f);
  k_cache[0 * kD + 0] = float_to_fp16(1.0f);  // page 0 holds position 1
  for (int d = 0; d < kD; ++d) v_cache[0 * kD + d] = float_to_fp16(4.0f);
  std::vector<int32_t> page_table{1, 0}, seq_lens{2};
  std::vector<float> lse(1);

  AttentionParams params;
  params.bmm1_scale = std::log(3.0f);
  try {
    batch_decode(TensorView(q.data(), DType::fp16, cpu, {1, 1, kD}),
                 TensorView(k_cache.data(), DType::fp16, cpu, {2, 1, kD}),
                 TensorView(v_cache.data(), DType::fp16, cpu, {2, 1, kD}),
                 TensorView(page_table.data(), DType::int32, cpu, {1, 2}),
                 TensorView(seq_lens.data(), DType::int32, cpu, {1}), /*page_size=*/1, /*q_len_per_req=*/1,
                 TensorView(out.data(), DType::fp16, cpu, {1, 1, kD}), params,
                 TensorView(lse.data(), DType::fp32, cpu, {1, 1}));
  } catch (const Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
  int bad = 0;
  for (int d = 0; d < kD; ++d) bad += std::fabs(fp16_to_float(out[d]) - 3.0f) > 1e-3f;
  const bool lse_ok = std::fabs(lse[0] - std::log(4.0f)) < 1e-5f;
  std::printf("consumer: out[0] = %g (expected 3), lse = %.7f (expected ln 4 = %.7f), %d bad columns\n",
              fp16_to_float(out[0]), lse[0], std::log(4.0f), bad);
  return bad == 0 && lse_ok ? 0 : 1;
}
