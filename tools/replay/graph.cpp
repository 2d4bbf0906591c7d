#include "replay/graph.h"

#include <algorithm>
#include <string>

#include "pagedmha/error.h"
#include "pagedmha/numeric.h"

#if defined(PAGEDMHA_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace pagedmha::tools {

#if defined(PAGEDMHA_WITH_CUDA)
namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("replay: ") + what + ": " + cudaGetErrorString(e));
}
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
  for (int l = 0; l < m.num_layers; ++l) {
    q_.push_back(Buffer::empty({rows, m.num_q_heads, m.head_dim}, cfg_.q_dtype, dev));
    k_.push_back(Buffer::empty({rows, m.num_kv_heads, m.head_dim}, cfg_.q_dtype, dev));
    v_.push_back(Buffer::empty({rows, m.num_kv_heads, m.head_dim}, cfg_.q_dtype, dev));
    out_.push_back(Buffer::empty({rows, m.num_q_heads, m.head_dim}, cfg_.q_dtype, dev));
  }
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

void DecodeGraphs::capture(int bs) {
  const ModelSpec& m = cfg_.model;
  const ForwardMode mode = cfg_.spec_tokens > 1 ? ForwardMode::target_verify : ForwardMode::decode;
  const int64_t rows = int64_t{bs} * cfg_.spec_tokens;
  backend_.init_forward_metadata_capture_cuda_graph(bs, mode, group_ids_);
  auto s = static_cast<cudaStream_t>(stream_.handle);
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  try {
    for (int l = 0; l < m.num_layers; ++l) {
      const TensorView q = q_[l].view({rows, m.num_q_heads, m.head_dim}, cfg_.q_dtype);
      const TensorView k = k_[l].view({rows, m.num_kv_heads, m.head_dim}, cfg_.q_dtype);
      const TensorView v = v_[l].view({rows, m.num_kv_heads, m.head_dim}, cfg_.q_dtype);
      const TensorView out = out_[l].view({rows, m.num_q_heads, m.head_dim}, cfg_.q_dtype);
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
}

void DecodeGraphs::prepare(const StepPlan& plan, const std::vector<TokenRef>& tokens) {
  const ModelSpec& m = cfg_.model;
  const Device dev = cfg_.device;
  const int bs = static_cast<int>(plan.rows.size());
  const int padded = bucket(bs);
  const int N = cfg_.spec_tokens;
  if (!graphs_.count(padded)) capture(padded);
  // Padded rows: seq_len 1, all-zero table rows (page 0), token (0, 0).
  std::vector<int32_t> seq(padded, 1);
  for (int i = 0; i < bs; ++i) seq[i] = plan.rows[i].seq_len;
  copy_bytes(seq_lens_buf_.data(), dev, seq.data(), Device::cpu(), seq.size() * 4, stream_);
  ForwardBatch fb;
  fb.forward_mode = N > 1 ? ForwardMode::target_verify : ForwardMode::decode;
  fb.batch_size = padded;
  fb.seq_lens = seq_lens_buf_.view({padded}, DType::int32);
  std::vector<int32_t> table(static_cast<size_t>(padded) * plan.cols, 0);
  for (size_t g = 0; g < group_ids_.size(); ++g) {
    std::copy(plan.page_tables[g].begin(), plan.page_tables[g].end(), table.begin());
    copy_bytes(tables_[g].data(), dev, table.data(), Device::cpu(), table.size() * 4, stream_);
    fb.group_tables.push_back({group_ids_[g], tables_[g].view({padded, plan.cols}, DType::int32)});
  }
  std::vector<TokenRef> padded_tokens(tokens);
  padded_tokens.resize(static_cast<size_t>(padded) * N, TokenRef{});
  copy_bytes(tokens_.data(), dev, padded_tokens.data(), Device::cpu(), padded_tokens.size() * sizeof(TokenRef), stream_);
  const int64_t rows = static_cast<int64_t>(padded_tokens.size());
  for (int l = 0; l < m.num_layers; ++l) {
    fill_tokens_cuda(q_[l].view({rows, m.num_q_heads, m.head_dim}, cfg_.q_dtype), static_cast<TokenRef*>(tokens_.data()), rows,
                     cfg_.seed, l, TokenTensor::q, stream_);
    fill_tokens_cuda(k_[l].view({rows, m.num_kv_heads, m.head_dim}, cfg_.q_dtype), static_cast<TokenRef*>(tokens_.data()), rows,
                     cfg_.seed, l, TokenTensor::k, stream_);
    fill_tokens_cuda(v_[l].view({rows, m.num_kv_heads, m.head_dim}, cfg_.q_dtype), static_cast<TokenRef*>(tokens_.data()), rows,
                     cfg_.seed, l, TokenTensor::v, stream_);
  }
  backend_.init_forward_metadata_replay_cuda_graph(fb);
  prepared_bs_ = padded;
}

double DecodeGraphs::replay(const StepPlan& plan, const std::vector<CapturePoint>& capture,
                            std::vector<std::vector<float>>* captured) {
  (void)plan;
  auto s = static_cast<cudaStream_t>(stream_.handle);
  timer_.start();
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graphs_.at(prepared_bs_)), s), "cudaGraphLaunch");
  timer_.stop();
  const double seconds = timer_.take_seconds();
  const int64_t row = int64_t{cfg_.model.num_q_heads} * cfg_.model.head_dim;
  std::vector<uint16_t> tmp(row);
  for (size_t i = 0; i < capture.size(); ++i) {
    const CapturePoint& c = capture[i];
    copy_bytes(tmp.data(), Device::cpu(), static_cast<uint16_t*>(out_[c.layer].data()) + c.token_row * row, cfg_.device, row * 2,
               stream_);
    synchronize(stream_);
    std::vector<float> f(row);
    for (int64_t j = 0; j < row; ++j)
      f[j] = cfg_.q_dtype == DType::bf16 ? bf16_to_float(tmp[j]) : fp16_to_float(tmp[j]);
    (*captured)[i] = std::move(f);
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
void DecodeGraphs::prepare(const StepPlan&, const std::vector<TokenRef>&) {}
double DecodeGraphs::replay(const StepPlan&, const std::vector<CapturePoint>&, std::vector<std::vector<float>>*) {
  return 0.0;
}

#endif

}  // namespace pagedmha::tools
