// Host-memory collectives of CPU ranks (a stand-in for NCCL so the multi-rank replay runs
// in the CPU tests; GPU ranks use NCCL only, collective_nccl.cpp).
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>

#include "pagedmha/error.h"
#include "pagedmha/numeric.h"
#include "replay/collective.h"

namespace pagedmha::tools {
namespace {

class HostCollective final : public Collective {
 public:
  explicit HostCollective(int ranks) : ranks_(ranks), sends_(ranks) {}
  std::string name() const override { return "host memory (CPU ranks)"; }
  int ranks() const override { return ranks_; }

  void all_reduce_sum(int rank, const TensorView& send, const TensorView& recv, Stream) override {
    check_host(send, "send"), check_host(recv, "recv");
    sends_[rank] = {send};
    barrier();  // every rank's send is posted
    const int64_t n = recv.numel();
    for (int64_t i = 0; i < n; ++i) {
      float sum = 0.0f;
      for (int r = 0; r < ranks_; ++r) sum += load(sends_[r][0], i);
      store(recv, i, sum);
    }
    barrier();  // nobody reuses its send while another rank still reads it
  }

  void all_gather(int rank, const std::vector<std::pair<TensorView, TensorView>>& pairs, Stream) override {
    std::vector<TensorView> mine;
    for (const auto& [send, recv] : pairs) {
      check_host(send, "send"), check_host(recv, "recv");
      mine.push_back(send);
    }
    sends_[rank] = mine;
    barrier();
    for (size_t k = 0; k < pairs.size(); ++k) {
      const size_t bytes = static_cast<size_t>(pairs[k].first.numel()) * pairs[k].first.element_size();
      for (int r = 0; r < ranks_; ++r)
        if (bytes) std::memcpy(static_cast<char*>(pairs[k].second.data) + r * bytes, sends_[r][k].data, bytes);
    }
    barrier();
  }

  void abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  static void check_host(const TensorView& t, const char* what) {
    if (!t.device.is_cpu() || !t.is_contiguous())
      throw Error(std::string("replay: internal: host collective ") + what + " is not a contiguous host tensor");
  }
  static float load(const TensorView& t, int64_t i) {
    switch (t.dtype) {
      case DType::bf16: return bf16_to_float(t.ptr<uint16_t>()[i]);
      case DType::fp16: return fp16_to_float(t.ptr<uint16_t>()[i]);
      default: return t.ptr<float>()[i];
    }
  }
  static void store(const TensorView& t, int64_t i, float x) {
    switch (t.dtype) {
      case DType::bf16: t.ptr<uint16_t>()[i] = float_to_bf16(x); break;
      case DType::fp16: t.ptr<uint16_t>()[i] = float_to_fp16(x); break;
      default: t.ptr<float>()[i] = x;
    }
  }
  void barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t gen = generation_;
    if (++arrived_ == ranks_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    }
    if (aborted_) throw Error("replay: another rank failed; this rank's collective was abandoned");
  }

  int ranks_;
  std::vector<std::vector<TensorView>> sends_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  bool aborted_ = false;
};

}  // namespace

std::unique_ptr<Collective> make_host_collective(int ranks) { return std::make_unique<HostCollective>(ranks); }

}  // namespace pagedmha::tools
