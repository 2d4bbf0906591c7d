#include "bench/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#include "pagedmha/numeric.h"
#include "pagedmha/ops.h"
#include "replay/device_info.h"
#include "replay/error_text.h"
#include "replay/replay.h"
#include "replay/timer.h"

namespace pagedmha::tools {
namespace {

struct Geometry {
  std::string name;
  int Hq, Hkv, D, window;
  bool sinks;
};

constexpr const char* kModels = "llama3-8b, llama3-70b, qwen2.5-7b, gemma, gpt-oss, gpt-oss-swa";

Geometry geometry(const std::string& name) {
  if (name == "llama3-8b") return {name, 32, 8, 128, -1, false};
  if (name == "llama3-70b") return {name, 64, 8, 128, -1, false};
  if (name == "qwen2.5-7b") return {name, 28, 4, 128, -1, false};
  if (name == "gemma") return {name, 16, 8, 256, -1, false};
  if (name == "gpt-oss") return {name, 64, 8, 64, -1, true};  // full-attention layer; window via --models gpt-oss-swa
  if (name == "gpt-oss-swa") return {name, 64, 8, 64, 127, true};
  throw_invalid_argument("bench", "--models", kModels, quote_bytes(name));
}

// The items of a comma list (empty items skipped); an empty list is an error naming
// `flag`: ',' must not quietly benchmark nothing.
std::vector<std::string> split(const std::string& s, const char* flag, const std::string& allowed) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  if (out.empty()) throw_invalid_argument("bench", flag, "a comma list of " + allowed, quote_bytes(s));
  return out;
}

constexpr const char* kOps = "decode, prefill";

double median(std::vector<double> v) {
  if (v.empty()) throw Error("bench: internal: median of no repeats");
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One shape: a paged cache with randomly permuted pages, replicated `copies` times so
// consecutive iterations read different memory (rotation past the 60 MB L2).
struct Shape {
  std::string op;
  Geometry g;
  int batch, ctx, q_len, page_size;
  DType kv;
};

nlohmann::json run_shape(const Shape& s, Device dev, int iters, int repeats) {
  const int B = s.batch, P = s.page_size, Hq = s.g.Hq, Hkv = s.g.Hkv, D = s.g.D;
  const int64_t pages_per_req = (s.ctx + P - 1) / P, pages = B * pages_per_req + 1;
  const int64_t kv_bytes = pages * P * Hkv * D * int64_t(dtype_size(s.kv));
  const int copies = dev.is_cuda() ? static_cast<int>(std::clamp<int64_t>(256'000'000 / std::max<int64_t>(2 * kv_bytes, 1), 1, 8)) : 1;
  const bool decode = s.op == "decode";
  const int64_t rows = decode ? int64_t{B} * s.q_len : int64_t{B} * s.q_len;
  std::mt19937_64 rng(42);
  std::vector<int32_t> table(size_t(B) * pages_per_req), seq(B, s.ctx), cu(B + 1);
  std::iota(table.begin(), table.end(), 1);
  std::shuffle(table.begin(), table.end(), rng);
  for (int b = 0; b <= B; ++b) cu[b] = b * s.q_len;
  std::vector<uint8_t> fill(static_cast<size_t>(kv_bytes));
  for (size_t i = 0; i < fill.size(); ++i) fill[i] = s.kv == DType::fp8_e4m3 ? uint8_t(rng() & 0x3F) : uint8_t(i & 1 ? 0x3C : rng());
  auto upload = [&](const void* p, size_t n) {
    Buffer b(std::max<size_t>(n, 4), dev);
    copy_bytes(b.data(), dev, p, Device::cpu(), n);
    return b;
  };
  std::vector<Buffer> kc, vc;
  for (int c = 0; c < copies; ++c) kc.push_back(upload(fill.data(), fill.size())), vc.push_back(upload(fill.data(), fill.size()));
  Buffer tb = upload(table.data(), table.size() * 4), sb = upload(seq.data(), seq.size() * 4), cb = upload(cu.data(), cu.size() * 4);
  std::vector<uint16_t> qh(size_t(rows) * Hq * D);
  for (auto& x : qh) x = float_to_bf16(std::uniform_real_distribution<float>(-1, 1)(rng));
  Buffer q = upload(qh.data(), qh.size() * 2), out(qh.size() * 2, dev);
  std::vector<float> sinks_h(Hq, 0.5f);
  Buffer sinks = upload(sinks_h.data(), sinks_h.size() * 4);
  const std::size_t ws = decode ? decode_workspace_size(dev, B, s.q_len, Hq, Hkv, D)
                                : prefill_workspace_size(dev, B, int64_t{B} * s.q_len);
  Buffer work(std::max<std::size_t>(ws, 1), dev);
  AttentionParams prm;
  prm.bmm1_scale = 1.0f / std::sqrt(float(D));
  prm.window_left = s.g.window;
  if (s.g.sinks) prm.sinks = sinks.view({Hq}, DType::fp32);
  const int64_t slots = pages * P;
  auto once = [&](int c) {
    const TensorView kv = kc[c].view({slots, Hkv, D}, s.kv), vv = vc[c].view({slots, Hkv, D}, s.kv);
    const TensorView qv = q.view({rows, Hq, D}, DType::bf16), ov = out.view({rows, Hq, D}, DType::bf16);
    if (decode)
      batch_decode(qv, kv, vv, tb.view({B, pages_per_req}, DType::int32), sb.view({B}, DType::int32), P, s.q_len, ov,
                   prm, {}, ws ? work.bytes_view() : TensorView{});
    else
      batch_prefill(qv, kv, vv, tb.view({B, pages_per_req}, DType::int32), sb.view({B}, DType::int32),
                    cb.view({B + 1}, DType::int32), P, s.q_len, ov, prm, {}, ws ? work.bytes_view() : TensorView{});
  };
  for (int w = 0; w < std::min(iters, 3); ++w) once(w % copies);  // warm-up
  synchronize();
  IntervalTimer timer(dev, Stream{});
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    timer.start();
    for (int i = 0; i < iters; ++i) once(i % copies);
    timer.stop();
    times.push_back(timer.take_seconds() / iters);
  }
  const double t = median(times);
  nlohmann::json rec = {{"op", s.op}, {"impl", "pagedmha"}, {"model", s.g.name}, {"batch", B}, {"ctx", s.ctx},
                        {"q_len", s.q_len}, {"page_size", P}, {"kv_dtype", s.kv == DType::fp8_e4m3 ? "fp8" : "bf16"},
                        {"window_left", s.g.window}, {"sinks", s.g.sinks}, {"time_us", t * 1e6}};
  const double kv_read = double(B) * keys_read(s.ctx, s.q_len, s.g.window) * Hkv * D * 2.0 * dtype_size(s.kv);
  const double qo = double(rows) * Hq * D * 2.0 * 2.0;
  if (decode) rec["tbps"] = (kv_read + qo) / t / 1e12;
  else rec["tflops"] = 4.0 * Hq * D * double(B) * visible_pairs(s.ctx, s.q_len, s.g.window) / t / 1e12;
  return rec;
}

// The default results folder: <build>/bench/results, <build> being the CMake build folder
// that holds this executable (its nearest ancestor with a CMakeCache.txt), else
// ./bench-results. Never the source tree: results are committed by hand.
std::string default_out_dir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (fs::path d = exe.parent_path(); !ec && !d.empty() && d != d.root_path(); d = d.parent_path()) {
    if (fs::exists(d / "CMakeCache.txt", ec)) return (d / "bench" / "results").string();
  }
  return "bench-results";
}

// Rows of the table on stdout: the header names every column (times in us, rates in TB/s
// for decode, TFLOP/s for prefill).
constexpr const char* kRowFormat = "%-8s %-12s %5s %6s %6s %4s %-4s %11s  %s\n";

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string git_commit() {
  std::string out;
  if (FILE* p = popen("git -C '" PAGEDMHA_SOURCE_DIR "' rev-parse HEAD 2>/dev/null", "r")) {
    char buf[64];
    if (fgets(buf, sizeof buf, p)) out = buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

}  // namespace

void add_bench_options(CLI::App& app, BenchOptions& o) {
  app.add_option("--device", o.device, "auto | cpu | cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--ops", o.ops, "Comma list: decode, prefill");
  app.add_option("--models", o.models, "Comma list: llama3-8b, llama3-70b, qwen2.5-7b, gemma, gpt-oss, gpt-oss-swa");
  app.add_option("--iters", o.iters, "Timed iterations per repeat (CUDA default 50, CPU 2)")->check(CLI::Range(1, 1 << 30));
  app.add_option("--repeats", o.repeats, "Repeats; the median is reported")->check(CLI::Range(1, 1 << 30));
  app.add_option("--scale", o.scale, "Divide every ctx / S by this (CUDA default 1, CPU 16: the CPU is slow)")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--out-dir", o.out_dir,
                 "Results folder, created when missing (default: <build folder>/bench/results, else ./bench-results)")
      ->check([](const std::string& d) { return d.empty() ? std::string("expected a folder name, got ''") : ""; });
}

int bench_main(const BenchOptions& o) {
  // -1 = the device default; anything else must be >= 1 (an empty median has no value).
  if (o.repeats < 1) throw_invalid_argument("bench", "--repeats", ">= 1", std::to_string(o.repeats));
  if (o.iters == 0 || o.iters < -1) throw_invalid_argument("bench", "--iters", ">= 1", std::to_string(o.iters));
  if (o.scale == 0 || o.scale < -1) throw_invalid_argument("bench", "--scale", ">= 1", std::to_string(o.scale));
  // Every list item and the device are checked before the folder is made.
  const std::vector<std::string> ops = split(o.ops, "--ops", kOps), models = split(o.models, "--models", kModels);
  for (const std::string& op : ops)
    if (op != "decode" && op != "prefill") throw_invalid_argument("bench", "--ops", kOps, quote_bytes(op));
  std::vector<Geometry> geometries;
  for (const std::string& m : models) geometries.push_back(geometry(m));
  const Device dev = parse_device(o.device, "bench");
  // Every shape must keep ctx >= q_len >= 1 after --scale (decode q_len 4 over 2k keys,
  // prefill 1k tokens, the chunk's 2k new tokens are the tightest).
  const int scale = o.scale > 0 ? o.scale : dev.is_cuda() ? 1 : 16;
  int max_scale = 1 << 30;
  for (const std::string& op : ops) max_scale = std::min(max_scale, op == "decode" ? 2048 / 4 : 1024);
  if (scale > max_scale) {
    throw_invalid_argument("bench", "--scale", "<= " + std::to_string(max_scale) + " (every shape keeps ctx >= q_len >= 1)",
                           std::to_string(scale));
  }
  // The results folder is made (and checked writable) before minutes of measuring.
  const std::string dir = o.out_dir.empty() ? default_out_dir() : o.out_dir;
  {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec || !std::filesystem::is_directory(dir) || access(dir.c_str(), W_OK) != 0)
      throw_invalid_argument("bench", "--out-dir", "a writable folder (created when missing)",
                             dir + (ec ? " (" + ec.message() + ")" : ""));
  }
  const int iters = o.iters > 0 ? o.iters : dev.is_cuda() ? 50 : 2;
  std::vector<Shape> shapes;
  for (const Geometry& g : geometries) {
    for (const std::string& op : ops) {
      if (op == "decode") {
        const std::pair<int, int> bc[] = {{1, 32768}, {16, 8192}, {64, 4096}, {256, 2048}, {128, 32768}};
        for (auto [b, c] : bc)
          for (int p : {16, 64})
            for (DType kv : {DType::bf16, DType::fp8_e4m3})
              for (int n : {1, 4}) shapes.push_back({op, g, dev.is_cuda() ? b : std::max(1, b / 4), c / scale, n, p, kv});
      } else {  // prefill
        for (int S : {1024, 4096, 16384}) shapes.push_back({op, g, 16384 / S, S / scale, S / scale, 64, DType::bf16});
        shapes.push_back({op, g, 4, 8192 / scale, 2048 / scale, 64, DType::bf16});  // chunked: 2k new over 6k cached
      }
    }
  }
  const DeviceCeilings c = device_ceilings_of(dev);
  nlohmann::json j;
  j["gpu"] = c.gpu.empty() ? device_name(dev) : c.gpu;
  j["commit"] = git_commit();
  j["command"] = "pagedmha bench --device " + o.device + " --ops " + o.ops + " --models " + o.models +
                 " --scale " + std::to_string(scale) + " --iters " + std::to_string(iters) + " --repeats " +
                 std::to_string(o.repeats);
  std::time_t now = std::time(nullptr);
  char date[32], hms[16];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  std::strftime(hms, sizeof hms, "%H%M%S", std::gmtime(&now));
  j["date"] = date;
  j["ceilings"] = c.read_tbps > 0 ? nlohmann::json{{"read_tbps", c.read_tbps}, {"copy_tbps", c.copy_tbps},
                                                   {"gemm_bf16_tflops", c.bf16_tflops}}
                                  : nlohmann::json(nullptr);
  j["records"] = nlohmann::json::array();
  std::printf(kRowFormat, "op", "model", "batch", "ctx", "q_len", "page", "kv", "time_us", "rate");
  for (const Shape& s : shapes) {
    nlohmann::json rec = run_shape(s, dev, iters, o.repeats);
    const std::string rate = rec.contains("tbps") ? fmt("%.4f TB/s", rec["tbps"].get<double>())
                                                  : fmt("%.4f TFLOP/s", rec["tflops"].get<double>());
    std::printf(kRowFormat, s.op.c_str(), s.g.name.c_str(), std::to_string(s.batch).c_str(),
                std::to_string(s.ctx).c_str(), std::to_string(s.q_len).c_str(), std::to_string(s.page_size).c_str(),
                rec["kv_dtype"].get<std::string>().c_str(), fmt("%.1f", rec["time_us"].get<double>()).c_str(),
                rate.c_str());
    std::fflush(stdout);
    j["records"].push_back(std::move(rec));
  }
  std::string gpu = j["gpu"].get<std::string>();
  for (char& ch : gpu) ch = std::isalnum(static_cast<unsigned char>(ch)) ? static_cast<char>(std::tolower(ch)) : '-';
  std::string ymd = date;
  ymd.erase(std::remove(ymd.begin(), ymd.end(), '-'), ymd.end());
  // The time of day too: two runs of one day (say --ops decode, then --ops prefill) keep
  // both files.
  std::string path = dir + "/" + gpu + "-kernels-" + ymd + "-" + hms + ".json";
  for (int k = 2; std::filesystem::exists(path); ++k) {
    path = dir + "/" + gpu + "-kernels-" + ymd + "-" + hms + "-" + std::to_string(k) + ".json";
  }
  std::ofstream f(path);
  if (!f) throw_invalid_argument("bench", "--out-dir", "a writable folder", dir);
  f << j.dump(1) << "\n";
  std::printf("wrote %s\n", path.c_str());
  return 0;
}

}  // namespace pagedmha::tools
