// Multi-rank replay (`--gpus N` with `--tp N` or `--dcp N`): one process, one host thread
// and one device per rank, the scheduler's step shared by every rank.
//
// TP: rank r's MhaBackend serves its query heads (Hq / N) and KV heads (Hkv / N, or the
// one it needs when Hkv < N) on cuda:r; after each layer the ranks' outputs are combined
// with an NCCL all-reduce (sum) of [T, Hq * D] buffers in which each rank wrote its own
// heads and zeros elsewhere. That is the collective an engine runs after its row-parallel
// o_proj, of the same size when the hidden size is Hq * D (llama3), and its sum is the
// full attention output (x + 0 is exact), which every rank then checks.
//
// DCP: every rank serves all heads over its share of each request's KV (DcpLayout: whole
// pages round-robin) in full-attention layers; see make_dcp_rank_executor.
#pragma once

#include <memory>

#include "replay/collective.h"
#include "replay/executor.h"
#include "replay/ranks.h"

namespace pagedmha::tools {

/// `base`: the whole model's geometry and the per-rank sizes (num_pages per rank). On
/// `base.device` CUDA the ranks use cuda:0..N-1 and NCCL; on the CPU N threads share the
/// host and exchange through host memory (for the tests). Errors name --gpus: no NCCL in
/// this build, fewer visible devices than ranks. run_step returns the slowest rank's
/// attention seconds; take_rank_times gives every rank's; `captured` holds every rank's
/// rows (ranks()).
std::unique_ptr<AttentionExecutor> make_ranked_executor(const ExecutorConfig& base, const RankSetup& setup);

/// GPU ranks can run: this build has NCCL and `ranks` CUDA devices are visible. Throws
/// Error naming --gpus otherwise.
void check_rank_devices(int ranks);

/// Rank `rank` of `ranks` decode-context-parallel ranks (called on the rank's thread,
/// `config.device` its device; config.num_pages is its own pool, page 0 included).
/// Full-attention layers: K/V of the positions DcpLayout gives this rank are written to
/// its cache; decode and verify steps attend one row per query over the rank's keys up to
/// that query (batch_decode with lse); extend and mixed steps attend the cached prefix the
/// rank holds (non-causal batch_prefill with lse) and, on rank 0 only, the step's new
/// tokens among themselves (causal batch_prefill over a scratch cache, merged in); then
/// (o, lse) are all-gathered and merged with merge_attention_states, which adds the sinks
/// once. Sliding-window layers are not split: every rank holds their (window-bounded) KV
/// whole and attends it alone. Runs eagerly (no CUDA graphs).
std::unique_ptr<AttentionExecutor> make_dcp_rank_executor(const ExecutorConfig& config, int rank, int ranks,
                                                          Collective& collective);

}  // namespace pagedmha::tools
