#include "replay/executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>

#include "pagedmha/backend.h"
#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#include "pagedmha/numeric.h"
#include "pagedmha/registry.h"
#include "replay/datagen.h"
#include "replay/graph.h"
#include "replay/page_table_mirror.h"
#include "replay/timer.h"

namespace pagedmha::tools {

namespace {

double host_seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

float to_float(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::fp16: return fp16_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

class BackendExecutor final : public AttentionExecutor {
 public:
  explicit BackendExecutor(const ExecutorConfig& c)
      : cfg_(c), dev_(c.device), owned_stream_(c.device), stream_(owned_stream_.get()), timer_(c.device, stream_) {
    const ModelSpec& m = cfg_.model;
    BackendConfig bc;
    bc.page_size = cfg_.page_size;
    bc.context_len = std::max(cfg_.context_len, cfg_.spec_tokens);
    bc.kv_cache_dtype = cfg_.kv_dtype;
    bc.out_dtype = cfg_.q_dtype;
    bc.max_bs = cfg_.max_rows;
    bc.device = dev_;
    bc.spec_num_tokens = cfg_.spec_tokens;
    bc.num_q_heads = m.num_q_heads, bc.num_kv_heads = m.num_kv_heads, bc.head_dim = m.head_dim;
    bc.stream = stream_;
    backend_ = create_backend("pagedmha", bc);

    for (int l = 0; l < m.num_layers; ++l) {
      LayerSpec spec;
      spec.layer_id = l;
      spec.num_q_heads = m.num_q_heads;
      spec.num_kv_heads = m.num_kv_heads;
      spec.head_dim = m.head_dim;
      spec.scaling = 1.0f / std::sqrt(static_cast<float>(m.head_dim));
      spec.window_left = m.window_left(l);
      spec.k_scale = cfg_.k_scale;
      spec.v_scale = cfg_.v_scale;
      spec.group_id = m.groups[m.layer_group[l]].name;
      if (m.sinks) {
        std::vector<float> host(m.num_q_heads);
        for (int h = 0; h < m.num_q_heads; ++h) host[h] = sink_value(cfg_.seed, l, cfg_.q_head_offset + h);
        sinks_.emplace_back(host.size() * 4, dev_);
        copy_bytes(sinks_.back().data(), dev_, host.data(), Device::cpu(), host.size() * 4, stream_);
        spec.sinks = sinks_.back().view({m.num_q_heads}, DType::fp32);
      }
      layers_.push_back(spec);
      // Sized through Buffer::empty: its 64-bit product is checked before any allocation.
      for (std::vector<Buffer>* pool : {&k_cache_, &v_cache_}) {
        pool->push_back(Buffer::empty({cfg_.num_pages, cfg_.page_size, m.num_kv_heads, m.head_dim}, cfg_.kv_dtype, dev_));
      }
      const size_t kv_bytes = k_cache_.back().bytes();
      // Page 0 (and every unwritten slot) reads as zero.
      fill_bytes(k_cache_.back().data(), dev_, 0, kv_bytes, stream_);
      fill_bytes(v_cache_.back().data(), dev_, 0, kv_bytes, stream_);
    }
    const int64_t T = cfg_.max_tokens;
    q_ = Buffer::empty({T, m.num_q_heads, m.head_dim}, cfg_.q_dtype, dev_);
    k_ = Buffer::empty({T, m.num_kv_heads, m.head_dim}, cfg_.q_dtype, dev_);
    v_ = Buffer::empty({T, m.num_kv_heads, m.head_dim}, cfg_.q_dtype, dev_);
    out_ = Buffer::empty({T, m.num_q_heads, m.head_dim}, cfg_.q_dtype, dev_);
    seq_lens_ = Buffer::empty({cfg_.max_rows}, DType::int32, dev_);
    if (dev_.is_cuda()) tokens_dev_ = Buffer(static_cast<size_t>(T) * sizeof(TokenRef), dev_);
    for (size_t g = 0; g < m.groups.size(); ++g)
      tables_.push_back(Buffer::empty({cfg_.max_rows, backend_->max_num_pages()}, DType::int32, dev_));
    mirror_ = std::make_unique<PageTableMirror>(dev_, static_cast<int>(m.groups.size()), cfg_.max_rows,
                                                backend_->max_num_pages(), cfg_.page_size, stream_);
    if (dev_.is_cuda() && cfg_.cuda_graphs) {
      std::vector<KvCacheView> kv;
      for (int l = 0; l < m.num_layers; ++l) kv.push_back({cache_view(k_cache_[l]), cache_view(v_cache_[l])});
      graphs_ = std::make_unique<DecodeGraphs>(*backend_, cfg_, layers_, kv, stream_);
    }
  }

  std::string name() const override {
    return std::string("MhaBackend(pagedmha) on ") + dev_.str() +
           (graphs_ ? ", CUDA graphs for decode steps" : "");
  }
  Stream stream() const override { return stream_; }

  StepHostTimes take_host_times() override {
    StepHostTimes t = times_;
    if (graphs_) t.capture_s = graphs_->take_capture_seconds();
    t.prepare_s -= t.capture_s + t.metadata_s;  // prepare_s was measured around all three
    times_ = {};
    return t;
  }

  double run_step(const StepPlan& plan, const std::vector<RequestState>& states,
                  const std::vector<CapturePoint>& capture, std::vector<std::vector<float>>* captured) override {
    const auto t0 = std::chrono::steady_clock::now();
    const ModelSpec& m = cfg_.model;
    const int bs = static_cast<int>(plan.rows.size());
    const std::vector<TokenRef>& tokens = plan.tokens;
    const int64_t T = static_cast<int64_t>(tokens.size());
    if (T > cfg_.max_tokens || bs > cfg_.max_rows)
      throw Error("replay: internal: step of " + std::to_string(T) + " tokens / " + std::to_string(bs) +
                  " rows exceeds the executor's buffers");
    const bool extend = plan.num_extend > 0;
    if (captured) captured->assign(capture.size(), {});
    if (!extend && graphs_) {
      graphs_->prepare(plan, states, *mirror_, &times_.metadata_s);
      times_.prepare_s += host_seconds_since(t0);
      return graphs_->replay(plan, capture, captured);
    }

    // The step's lengths (host and device) and the tables gathered from the mirror.
    std::vector<int32_t>& seq = seq_host_;
    std::vector<int32_t>& ext = ext_host_;
    std::vector<int32_t>& prefix = prefix_host_;
    seq.resize(bs), ext.resize(bs), prefix.resize(bs);
    for (int i = 0; i < bs; ++i) {
      seq[i] = plan.rows[i].seq_len;
      ext[i] = plan.rows[i].q_len;
      prefix[i] = plan.rows[i].prefix_len;
    }
    copy_bytes(seq_lens_.data(), dev_, seq.data(), Device::cpu(), seq.size() * 4, stream_);
    mirror_->sync(plan, states, bs);
    ForwardBatch fb;
    fb.forward_mode = extend ? (plan.num_decode() > 0 ? ForwardMode::mixed : ForwardMode::extend)
                             : (cfg_.spec_tokens > 1 ? ForwardMode::target_verify : ForwardMode::decode);
    fb.batch_size = bs;
    fb.seq_lens = seq_lens_.view({bs}, DType::int32);
    fb.seq_lens_cpu = TensorView(seq.data(), DType::int32, Device::cpu(), {bs});
    fb.extend_seq_lens_cpu = TensorView(ext.data(), DType::int32, Device::cpu(), {bs});
    fb.extend_prefix_lens_cpu = TensorView(prefix.data(), DType::int32, Device::cpu(), {bs});
    for (size_t g = 0; g < m.groups.size(); ++g) {
      const TensorView t = tables_[g].view({bs, plan.cols}, DType::int32);
      mirror_->gather(static_cast<int>(g), fb.seq_lens, t, bs, plan.cols);
      fb.group_tables.push_back({m.groups[g].name, t});
    }
    if (dev_.is_cuda()) copy_bytes(tokens_dev_.data(), dev_, tokens.data(), Device::cpu(), T * sizeof(TokenRef), stream_);

    const auto t1 = std::chrono::steady_clock::now();
    backend_->init_forward_metadata(fb);
    times_.metadata_s += host_seconds_since(t1);
    times_.prepare_s += host_seconds_since(t0);  // the backend's share is taken out in take_host_times

    const TensorView q = q_.view({T, m.num_q_heads, m.head_dim}, cfg_.q_dtype);
    const TensorView k = k_.view({T, m.num_kv_heads, m.head_dim}, cfg_.q_dtype);
    const TensorView v = v_.view({T, m.num_kv_heads, m.head_dim}, cfg_.q_dtype);
    const TensorView out = out_.view({T, m.num_q_heads, m.head_dim}, cfg_.q_dtype);
    const TensorView unused_loc;  // the backend computes each group's write slots
    for (int l = 0; l < m.num_layers; ++l) {
      generate(q, tokens, l, TokenTensor::q);
      generate(k, tokens, l, TokenTensor::k);
      generate(v, tokens, l, TokenTensor::v);
      const KvCacheView kv{cache_view(k_cache_[l]), cache_view(v_cache_[l])};
      timer_.start();
      if (extend) backend_->forward_extend(q, k, v, layers_[l], kv, unused_loc, bs, out);
      else backend_->forward_decode(q, k, v, layers_[l], kv, unused_loc, bs, out);
      timer_.stop();
      capture_rows(cfg_.combine ? cfg_.combine(l, out) : out, capture, l, captured, stream_);
    }
    return timer_.take_seconds();
  }

 private:
  TensorView cache_view(const Buffer& b) const {
    return b.view({cfg_.num_pages * cfg_.page_size, cfg_.model.num_kv_heads, cfg_.model.head_dim}, cfg_.kv_dtype);
  }

  void generate(const TensorView& t, const std::vector<TokenRef>& tokens, int layer, TokenTensor which) {
    const int64_t T = static_cast<int64_t>(tokens.size());
    const int offset = which == TokenTensor::q ? cfg_.q_head_offset : cfg_.kv_head_offset;
    if (dev_.is_cpu()) fill_tokens_host(t, tokens.data(), T, cfg_.seed, layer, which, offset);
    else fill_tokens_cuda(t, static_cast<TokenRef*>(tokens_dev_.data()), T, cfg_.seed, layer, which, stream_, offset);
  }

  ExecutorConfig cfg_;
  Device dev_;
  CudaStream owned_stream_;
  Stream stream_;
  IntervalTimer timer_;
  std::unique_ptr<MhaBackend> backend_;
  std::vector<LayerSpec> layers_;
  std::vector<Buffer> sinks_, k_cache_, v_cache_, tables_;
  Buffer q_, k_, v_, out_, seq_lens_, tokens_dev_;
  std::unique_ptr<DecodeGraphs> graphs_;
  std::unique_ptr<PageTableMirror> mirror_;
  std::vector<int32_t> seq_host_, ext_host_, prefix_host_;
  StepHostTimes times_;
};

class DryRunExecutor final : public AttentionExecutor {
 public:
  std::string name() const override { return "none (--dry-run)"; }
  double run_step(const StepPlan&, const std::vector<RequestState>&, const std::vector<CapturePoint>&,
                  std::vector<std::vector<float>>*) override {
    return 0.0;
  }
  StepHostTimes take_host_times() override { return {}; }
};

}  // namespace

void capture_rows(const TensorView& out, const std::vector<CapturePoint>& capture, int layer,
                  std::vector<std::vector<float>>* captured, Stream stream) {
  const int64_t row = out.size(1) * out.size(2);
  std::vector<uint16_t> tmp(row);
  for (size_t i = 0; i < capture.size(); ++i) {
    const CapturePoint& c = capture[i];
    if (c.layer != layer) continue;
    copy_bytes(tmp.data(), Device::cpu(), out.ptr<uint16_t>() + c.token_row * out.stride(0), out.device, row * 2,
               stream);
    synchronize(stream);
    std::vector<float> f(row);
    for (int64_t j = 0; j < row; ++j) f[j] = to_float(tmp.data(), out.dtype, j);
    (*captured)[i] = std::move(f);
  }
}

std::unique_ptr<AttentionExecutor> make_dry_run_executor() { return std::make_unique<DryRunExecutor>(); }

std::unique_ptr<AttentionExecutor> make_backend_executor(const ExecutorConfig& config) {
  return std::make_unique<BackendExecutor>(config);
}

}  // namespace pagedmha::tools
