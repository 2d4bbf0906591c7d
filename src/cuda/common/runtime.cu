// Checked wrappers over the CUDA runtime used by the host side of the library.
#include <cuda_runtime.h>

#include <string>

#include "cuda/common/check.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/cuda_ops.h"

namespace pagedmha::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string device_unavailable(int device_index) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) cudaGetLastError();
  if (err == cudaErrorInsufficientDriver) {
    return "no CUDA driver is loaded, or it is older than this build's CUDA runtime";
  }
  if (err == cudaErrorNoDevice || (err == cudaSuccess && n == 0)) return "no CUDA device is visible";
  if (err != cudaSuccess) return std::string("the CUDA runtime cannot start (") + cudaGetErrorString(err) + ")";
  if (device_index < 0 || device_index >= n) {
    return std::to_string(n) + " CUDA device(s) are visible, cuda:0..cuda:" + std::to_string(n - 1);
  }
  return "";
}

void* malloc_device(std::size_t bytes, int device_index) {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device_index) != cudaSuccess) {
    cudaGetLastError();
    throw Error("Buffer: device: expected a usable CUDA device, got cuda:" + std::to_string(device_index) + " (" +
                device_unavailable(device_index) + ")");
  }
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, bytes);
  cudaSetDevice(previous);
  if (err != cudaSuccess) {
    throw Error("Buffer: bytes: expected an allocation that fits on cuda:" + std::to_string(device_index) +
                ", got " + std::to_string(bytes) + " bytes (" + cudaGetErrorString(err) + ")");
  }
  return ptr;
}

void free_device(void* ptr) { cudaFree(ptr); }

void memcpy_async(void* dst, const void* src, std::size_t bytes, void* stream) {
  PAGEDMHA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
}

void memset_async(void* dst, int value, std::size_t bytes, void* stream) {
  PAGEDMHA_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)));
}

void stream_synchronize(void* stream) {
  PAGEDMHA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

int multiprocessor_count(int device_index) {
  int n = 0;
  PAGEDMHA_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device_index));
  return n;
}

void side_stream_create(int device_index, void** stream, void** fork_event, void** join_event) {
  DeviceGuard guard(device_index);
  int least = 0, greatest = 0;
  PAGEDMHA_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s = nullptr;
  cudaEvent_t f = nullptr, j = nullptr;
  cudaError_t err = cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest);
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&f, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&j, cudaEventDisableTiming);
  if (err != cudaSuccess) {  // release what was made before the failure
    if (f) cudaEventDestroy(f);
    if (s) cudaStreamDestroy(s);
    PAGEDMHA_CUDA_CHECK(err);
  }
  *stream = s, *fork_event = f, *join_event = j;
}

void side_stream_destroy(int device_index, void* stream, void* fork_event, void* join_event) {
  DeviceGuard guard(device_index);
  cudaEventDestroy(static_cast<cudaEvent_t>(fork_event));
  cudaEventDestroy(static_cast<cudaEvent_t>(join_event));
  cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

void stream_wait(void* waiter, void* waited, void* event) {
  const auto e = static_cast<cudaEvent_t>(event);
  PAGEDMHA_CUDA_CHECK(cudaEventRecord(e, static_cast<cudaStream_t>(waited)));
  PAGEDMHA_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), e, 0));
}

}  // namespace pagedmha::cuda
