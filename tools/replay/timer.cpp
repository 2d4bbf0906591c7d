#include "replay/timer.h"

#include <string>

#include "pagedmha/error.h"

#if defined(PAGEDMHA_WITH_CUDA)
#include "replay/cuda_check.h"
#endif

namespace pagedmha::tools {

#if defined(PAGEDMHA_WITH_CUDA)
namespace {
void check(cudaError_t e, const char* what) { check_cuda(e, "IntervalTimer", what); }
}  // namespace
#endif

IntervalTimer::IntervalTimer(Device device, Stream stream) : device_(device), stream_(stream) {}

IntervalTimer::~IntervalTimer() {
#if defined(PAGEDMHA_WITH_CUDA)
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
#endif
}

void IntervalTimer::start() {
  if (device_.is_cpu()) {
    t0_ = std::chrono::steady_clock::now();
    return;
  }
#if defined(PAGEDMHA_WITH_CUDA)
  while (events_.size() < used_ + 2) {
    cudaEvent_t e;
    check(cudaEventCreate(&e), "cudaEventCreate");
    events_.push_back(e);
  }
  check(cudaEventRecord(static_cast<cudaEvent_t>(events_[used_]), static_cast<cudaStream_t>(stream_.handle)),
        "cudaEventRecord");
#endif
}

void IntervalTimer::stop() {
  if (device_.is_cpu()) {
    host_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    return;
  }
#if defined(PAGEDMHA_WITH_CUDA)
  check(cudaEventRecord(static_cast<cudaEvent_t>(events_[used_ + 1]), static_cast<cudaStream_t>(stream_.handle)),
        "cudaEventRecord");
  used_ += 2;
#endif
}

double IntervalTimer::take_seconds() {
  double s = host_seconds_;
  host_seconds_ = 0.0;
#if defined(PAGEDMHA_WITH_CUDA)
  if (used_ > 0) {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[used_ - 1])), "cudaEventSynchronize");
    for (size_t i = 0; i < used_; i += 2) {
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[i]), static_cast<cudaEvent_t>(events_[i + 1])),
            "cudaEventElapsedTime");
      s += ms * 1e-3;
    }
    used_ = 0;
  }
#endif
  return s;
}

}  // namespace pagedmha::tools
