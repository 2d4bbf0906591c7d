// The narrow interface between the replay's scheduler and whatever runs attention:
// one call per step, all layers, KV writes included.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pagedmha/tensor.h"
#include "replay/model.h"
#include "replay/scheduler.h"
#include "replay/token_data.h"

namespace pagedmha::tools {

struct ExecutorConfig {
  ModelSpec model;
  Device device = Device::cpu();
  DType kv_dtype = DType::bf16;
  DType q_dtype = DType::bf16;  // also the output dtype
  int page_size = 16;
  int64_t num_pages = 0;        // per cache group, including page 0
  int context_len = 0;          // longest KV length of any request, tokens
  int max_tokens = 8192;        // query tokens per step (the token budget)
  int max_rows = 256;           // rows per step
  int spec_tokens = 1;          // queries per decode row
  float k_scale = 1.0f;         // fp8 KV: stored = x / scale
  float v_scale = 1.0f;
  uint64_t seed = 0;
  bool cuda_graphs = true;      // decode steps through CUDA graphs (GPU)
  /// A tensor-parallel rank: model.num_q_heads / num_kv_heads are its heads, the model's
  /// heads from these offsets on (token data and sinks follow the whole model's heads).
  int q_head_offset = 0, kv_head_offset = 0;
  /// A tensor-parallel rank: called after each layer's attention, in layer order (after a
  /// decode step's graph replay: for every layer), with the layer's output [T, Hq, D] on
  /// the executor's stream, outside the attention timer. Returns the tensor whose rows the
  /// capture points read (the ranks' combined output). Empty: they read the output itself.
  std::function<TensorView(int layer, const TensorView& out)> combine;
};

/// Device seconds of one rank in the last step: its attention (K/V writes included) and
/// the combination of the ranks' outputs (collective, and for DCP the merge).
struct RankTimes {
  double attention_s = 0.0;
  double combine_s = 0.0;
};

/// Host seconds of one step outside the timed attention (since the last take).
struct StepHostTimes {
  double metadata_s = 0.0;  // the backend: init_forward_metadata / _replay_cuda_graph
  double prepare_s = 0.0;   // the tool: lengths, page-table sync and gather, token data
  double capture_s = 0.0;   // one-off CUDA-graph capture and instantiation
};

/// Output row `token_row` (index into the step's query tokens) of layer `layer`.
struct CapturePoint {
  int64_t token_row = 0;
  int layer = 0;
};

class AttentionExecutor {
 public:
  virtual ~AttentionExecutor() = default;
  virtual std::string name() const = 0;
  /// Runs every layer of `plan`: generates the new tokens' q/k/v (untimed), writes
  /// K/V into the layer's paged cache and attends (timed). Returns the timed seconds.
  /// For each capture point, appends the fp32 output row [Hq * D] to `captured`.
  /// `states`: the scheduler's request states (their pages feed the page tables).
  virtual double run_step(const StepPlan& plan, const std::vector<RequestState>& states,
                          const std::vector<CapturePoint>& capture, std::vector<std::vector<float>>* captured) = 0;
  /// Host times since the last call (StepHostTimes).
  virtual StepHostTimes take_host_times() = 0;
  /// Ranks whose rows `captured` holds: capture.size() rows per rank, rank after rank.
  virtual int ranks() const { return 1; }
  /// The stream the executor issues its device work on (null on the CPU).
  virtual Stream stream() const { return {}; }
  /// Per-rank times of the last step (multi-rank executors and their ranks; empty otherwise).
  virtual std::vector<RankTimes> take_rank_times() { return {}; }
};

/// Appends nothing; sets (*captured)[i] to the fp32 row [H * D] of `out` ([T, H, D], bf16 or
/// fp16, any device) at capture[i].token_row for every capture point of `layer`.
void capture_rows(const TensorView& out, const std::vector<CapturePoint>& capture, int layer,
                  std::vector<std::vector<float>>* captured, Stream stream);

/// Serves the steps through MhaBackend (registry name "pagedmha"): init_forward_metadata,
/// then per layer forward_extend (extend / mixed steps) or forward_decode (decode and
/// verify steps), which write K/V and attend. On CUDA, decode steps replay CUDA graphs
/// captured per padded batch size (config.cuda_graphs).
std::unique_ptr<AttentionExecutor> make_backend_executor(const ExecutorConfig& config);

/// Runs nothing (replay --dry-run): the scheduler's work, bytes, flops and roofline floor
/// of a trace without a device; every step's attention time is 0.
std::unique_ptr<AttentionExecutor> make_dry_run_executor();

}  // namespace pagedmha::tools
