// The collectives of a multi-rank replay: on GPUs NCCL (one communicator per rank, one
// CUDA device each, made with ncclCommInitAll); CPU ranks (threads of one process, for the
// tests) exchange through host memory instead. Every rank calls each collective from its
// own thread, in the same order.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pagedmha/tensor.h"

namespace pagedmha::tools {

class Collective {
 public:
  virtual ~Collective() = default;
  /// "NCCL 2.27.3" or "host memory (CPU ranks)".
  virtual std::string name() const = 0;
  virtual int ranks() const = 0;
  /// Element-wise sum of every rank's `send` into every rank's `recv` (contiguous, same
  /// shape; bf16, fp16 or fp32), asynchronous on `stream` (NCCL) or done on return (host).
  virtual void all_reduce_sum(int rank, const TensorView& send, const TensorView& recv, Stream stream) = 0;
  /// For each (send, recv) pair: every rank's contiguous `send` into `recv` (contiguous,
  /// ranks times send's bytes) in rank order, so recv reads as [ranks, *send.shape].
  /// The pairs travel together (one NCCL group).
  virtual void all_gather(int rank, const std::vector<std::pair<TensorView, TensorView>>& pairs, Stream stream) = 0;
  /// Called from a rank that failed: makes the other ranks' pending and later collectives
  /// fail instead of waiting for it (ncclCommAbort; host: wakes the waiters).
  virtual void abort() = 0;
};

/// Host-memory collectives for `ranks` CPU ranks.
std::unique_ptr<Collective> make_host_collective(int ranks);

/// NCCL communicators for ranks 0..ranks-1 on cuda:0..cuda:ranks-1 (ncclCommInitAll).
/// Sets NCCL_NVLS_ENABLE=0 first unless the environment sets it (NVLink multicast stays
/// off). Throws Error naming --gpus in a build without NCCL.
std::unique_ptr<Collective> make_nccl_collective(int ranks);

/// Whether this build links NCCL (CMake PAGEDMHA_WITH_NCCL found it).
bool built_with_nccl();

}  // namespace pagedmha::tools
