// Summed device time of many intervals: a host steady clock for CPU work (CPU ops
// finish before returning), CUDA events on the stream for GPU work.
#pragma once

#include <chrono>
#include <vector>

#include "pagedmha/tensor.h"

namespace pagedmha::tools {

class IntervalTimer {
 public:
  IntervalTimer(Device device, Stream stream);
  ~IntervalTimer();
  IntervalTimer(const IntervalTimer&) = delete;
  IntervalTimer& operator=(const IntervalTimer&) = delete;

  void start();
  void stop();
  /// Total seconds of the intervals since the last call (waits for the stream on CUDA).
  double take_seconds();

 private:
  Device device_;
  Stream stream_;
  std::chrono::steady_clock::time_point t0_{};
  double host_seconds_ = 0.0;
  std::vector<void*> events_;  // cudaEvent_t, start/stop pairs
  size_t used_ = 0;
};

}  // namespace pagedmha::tools
