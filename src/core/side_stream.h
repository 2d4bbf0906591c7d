// A second stream that forks from and joins back into a caller's stream through events,
// so two independent kernels of one step can run side by side. Event record / wait is
// legal under CUDA-graph capture: a captured fork becomes two parallel graph branches.
#pragma once

#include "pagedmha/tensor.h"

namespace pagedmha::detail {

class SideStream {
 public:
  SideStream() = default;  // inert: fork returns the caller's stream, join does nothing
  /// CUDA devices: a non-blocking stream of the greatest priority and two events. CPU: inert.
  explicit SideStream(Device device);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  bool active() const { return stream_ != nullptr; }
  /// The side stream, ordered after everything issued on `main` so far.
  Stream fork(Stream main);
  /// Orders everything issued on `main` from now on after the side stream's work.
  void join(Stream main);

 private:
  int device_ = -1;
  void* stream_ = nullptr;
  void* fork_event_ = nullptr;
  void* join_event_ = nullptr;
};

}  // namespace pagedmha::detail
