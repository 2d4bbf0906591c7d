#include "replay/ranked_executor.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#include "replay/device_info.h"
#include "replay/timer.h"

#if defined(PAGEDMHA_WITH_CUDA)
#include "replay/cuda_check.h"
#endif

namespace pagedmha::tools {
namespace {

// One persistent host thread per rank; run() hands every thread the same job and waits.
// A rank that throws aborts the collective (so the others do not wait for it forever);
// run() rethrows the first failure.
class RankThreads {
 public:
  RankThreads(int n, std::function<void(int)> on_start, std::function<void()> on_error)
      : on_start_(std::move(on_start)), on_error_(std::move(on_error)) {
    for (int r = 0; r < n; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      ++generation_;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  void run(const std::function<void(int)>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      pending_ = static_cast<int>(threads_.size());
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    std::exception_ptr error;
    {
      std::unique_lock<std::mutex> lock(mu_);
      done_.wait(lock, [&] { return pending_ == 0; });
      error = error_;
      job_ = nullptr;
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  void loop(int rank) {
    int64_t seen = 0;
    bool started = false;
    for (;;) {
      const std::function<void(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) return;
        job = job_;
      }
      try {
        if (!started) on_start_(rank);
        started = true;
        (*job)(rank);
      } catch (...) {
        bool first = false;
        {
          std::lock_guard<std::mutex> lock(mu_);
          first = !error_;
          if (first) error_ = std::current_exception();
        }
        if (first) on_error_();
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_.notify_all();
    }
  }

  std::function<void(int)> on_start_;
  std::function<void()> on_error_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_;
  const std::function<void(int)>* job_ = nullptr;
  int64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// dst [T, H, D] (contiguous) heads [first, first + h) = src [T, h, D] (contiguous).
void copy_heads(const TensorView& dst, int first, const TensorView& src, Stream stream) {
  const size_t row = static_cast<size_t>(src.size(1) * src.size(2)) * src.element_size();
  const size_t pitch = static_cast<size_t>(dst.size(1) * dst.size(2)) * dst.element_size();
  const size_t offset = static_cast<size_t>(first) * dst.size(2) * dst.element_size();
  const int64_t T = src.size(0);
  if (dst.device.is_cpu()) {
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(static_cast<char*>(dst.data) + t * pitch + offset, static_cast<const char*>(src.data) + t * row, row);
    return;
  }
#if defined(PAGEDMHA_WITH_CUDA)
  check_cuda(cudaMemcpy2DAsync(static_cast<char*>(dst.data) + offset, pitch, src.data, row, row, static_cast<size_t>(T),
                               cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream.handle)),
             "replay", "cudaMemcpy2DAsync");
#else
  (void)stream;
#endif
}

// A tensor-parallel rank: the backend executor on its heads, its outputs all-reduced.
class TpRank final : public AttentionExecutor {
 public:
  TpRank(const ExecutorConfig& whole, const TpShard& shard, int rank, Collective& collective, Device device)
      : shard_(shard), rank_(rank), collective_(collective) {
    ExecutorConfig c = whole;
    c.device = device;
    c.model.num_q_heads = shard.q_heads;
    c.model.num_kv_heads = shard.kv_heads;
    c.q_head_offset = shard.q_begin;
    c.kv_head_offset = shard.kv_begin;
    c.combine = [this](int layer, const TensorView& out) { return combine(layer, out); };
    exec_ = make_backend_executor(c);
    const int64_t T = std::max(c.max_tokens, c.max_rows * c.spec_tokens);
    send_ = Buffer::empty({T, whole.model.num_q_heads, whole.model.head_dim}, c.q_dtype, device);
    recv_ = Buffer::empty({T, whole.model.num_q_heads, whole.model.head_dim}, c.q_dtype, device);
    fill_bytes(send_.data(), device, 0, send_.bytes(), exec_->stream());  // the other ranks' heads stay 0
    timer_ = std::make_unique<IntervalTimer>(device, exec_->stream());
    full_heads_ = whole.model.num_q_heads;
    head_dim_ = whole.model.head_dim;
    dtype_ = c.q_dtype;
  }
  std::string name() const override { return exec_->name(); }
  Stream stream() const override { return exec_->stream(); }
  StepHostTimes take_host_times() override { return exec_->take_host_times(); }
  double run_step(const StepPlan& plan, const std::vector<RequestState>& states,
                  const std::vector<CapturePoint>& capture, std::vector<std::vector<float>>* captured) override {
    attention_s_ = exec_->run_step(plan, states, capture, captured);
    return attention_s_;
  }
  std::vector<RankTimes> take_rank_times() override { return {{attention_s_, timer_->take_seconds()}}; }

 private:
  TensorView combine(int, const TensorView& out) {
    const int64_t T = out.size(0);
    const TensorView send = send_.view({T, full_heads_, head_dim_}, dtype_);
    const TensorView recv = recv_.view({T, full_heads_, head_dim_}, dtype_);
    timer_->start();
    copy_heads(send, shard_.q_begin, out, exec_->stream());
    collective_.all_reduce_sum(rank_, send, recv, exec_->stream());
    timer_->stop();
    return recv;
  }

  TpShard shard_;
  int rank_;
  Collective& collective_;
  std::unique_ptr<AttentionExecutor> exec_;
  Buffer send_, recv_;
  std::unique_ptr<IntervalTimer> timer_;
  int64_t full_heads_ = 0, head_dim_ = 0;
  DType dtype_ = DType::bf16;
  double attention_s_ = 0.0;
};

class RankedExecutor final : public AttentionExecutor {
 public:
  RankedExecutor(const ExecutorConfig& base, const RankSetup& setup) : setup_(setup) {
    const int n = setup.ranks;
    if (base.device.is_cuda()) {
      check_rank_devices(n);
      collective_ = make_nccl_collective(n);
    } else {
      collective_ = make_host_collective(n);
    }
    const bool cuda = base.device.is_cuda();
    threads_ = std::make_unique<RankThreads>(
        n, [cuda](int r) { set_thread_device(cuda ? Device::cuda(r) : Device::cpu()); },
        [this] { collective_->abort(); });
    ranks_.resize(n);
    threads_->run([&](int r) {
      ExecutorConfig c = base;
      c.device = cuda ? Device::cuda(r) : Device::cpu();
      if (setup.mode == RankMode::tp) {
        const TpShard s = tp_shard(base.model.num_q_heads, base.model.num_kv_heads, n, r);
        ranks_[r] = std::make_unique<TpRank>(base, s, r, *collective_, c.device);
      } else {
        ranks_[r] = make_dcp_rank_executor(c, r, n, *collective_);
      }
    });
    const TpShard s0 = setup.mode == RankMode::tp ? tp_shard(base.model.num_q_heads, base.model.num_kv_heads, n, 0)
                                                  : TpShard{0, base.model.num_q_heads, 0, base.model.num_kv_heads};
    name_ = std::to_string(n) + (n == 1 ? " rank, " : " ranks, ") +
            (setup.mode == RankMode::tp ? "TP " + std::to_string(n) + " (Hq " + std::to_string(s0.q_heads) +
                                              ", Hkv " + std::to_string(s0.kv_heads) + " per rank), all-reduce"
                                        : "DCP " + std::to_string(n) + " (KV pages round-robin), all-gather + merge") +
            " through " + collective_->name() + " on " +
            (cuda ? (n == 1 ? std::string("cuda:0") : "cuda:0..cuda:" + std::to_string(n - 1))
                  : std::string("cpu threads")) +
            "; rank 0: " + ranks_[0]->name();
  }
  ~RankedExecutor() override {
    // Each rank's buffers and streams go on its own thread, before the communicators.
    try {
      threads_->run([&](int r) { ranks_[r].reset(); });
    } catch (...) {
    }
    threads_.reset();
    collective_.reset();
  }

  std::string name() const override { return name_; }
  int ranks() const override { return setup_.ranks; }
  StepHostTimes take_host_times() override {
    StepHostTimes t = host_;
    host_ = {};
    return t;
  }
  std::vector<RankTimes> take_rank_times() override { return std::move(times_); }

  double run_step(const StepPlan& plan, const std::vector<RequestState>& states,
                  const std::vector<CapturePoint>& capture, std::vector<std::vector<float>>* captured) override {
    const int n = setup_.ranks;
    std::vector<std::vector<std::vector<float>>> rows(n);
    std::vector<RankTimes> times(n);
    std::vector<StepHostTimes> host(n);
    threads_->run([&](int r) {
      times[r].attention_s = ranks_[r]->run_step(plan, states, capture, &rows[r]);
      const std::vector<RankTimes> t = ranks_[r]->take_rank_times();
      if (!t.empty()) times[r].combine_s = t[0].combine_s;
      host[r] = ranks_[r]->take_host_times();
    });
    captured->clear();
    // The host work of a step is done by every rank at once: the slowest rank's counts.
    StepHostTimes slowest_host;
    for (int r = 0; r < n; ++r) {
      rows[r].resize(capture.size());
      for (std::vector<float>& row : rows[r]) captured->push_back(std::move(row));
      slowest_host.metadata_s = std::max(slowest_host.metadata_s, host[r].metadata_s);
      slowest_host.prepare_s = std::max(slowest_host.prepare_s, host[r].prepare_s);
      slowest_host.capture_s = std::max(slowest_host.capture_s, host[r].capture_s);
    }
    host_.metadata_s += slowest_host.metadata_s;
    host_.prepare_s += slowest_host.prepare_s;
    host_.capture_s += slowest_host.capture_s;
    double slowest = 0.0;
    for (const RankTimes& t : times) slowest = std::max(slowest, t.attention_s);
    times_ = std::move(times);
    return slowest;
  }

 private:
  RankSetup setup_;
  std::unique_ptr<Collective> collective_;
  std::unique_ptr<RankThreads> threads_;
  std::vector<std::unique_ptr<AttentionExecutor>> ranks_;
  std::vector<RankTimes> times_;
  StepHostTimes host_;
  std::string name_;
};

}  // namespace

void check_rank_devices(int ranks) {
  if (!built_with_nccl()) make_nccl_collective(ranks);  // throws: names --gpus and why
  const int visible = cuda_device_count();
  if (ranks > visible)
    throw_invalid_argument("replay", "--gpus",
                           "at most the " + std::to_string(visible) + " visible CUDA device(s) (one per rank)",
                           std::to_string(ranks));
}

std::unique_ptr<AttentionExecutor> make_ranked_executor(const ExecutorConfig& base, const RankSetup& setup) {
  return std::make_unique<RankedExecutor>(base, setup);
}

}  // namespace pagedmha::tools
