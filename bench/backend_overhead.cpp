// Host overhead of MhaBackend per step: init_forward_metadata (decode, verify) and the
// replay preparation of a captured decode graph, for bs 1, 8, 64, 256. On CUDA the time is
// what the host spends issuing the step (the device work is asynchronous); on the CPU it
// includes the metadata work itself. Writes bench/results/<device>-backend_overhead-<date>.json.
//
//   backend_overhead [--device cpu|cuda] [--out DIR] [--iters N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../tools/report_paths.h"
#include "../tools/replay/device_info.h"
#include "pagedmha/pagedmha.h"

using namespace pagedmha;

namespace {

struct Record {
  std::string op, mode;
  int batch;
  double time_us;
};

template <class F>
double median_us(int iters, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    const auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::micro>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A JSON string literal (the command line may hold quotes or backslashes).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_name = cuda_available() ? "cuda" : "cpu";
  std::string out_dir = "bench/results";
  int iters = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--device")) device_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--out")) out_dir = argv[i + 1];
    else if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
  }
  const Device dev = device_name == "cuda" ? Device::cuda(0) : Device::cpu();
  const int P = 64, C = 8192, max_bs = 256, cols = C / P;

  std::vector<int32_t> r2p_h(static_cast<size_t>(max_bs + 1) * cols, 0), rpi_h(max_bs), seq_h(max_bs);
  for (int i = 1; i <= max_bs; ++i)
    for (int c = 0; c < cols; ++c) r2p_h[static_cast<size_t>(i) * cols + c] = 1 + (i - 1) * cols + c;
  for (int r = 0; r < max_bs; ++r) rpi_h[r] = r + 1, seq_h[r] = 1000 + 13 * r;
  Buffer r2p(r2p_h.size() * 4, dev), rpi(rpi_h.size() * 4, dev), seq(seq_h.size() * 4, dev);
  copy_bytes(r2p.data(), dev, r2p_h.data(), Device::cpu(), r2p.bytes());
  copy_bytes(rpi.data(), dev, rpi_h.data(), Device::cpu(), rpi.bytes());
  copy_bytes(seq.data(), dev, seq_h.data(), Device::cpu(), seq.bytes());
  synchronize();

  std::vector<Record> records;
  for (int N : {1, 4}) {
    BackendConfig cfg;
    cfg.page_size = P;
    cfg.context_len = C;
    cfg.max_bs = max_bs;
    cfg.device = dev;
    cfg.spec_num_tokens = N;
    auto be = create_backend("pagedmha", cfg);
    be->init_cuda_graph_state(max_bs, seq.view({max_bs}, DType::int32));
    const char* mode = N == 1 ? "decode" : "verify";
    for (int bs : {1, 8, 64, 256}) {
      ForwardBatch fb;
      fb.forward_mode = N == 1 ? ForwardMode::decode : ForwardMode::target_verify;
      fb.batch_size = bs;
      fb.req_pool_indices = rpi.view({max_bs}, DType::int32);
      fb.seq_lens = seq.view({max_bs}, DType::int32);
      fb.req_to_page = r2p.view({max_bs + 1, cols}, DType::int32);
      be->init_forward_metadata(fb);
      synchronize();
      const double t_init = median_us(iters, [&] { be->init_forward_metadata(fb); });
      synchronize();
      be->init_forward_metadata_capture_cuda_graph(bs, fb.forward_mode);
      const double t_replay = median_us(iters, [&] { be->init_forward_metadata_replay_cuda_graph(fb); });
      synchronize();
      records.push_back({"init_forward_metadata", mode, bs, t_init});
      records.push_back({"replay_prepare", mode, bs, t_replay});
      std::fprintf(stderr, "%-8s bs %3d  init_forward_metadata %8.2f us  replay_prepare %8.2f us\n", mode, bs, t_init,
                   t_replay);
    }
  }

  char date[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y%m%d", std::localtime(&now));
  // The card's model names the file ("NVIDIA H100 80GB HBM3" -> h100).
  const std::string gpu_name = pagedmha::tools::device_name(dev);
  const std::string path =
      out_dir + "/" + pagedmha::tools::device_file_tag(gpu_name) + "-backend_overhead-" + date + ".json";
  std::ofstream f(path);
  // The commit comes from the environment (PAGEDMHA_COMMIT=$(git rev-parse --short HEAD)).
  const char* commit = std::getenv("PAGEDMHA_COMMIT");
  // Paths relative to the repository (this file's folder's parent; CMake compiles it by its
  // absolute path), so the committed report names no folder of the machine that ran.
  const std::string repo = std::filesystem::path(__FILE__).parent_path().parent_path().string();
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + tools::repo_relative_word(argv[i], repo);
  f << "{\"gpu\": " << json_string(gpu_name) << ", \"commit\": "
    << json_string(commit && *commit ? commit : "unknown") << ", \"command\": " << json_string(command);
  f << ", \"date\": \"" << date << "\", \"ceilings\": {},\n \"records\": [\n";
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    f << "   {\"op\": \"" << r.op << "\", \"impl\": \"pagedmha\", \"mode\": \"" << r.mode << "\", \"batch\": " << r.batch
      << ", \"ctx\": " << C << ", \"q_len\": " << (r.mode == std::string("decode") ? 1 : 4) << ", \"page_size\": " << P
      << ", \"time_us\": " << r.time_us << "}" << (i + 1 < records.size() ? "," : "") << "\n";
  }
  f << " ]}\n";
  std::fprintf(stderr, "wrote %s\n", path.c_str());
  return f ? 0 : 1;
}
