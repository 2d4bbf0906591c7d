#include "core/side_stream.h"

#if PAGEDMHA_WITH_CUDA
#include "cuda/cuda_ops.h"
#endif

namespace pagedmha::detail {

SideStream::SideStream(Device device) {
#if PAGEDMHA_WITH_CUDA
  if (!device.is_cuda()) return;
  device_ = device.index;
  cuda::side_stream_create(device_, &stream_, &fork_event_, &join_event_);
#else
  (void)device;
#endif
}

SideStream::~SideStream() {
#if PAGEDMHA_WITH_CUDA
  if (active()) cuda::side_stream_destroy(device_, stream_, fork_event_, join_event_);
#endif
}

Stream SideStream::fork(Stream main) {
  if (!active()) return main;
#if PAGEDMHA_WITH_CUDA
  cuda::stream_wait(stream_, main.handle, fork_event_);
#endif
  return Stream{stream_};
}

void SideStream::join(Stream main) {
#if PAGEDMHA_WITH_CUDA
  if (active()) cuda::stream_wait(main.handle, stream_, join_event_);
#else
  (void)main;
#endif
}

}  // namespace pagedmha::detail
