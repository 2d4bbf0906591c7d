#include "check/check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#include "pagedmha/numeric.h"
#include "pagedmha/ops.h"
#include "replay/replay.h"

namespace pagedmha::tools {
namespace {

// Host storage helpers: element i of a bf16 / fp16 / fp8 / fp32 array as float, and back.
float load(const std::vector<uint8_t>& b, DType dt, int64_t i) {
  switch (dt) {
    case DType::bf16: return bf16_to_float(reinterpret_cast<const uint16_t*>(b.data())[i]);
    case DType::fp16: return fp16_to_float(reinterpret_cast<const uint16_t*>(b.data())[i]);
    case DType::fp8_e4m3: return fp8_e4m3_to_float(b[i]);
    default: return reinterpret_cast<const float*>(b.data())[i];
  }
}
void store(std::vector<uint8_t>& b, DType dt, int64_t i, float x) {
  switch (dt) {
    case DType::bf16: reinterpret_cast<uint16_t*>(b.data())[i] = float_to_bf16(x); break;
    case DType::fp16: reinterpret_cast<uint16_t*>(b.data())[i] = float_to_fp16(x); break;
    case DType::fp8_e4m3: b[i] = float_to_fp8_e4m3(x); break;
    default: reinterpret_cast<float*>(b.data())[i] = x;
  }
}

// A host array mirrored on the device.
struct Mirror {
  std::vector<uint8_t> host;
  Buffer dev;
  Device device;
  Mirror(size_t bytes, Device d) : host(bytes, 0), dev(std::max<size_t>(bytes, 4), d), device(d) {}
  void upload() { copy_bytes(dev.data(), device, host.data(), Device::cpu(), host.size()); }
  void download() {
    copy_bytes(host.data(), Device::cpu(), dev.data(), device, host.size());
    synchronize();
  }
  TensorView view(std::initializer_list<int64_t> shape, DType dt) const { return dev.view(shape, dt); }
};

struct AttnCase {
  std::string name;
  int Hq, Hkv, D, P;
  DType kv;
  std::vector<int> seq_lens;   // KV length per request after the step
  std::vector<int> q_lens;     // decode: all equal with decode = true
  bool decode;
  int window = -1;
  bool sinks = false;
  float softcap = 0.0f;
};

struct Result {
  double rel_err = 0.0;
  bool ok = false;
  std::string note;
};

Result run_attention_case(const AttnCase& c, Device dev, std::mt19937_64& rng) {
  const int B = static_cast<int>(c.seq_lens.size());
  const int Hq = c.Hq, Hkv = c.Hkv, D = c.D, P = c.P;
  const DType qdt = DType::bf16;
  const bool fp8 = c.kv == DType::fp8_e4m3;
  const float k_scale = fp8 ? 0.37f : 1.0f, v_scale = fp8 ? 2.5f : 1.0f;
  std::uniform_real_distribution<float> U(-1.0f, 1.0f);
  // Pages: a random permutation of 1..total (page 0 reserved).
  std::vector<int> npages(B);
  int total_pages = 0, cols = 1;
  for (int b = 0; b < B; ++b) {
    npages[b] = (c.seq_lens[b] + P - 1) / P;
    total_pages += npages[b];
    cols = std::max(cols, npages[b]);
  }
  std::vector<int32_t> perm(total_pages);
  std::iota(perm.begin(), perm.end(), 1);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int64_t num_pages = total_pages + 1, slots = num_pages * P, row_kv = int64_t{Hkv} * D;
  Mirror table(size_t(B) * cols * 4, dev), seq(size_t(B) * 4, dev), cu(size_t(B + 1) * 4, dev);
  Mirror kc(size_t(slots * row_kv) * dtype_size(c.kv), dev), vc(size_t(slots * row_kv) * dtype_size(c.kv), dev);
  auto* tab = reinterpret_cast<int32_t*>(table.host.data());
  std::fill(tab, tab + B * cols, -1);  // never-read tail entries
  for (int b = 0, k = 0; b < B; ++b)
    for (int p = 0; p < npages[b]; ++p) tab[b * cols + p] = perm[k++];
  for (int64_t i = 0; i < slots * row_kv; ++i) {
    store(kc.host, c.kv, i, U(rng) / k_scale);
    store(vc.host, c.kv, i, U(rng) / v_scale);
  }
  int total_q = 0;
  std::vector<int> cu_q(B + 1, 0);
  for (int b = 0; b < B; ++b) cu_q[b + 1] = total_q += c.q_lens[b];
  std::copy(c.seq_lens.begin(), c.seq_lens.end(), reinterpret_cast<int32_t*>(seq.host.data()));
  std::copy(cu_q.begin(), cu_q.end(), reinterpret_cast<int32_t*>(cu.host.data()));
  const int64_t row_q = int64_t{Hq} * D;
  Mirror q(size_t(total_q * row_q) * 2, dev), out(size_t(total_q * row_q) * 2, dev), sinks(size_t(Hq) * 4, dev);
  for (int64_t i = 0; i < total_q * row_q; ++i) store(q.host, qdt, i, 2.0f * U(rng));
  for (int h = 0; h < Hq; ++h) store(sinks.host, DType::fp32, h, (h % 4 == 0) ? -INFINITY : 3.0f * U(rng));
  for (Mirror* m : {&table, &seq, &cu, &kc, &vc, &q, &sinks}) m->upload();
  AttentionParams prm;
  prm.bmm1_scale = k_scale / std::sqrt(float(D));
  prm.bmm2_scale = v_scale;
  prm.window_left = c.window;
  prm.logits_soft_cap = c.softcap;
  if (c.sinks) prm.sinks = sinks.view({Hq}, DType::fp32);
  const TensorView qv = q.view({total_q, Hq, D}, qdt), ov = out.view({total_q, Hq, D}, qdt);
  const TensorView kv = kc.view({slots, Hkv, D}, c.kv), vv = vc.view({slots, Hkv, D}, c.kv);
  const TensorView tv = table.view({B, cols}, DType::int32), sv = seq.view({B}, DType::int32);
  if (c.decode) {
    const std::size_t ws = decode_workspace_size(dev, B, c.q_lens[0], Hq, Hkv, D);
    Buffer work(std::max<std::size_t>(ws, 1), dev);
    batch_decode(qv, kv, vv, tv, sv, P, c.q_lens[0], ov, prm, {}, ws ? work.bytes_view() : TensorView{});
  } else {
    const int max_q = *std::max_element(c.q_lens.begin(), c.q_lens.end());
    const std::size_t ws = prefill_workspace_size(dev, B, total_q);
    Buffer work(std::max<std::size_t>(ws, 1), dev);
    batch_prefill(qv, kv, vv, tv, sv, cu.view({B + 1}, DType::int32), P, max_q, ov, prm, {},
                  ws ? work.bytes_view() : TensorView{});
  }
  synchronize();
  out.download();
  // Straightforward fp64 reference over the dequantised cache.
  double num = 0, den = 0;
  bool finite = true;
  const int G = Hq / Hkv;
  for (int b = 0; b < B; ++b) {
    const int L = c.seq_lens[b], n = c.q_lens[b];
    for (int i = 0; i < n; ++i) {
      const int64_t qrow = cu_q[b] + i, pos = int64_t{L} - n + i;
      for (int h = 0; h < Hq; ++h) {
        const int g = h / G;
        std::vector<double> s;
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < L; ++j) {
          if (j > pos || (c.window >= 0 && j < pos - c.window)) continue;
          const int64_t slot = int64_t{tab[b * cols + j / P]} * P + j % P;
          double dot = 0;
          for (int d = 0; d < D; ++d)
            dot += double(load(q.host, qdt, qrow * row_q + h * D + d)) * load(kc.host, c.kv, slot * row_kv + g * D + d);
          double x = dot * k_scale / std::sqrt(double(D));
          if (c.softcap > 0) x = c.softcap * std::tanh(x / c.softcap);
          s.push_back(x);
          keys.push_back(slot);
        }
        const double sink = c.sinks ? load(sinks.host, DType::fp32, h) : -INFINITY;
        double mx = sink;
        for (double x : s) mx = std::max(mx, x);
        double z = std::isinf(sink) ? 0.0 : std::exp(sink - mx);
        for (double x : s) z += std::exp(x - mx);
        for (int d = 0; d < D; ++d) {
          double o = 0;
          for (size_t t = 0; t < s.size(); ++t)
            o += std::exp(s[t] - mx) * load(vc.host, c.kv, keys[t] * row_kv + g * D + d) * v_scale;
          if (z > 0) o /= z;
          const double got = load(out.host, qdt, qrow * row_q + h * D + d);
          finite &= std::isfinite(got);
          num += (got - o) * (got - o);
          den += o * o;
        }
      }
    }
  }
  Result r;
  r.rel_err = std::sqrt(num / std::max(den, 1e-30));
  r.ok = finite && r.rel_err <= 1e-2;
  if (!finite) r.note = "non-finite output";
  return r;
}

// Exact int32 ops against loops.
Result run_metadata_case(const std::string& which, Device dev, std::mt19937_64& rng) {
  const int B = 7, P = 16, cols = 9;
  std::uniform_int_distribution<int> len(0, P * cols - 1);
  std::vector<int32_t> lens(B), prefix(B), table(B * cols);
  for (int b = 0; b < B; ++b) lens[b] = len(rng), prefix[b] = lens[b] / 3;
  for (auto& t : table) t = static_cast<int32_t>(rng() % 1000 + 1);
  auto up = [&](const std::vector<int32_t>& v) {
    Mirror m(v.size() * 4, dev);
    std::copy(v.begin(), v.end(), reinterpret_cast<int32_t*>(m.host.data()));
    m.upload();
    return m;
  };
  auto down = [&](Mirror& m, size_t n) {
    m.download();
    const int32_t* p = reinterpret_cast<const int32_t*>(m.host.data());
    return std::vector<int32_t>(p, p + n);
  };
  std::vector<int32_t> want, got;
  Mirror L = up(lens), T = up(table);
  if (which == "cumsum_lengths") {
    Mirror o(size_t(B + 1) * 4, dev);
    cumsum_lengths(L.view({B}, DType::int32), o.view({B + 1}, DType::int32));
    got = down(o, B + 1);
    want.assign(1, 0);
    for (int b = 0; b < B; ++b) want.push_back(want.back() + lens[b]);
  } else if (which == "clamp_seq_lens") {
    Mirror o(size_t(B) * 4, dev);
    clamp_seq_lens(L.view({B}, DType::int32), 40, o.view({B}, DType::int32));
    got = down(o, B);
    for (int b = 0; b < B; ++b) want.push_back(std::max(lens[b], 40));
  } else if (which == "decode_write_slots") {
    const int N = 3;
    Mirror o(size_t(B) * N * 4, dev);
    decode_write_slots(T.view({B, cols}, DType::int32), L.view({B}, DType::int32), P, N, o.view({B * N}, DType::int32));
    got = down(o, size_t(B) * N);
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < N; ++j) {
        const int pos = std::max(lens[b] - N + j, 0);
        want.push_back(table[b * cols + pos / P] * P + pos % P);
      }
  } else if (which == "extend_write_slots") {
    std::vector<int32_t> cu(B + 1, 0);
    for (int b = 0; b < B; ++b) cu[b + 1] = cu[b] + (lens[b] - prefix[b]);
    Mirror C = up(cu), Pf = up(prefix), o(size_t(cu[B]) * 4 + 4, dev);
    extend_write_slots(T.view({B, cols}, DType::int32), Pf.view({B}, DType::int32), C.view({B + 1}, DType::int32), P,
                       o.view({cu[B]}, DType::int32));
    got = down(o, cu[B]);
    for (int b = 0; b < B; ++b)
      for (int pos = prefix[b]; pos < lens[b]; ++pos) want.push_back(table[b * cols + pos / P] * P + pos % P);
  } else {  // gather_page_table_with_padding
    std::vector<int32_t> rpi(B);
    for (int b = 0; b < B; ++b) rpi[b] = b + 1;
    std::vector<int32_t> r2p(size_t(B + 1) * cols, 0);
    std::copy(table.begin(), table.end(), r2p.begin() + cols);
    Mirror R = up(r2p), I = up(rpi), o(size_t(B) * cols * 4, dev);
    gather_page_table_with_padding(R.view({B + 1, cols}, DType::int32), I.view({B}, DType::int32),
                                   L.view({B}, DType::int32), o.view({B, cols}, DType::int32), B, cols, P);
    got = down(o, size_t(B) * cols);
    for (int b = 0; b < B; ++b)
      for (int c = 0; c < cols; ++c) want.push_back(c < (lens[b] + P - 1) / P ? table[b * cols + c] : 0);
  }
  Result r;
  r.ok = got == want;
  r.rel_err = r.ok ? 0.0 : 1.0;
  if (!r.ok) r.note = "int32 values differ";
  return r;
}

Result run_append_kv_case(DType kv, Device dev, std::mt19937_64& rng) {
  const int T = 37, Hkv = 4, D = 64, P = 16, pages = 12;
  const int64_t slots = int64_t{pages} * P, row = int64_t{Hkv} * D;
  const float ks = kv == DType::fp8_e4m3 ? 0.37f : 1.0f, vs = kv == DType::fp8_e4m3 ? 2.5f : 1.0f;
  const DType src = kv == DType::fp16 ? DType::fp16 : DType::bf16;
  std::uniform_real_distribution<float> U(-3.0f, 3.0f);
  Mirror k(size_t(T * row) * 2, dev), v(size_t(T * row) * 2, dev);
  Mirror kc(size_t(slots * row) * dtype_size(kv), dev), vc(size_t(slots * row) * dtype_size(kv), dev);
  Mirror loc(size_t(T) * 4, dev);
  for (int64_t i = 0; i < T * row; ++i) store(k.host, src, i, U(rng)), store(v.host, src, i, U(rng));
  for (auto& b : kc.host) b = static_cast<uint8_t>(rng());
  for (auto& b : vc.host) b = static_cast<uint8_t>(rng());
  std::vector<int32_t> sl(slots - P);
  std::iota(sl.begin(), sl.end(), P);  // never page 0
  std::shuffle(sl.begin(), sl.end(), rng);
  std::copy(sl.begin(), sl.begin() + T, reinterpret_cast<int32_t*>(loc.host.data()));
  const auto kc0 = kc.host, vc0 = vc.host;
  for (Mirror* m : {&k, &v, &kc, &vc, &loc}) m->upload();
  append_kv(k.view({T, Hkv, D}, src), v.view({T, Hkv, D}, src), kc.view({slots, Hkv, D}, kv),
            vc.view({slots, Hkv, D}, kv), loc.view({T}, DType::int32), P, ks, vs);
  synchronize();
  kc.download();
  vc.download();
  auto wk = kc0, wv = vc0;
  for (int t = 0; t < T; ++t)
    for (int64_t i = 0; i < row; ++i) {
      const int64_t s = sl[t];
      store(wk, kv, s * row + i, load(k.host, src, t * row + i) / ks);
      store(wv, kv, s * row + i, load(v.host, src, t * row + i) / vs);
    }
  Result r;
  r.ok = wk == kc.host && wv == vc.host;
  r.rel_err = r.ok ? 0.0 : 1.0;
  if (!r.ok) r.note = "cache bytes differ (written slots or untouched ones)";
  return r;
}

}  // namespace

void add_check_options(CLI::App& app, CheckOptions& o) {
  app.add_option("--device", o.device, "auto | cpu | cuda (auto: the GPU when one is available)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--seed", o.seed, "Seed of the random inputs");
}

CheckSummary run_checks(const CheckOptions& o) {
  const Device dev = parse_device(o.device, "check");
  std::mt19937_64 rng(o.seed);
  std::vector<std::pair<std::string, std::function<Result()>>> cases;
  const std::vector<AttnCase> attn = {
      {"decode bf16 llama3-8b p16", 32, 8, 128, 16, DType::bf16, {1, 17, 300, 64}, {1, 1, 1, 1}, true},
      {"decode fp8 k0.37 v2.5 p64", 32, 8, 128, 64, DType::fp8_e4m3, {5, 129, 700}, {1, 1, 1}, true},
      {"decode gpt-oss D64 sinks w127", 64, 8, 64, 16, DType::bf16, {1, 128, 129, 600}, {1, 1, 1, 1}, true, 127, true},
      {"decode D256 GQA2 softcap", 8, 4, 256, 3, DType::bf16, {33, 70}, {1, 1}, true, -1, false, 30.0f},
      {"verify q_len 4 p16", 32, 8, 128, 16, DType::bf16, {4, 50, 257}, {4, 4, 4}, true},
      {"prefill causal ragged", 28, 4, 128, 16, DType::bf16, {40, 1, 130}, {40, 1, 130}, false},
      {"prefill with prefix, w31", 16, 2, 64, 16, DType::bf16, {200, 97}, {60, 9}, false, 31},
      {"prefill fp8 prefix sinks", 16, 8, 128, 64, DType::fp8_e4m3, {333, 80}, {100, 80}, false, -1, true},
  };
  for (const AttnCase& c : attn) cases.push_back({c.name, [&, c] { return run_attention_case(c, dev, rng); }});
  for (DType kv : {DType::bf16, DType::fp16, DType::fp8_e4m3})
    cases.push_back({std::string("append_kv ") + dtype_name(kv), [&, kv] { return run_append_kv_case(kv, dev, rng); }});
  for (const char* m : {"cumsum_lengths", "clamp_seq_lens", "decode_write_slots", "extend_write_slots",
                        "gather_page_table_with_padding"})
    cases.push_back({m, [&, m] { return run_metadata_case(m, dev, rng); }});

  CheckSummary sum;
  std::printf("pagedmha check on %s\n%-36s %-12s %s\n", dev.str().c_str(), "case", "rel L2 err", "result");
  for (auto& [name, fn] : cases) {
    Result r;
    try {
      r = fn();
    } catch (const std::exception& e) {
      r.ok = false;
      r.note = std::string("error: ") + e.what();
    }
    ++sum.cases;
    sum.failures += !r.ok;
    std::printf("%-36s %-12.3g %s%s%s\n", name.c_str(), r.rel_err, r.ok ? "ok" : "FAIL", r.note.empty() ? "" : "  ",
                r.note.c_str());
  }
  std::printf("%d cases, %d failed\n", sum.cases, sum.failures);
  return sum;
}

int check_main(const CheckOptions& o) { return run_checks(o).failures == 0 ? 0 : 3; }

}  // namespace pagedmha::tools
