// CUDA-graph decode steps of the replay: one graph per padded batch size holding every
// layer's forward_decode, replayed after the backend's replay preparation.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "pagedmha/backend.h"
#include "replay/executor.h"
#include "replay/page_table_mirror.h"
#include "replay/timer.h"

namespace pagedmha::tools {

/// A created CUDA stream (graphs cannot capture the legacy default stream); a null
/// handle on the CPU.
class CudaStream {
 public:
  explicit CudaStream(Device device);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  Stream get() const { return stream_; }

 private:
  Stream stream_{};
};

class DecodeGraphs {
 public:
  /// Sets up the backend's graph state for config.max_rows requests. Throws Error in
  /// builds without CUDA.
  DecodeGraphs(MhaBackend& backend, const ExecutorConfig& config, const std::vector<LayerSpec>& layers,
               const std::vector<KvCacheView>& kv, Stream stream);
  ~DecodeGraphs();

  /// Untimed: pads the step to a captured batch size (capturing it on first use, see
  /// take_capture_seconds), fills the lengths, gathers the step's tables from `tables`
  /// (synced here), generates every layer's q/k/v (three launches) and runs
  /// init_forward_metadata_replay_cuda_graph, whose host seconds go to *backend_seconds.
  void prepare(const StepPlan& plan, const std::vector<RequestState>& states, PageTableMirror& tables,
               double* backend_seconds);
  /// Host seconds spent capturing and instantiating graphs since the last call.
  double take_capture_seconds();
  /// Replays the prepared graph; returns its device seconds.
  double replay(const StepPlan& plan, const std::vector<CapturePoint>& capture,
                std::vector<std::vector<float>>* captured);

 private:
  int bucket(int bs) const;
  void capture(int bs);

  MhaBackend& backend_;
  ExecutorConfig cfg_;
  std::vector<LayerSpec> layers_;
  std::vector<KvCacheView> kv_;
  Stream stream_;
  IntervalTimer timer_;
  std::vector<std::string> group_ids_;
  int max_pages_ = 0;
  Buffer seq_lens_buf_, tokens_;
  std::vector<Buffer> tables_;                // per group [max_bs, max_pages]
  Buffer q_, k_, v_, out_;                    // [layers, max_bs * N, H, D]
  std::map<int, void*> graphs_;               // bs -> cudaGraphExec_t
  int prepared_bs_ = 0;
  double capture_seconds_ = 0.0;
  std::vector<int32_t> seq_host_;
  std::vector<TokenRef> tokens_host_;
};

}  // namespace pagedmha::tools
