// One decode step on the CPU with the op-level API: write the new token's K/V into a
// paged cache, then attend. Built and run by the test suite (ctest -R example_).
#include <pagedmha/pagedmha.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  using namespace pagedmha;
  constexpr int kPageSize = 16, kNumPages = 8, kHq = 8, kHkv = 2, kD = 128;
  const Device cpu = Device::cpu();

  // Paged KV cache [num_pages * page_size, Hkv, D] in bf16; page 0 is the reserved dummy.
  std::vector<uint16_t> k_cache(kNumPages * kPageSize * kHkv * kD, 0), v_cache(k_cache.size(), 0);
  TensorView k_cache_t(k_cache.data(), DType::bf16, cpu, {kNumPages * kPageSize, kHkv, kD});
  TensorView v_cache_t(v_cache.data(), DType::bf16, cpu, {kNumPages * kPageSize, kHkv, kD});

  // One request whose KV length after this step is 20: pages 3 and 7 hold positions 0..31.
  std::vector<int32_t> page_table = {3, 7}, seq_lens = {20};
  TensorView page_table_t(page_table.data(), DType::int32, cpu, {1, 2});
  TensorView seq_lens_t(seq_lens.data(), DType::int32, cpu, {1});

  // Fill positions 0..18 as earlier steps would have (here: a constant per position).
  auto bf16 = [](float x) { return float_to_bf16(x); };
  for (int pos = 0; pos < 19; ++pos) {
    const int slot = page_table[pos / kPageSize] * kPageSize + pos % kPageSize;
    for (int i = 0; i < kHkv * kD; ++i) {
      k_cache[slot * kHkv * kD + i] = bf16(0.01f * (i % 7));
      v_cache[slot * kHkv * kD + i] = bf16(static_cast<float>(pos));
    }
  }

  // This step's token (position 19): its write slot, then append_kv.
  std::vector<int32_t> out_cache_loc(1);
  TensorView loc_t(out_cache_loc.data(), DType::int32, cpu, {1});
  decode_write_slots(page_table_t, seq_lens_t, kPageSize, /*q_len_per_req=*/1, loc_t);
  std::vector<uint16_t> k(kHkv * kD, bf16(0.5f)), v(kHkv * kD, bf16(19.0f));
  append_kv(TensorView(k.data(), DType::bf16, cpu, {1, kHkv, kD}),
            TensorView(v.data(), DType::bf16, cpu, {1, kHkv, kD}), k_cache_t, v_cache_t, loc_t,
            kPageSize);

  // Attention for one query per request: out [rows, Hq, D], lse [rows, Hq] (optional).
  std::vector<uint16_t> q(kHq * kD, bf16(0.1f)), out(kHq * kD);
  std::vector<float> lse(kHq);
  AttentionParams params;
  params.bmm1_scale = 1.0f / std::sqrt(static_cast<float>(kD));  // q_scale * k_scale * sm_scale
  params.bmm2_scale = 1.0f;                                       // v_scale (fp8 caches)
  batch_decode(TensorView(q.data(), DType::bf16, cpu, {1, kHq, kD}), k_cache_t, v_cache_t,
               page_table_t, seq_lens_t, kPageSize, /*q_len_per_req=*/1,
               TensorView(out.data(), DType::bf16, cpu, {1, kHq, kD}), params,
               TensorView(lse.data(), DType::fp32, cpu, {1, kHq}));
  // The CPU needs no workspace; on CUDA pass a uint8 buffer of decode_workspace_size(...)
  // bytes and a Stream.

  std::printf("slot %d, out[0] = %.4f, lse[0] = %.4f\n", out_cache_loc[0], bf16_to_float(out[0]), lse[0]);
  return out_cache_loc[0] == 7 * kPageSize + 3 ? 0 : 1;
}
