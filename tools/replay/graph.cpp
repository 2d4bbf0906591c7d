#include "replay/graph.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "pagedmha/error.h"

#if defined(PAGEDMHA_WITH_CUDA)
#include "replay/cuda_check.h"
#endif

namespace pagedmha::tools {

#if defined(PAGEDMHA_WITH_CUDA)
namespace {
void check(cudaError_t e, const char* what) { check_cuda(e, "replay", what); }
}  // namespace

CudaStream::CudaStream(Device device) {
  if (!device.is_cuda()) return;
  check(cudaSetDevice(device.index), "cudaSetDevice");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_.handle = s;
}
CudaStream::~CudaStream() {
  if (stream_.handle) cudaStreamDestroy(static_cast<cudaStream_t>(stream_.handle));
}

DecodeGraphs::DecodeGraphs(MhaBackend& backend, const ExecutorConfig& config, const std::vector<LayerSpec>& layers,
                           const std::vector<KvCacheView>& kv, Stream stream)
    : backend_(backend), cfg_(config), layers_(layers), kv_(kv), stream_(stream), timer_(config.device, stream) {
  const ModelSpec& m = cfg_.model;
  const Device dev = cfg_.device;
  const int64_t rows = int64_t{cfg_.max_rows} * cfg_.spec_tokens;
  max_pages_ = backend_.max_num_pages();
  seq_lens_buf_ = Buffer::empty({cfg_.max_rows}, DType::int32, dev);
  fill_bytes(seq_lens_buf_.data(), dev, 0, seq_lens_buf_.bytes(), stream_);
  tokens_ = Buffer(static_cast<size_t>(rows) * sizeof(TokenRef), dev);
  for (const CacheGroupSpec& g : m.groups) {
    group_ids_.push_back(g.name);
    tables_.push_back(Buffer::empty({cfg_.max_rows, max_pages_}, DType::int32, dev));
    fill_bytes(tables_.back().data(), dev, 0, tables_.back().bytes(), stream_);
  }
  const int64_t L = m.num_layers;
  q_ = Buffer::empty({L, rows, m.num_q_heads, m.head_dim}, cfg_.q_dtype, dev);
  k_ = Buffer::empty({L, rows, m.num_kv_heads, m.head_dim}, cfg_.q_dtype, dev);
  v_ = Buffer::empty({L, rows, m.num_kv_heads, m.head_dim}, cfg_.q_dtype, dev);
  out_ = Buffer::empty({L, rows, m.num_q_heads, m.head_dim}, cfg_.q_dtype, dev);
  backend_.init_cuda_graph_state(cfg_.max_rows, seq_lens_buf_.view({cfg_.max_rows}, DType::int32), group_ids_);
}

DecodeGraphs::~DecodeGraphs() {
  for (auto& [bs, g] : graphs_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));
}

int DecodeGraphs::bucket(int bs) const {
  int b = 1;
  while (b < bs) b *= 2;
  return std::min(b, cfg_.max_rows);
}

// Layer l's [rows, H, D] view of a [layers, max_bs * N, H, D] buffer.
static TensorView layer_rows(const Buffer& b, int l, int64_t rows, int heads, const ExecutorConfig& c) {
  const int64_t per_layer = int64_t{c.max_rows} * c.spec_tokens * heads * c.model.head_dim;
  return TensorView(static_cast<char*>(b.data()) + l * per_layer * dtype_size(c.q_dtype), c.q_dtype, b.device(),
                    {rows, heads, c.model.head_dim});
}

void DecodeGraphs::capture(int bs) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelSpec& m = cfg_.model;
  const ForwardMode mode = cfg_.spec_tokens > 1 ? ForwardMode::target_verify : ForwardMode::decode;
  const int64_t rows = int64_t{bs} * cfg_.spec_tokens;
  backend_.init_forward_metadata_capture_cuda_graph(bs, mode, group_ids_);
  auto s = static_cast<cudaStream_t>(stream_.handle);
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  // Thread-local: the ranks of a multi-GPU replay capture on their own threads at once.
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  try {
    for (int l = 0; l < m.num_layers; ++l) {
      const TensorView q = layer_rows(q_, l, rows, m.num_q_heads, cfg_);
      const TensorView k = layer_rows(k_, l, rows, m.num_kv_heads, cfg_);
      const TensorView v = layer_rows(v_, l, rows, m.num_kv_heads, cfg_);
      const TensorView out = layer_rows(out_, l, rows, m.num_q_heads, cfg_);
      backend_.forward_decode(q, k, v, layers_[l], kv_[l], TensorView{}, bs, out);
    }
  } catch (...) {
    cudaGraph_t g;
    cudaStreamEndCapture(s, &g);
    if (g) cudaGraphDestroy(g);
    throw;
  }
  cudaGraph_t graph;
  check(cudaStreamEndCapture(s, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec;
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  cudaGraphDestroy(graph);
  graphs_[bs] = exec;
  capture_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double DecodeGraphs::take_capture_seconds() {
  const double s = capture_seconds_;
  capture_seconds_ = 0.0;
  return s;
}

void DecodeGraphs::prepare(const StepPlan& plan, const std::vector<RequestState>& states, PageTableMirror& tables,
                           double* backend_seconds) {
  const ModelSpec& m = cfg_.model;
  const Device dev = cfg_.device;
  const int bs = static_cast<int>(plan.rows.size());
  const int padded = bucket(bs);
  const int N = cfg_.spec_tokens;
  if (!graphs_.count(padded)) capture(padded);
  // Padded rows: seq_len 1, slot 0 (an all-zero table row: page 0), token (0, 0).
  seq_host_.assign(static_cast<size_t>(padded), 1);
  for (int i = 0; i < bs; ++i) seq_host_[i] = plan.rows[i].seq_len;
  copy_bytes(seq_lens_buf_.data(), dev, seq_host_.data(), Device::cpu(), seq_host_.size() * 4, stream_);
  tables.sync(plan, states, padded);
  ForwardBatch fb;
  fb.forward_mode = N > 1 ? ForwardMode::target_verify : ForwardMode::decode;
  fb.batch_size = padded;
  fb.seq_lens = seq_lens_buf_.view({padded}, DType::int32);
  for (size_t g = 0; g < group_ids_.size(); ++g) {
    const TensorView t = tables_[g].view({padded, plan.cols}, DType::int32);
    tables.gather(static_cast<int>(g), fb.seq_lens, t, padded, plan.cols);
    fb.group_tables.push_back({group_ids_[g], t});
  }
  tokens_host_.assign(plan.tokens.begin(), plan.tokens.end());
  tokens_host_.resize(static_cast<size_t>(padded) * N, TokenRef{});
  copy_bytes(tokens_.data(), dev, tokens_host_.data(), Device::cpu(), tokens_host_.size() * sizeof(TokenRef), stream_);
  const int64_t rows = static_cast<int64_t>(tokens_host_.size());
  const int64_t all = int64_t{cfg_.max_rows} * N;
  const auto* tok = static_cast<const TokenRef*>(tokens_.data());
  fill_tokens_layers_cuda(q_.view({m.num_layers, all, m.num_q_heads, m.head_dim}, cfg_.q_dtype), tok, rows, cfg_.seed,
                          TokenTensor::q, stream_, cfg_.q_head_offset);
  fill_tokens_layers_cuda(k_.view({m.num_layers, all, m.num_kv_heads, m.head_dim}, cfg_.q_dtype), tok, rows, cfg_.seed,
                          TokenTensor::k, stream_, cfg_.kv_head_offset);
  fill_tokens_layers_cuda(v_.view({m.num_layers, all, m.num_kv_heads, m.head_dim}, cfg_.q_dtype), tok, rows, cfg_.seed,
                          TokenTensor::v, stream_, cfg_.kv_head_offset);
  const auto t0 = std::chrono::steady_clock::now();
  backend_.init_forward_metadata_replay_cuda_graph(fb);
  *backend_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  prepared_bs_ = padded;
}

double DecodeGraphs::replay(const StepPlan& plan, const std::vector<CapturePoint>& capture,
                            std::vector<std::vector<float>>* captured) {
  auto s = static_cast<cudaStream_t>(stream_.handle);
  timer_.start();
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graphs_.at(prepared_bs_)), s), "cudaGraphLaunch");
  timer_.stop();
  const double seconds = timer_.take_seconds();
  // The step's rows (not the padding) of every layer: combined across ranks when asked.
  const int64_t rows = plan.num_tokens();
  for (int l = 0; l < cfg_.model.num_layers; ++l) {
    const TensorView out = layer_rows(out_, l, rows, cfg_.model.num_q_heads, cfg_);
    capture_rows(cfg_.combine ? cfg_.combine(l, out) : out, capture, l, captured, stream_);
  }
  return seconds;
}

#else  // no CUDA

CudaStream::CudaStream(Device device) {
  if (device.is_cuda()) throw Error("replay: --device cuda: this build has no CUDA support");
}
CudaStream::~CudaStream() = default;
DecodeGraphs::DecodeGraphs(MhaBackend& backend, const ExecutorConfig& config, const std::vector<LayerSpec>&,
                           const std::vector<KvCacheView>&, Stream stream)
    : backend_(backend), cfg_(config), stream_(stream), timer_(config.device, stream) {
  throw Error("replay: CUDA graphs need a CUDA build");
}
DecodeGraphs::~DecodeGraphs() = default;
int DecodeGraphs::bucket(int bs) const { return bs; }
void DecodeGraphs::capture(int) {}
void DecodeGraphs::prepare(const StepPlan&, const std::vector<RequestState>&, PageTableMirror&, double*) {}
double DecodeGraphs::take_capture_seconds() { return 0.0; }
double DecodeGraphs::replay(const StepPlan&, const std::vector<CapturePoint>&, std::vector<std::vector<float>>*) {
  return 0.0;
}

#endif

}  // namespace pagedmha::tools
