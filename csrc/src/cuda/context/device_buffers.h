// The two reused buffers of a device lane.
#ifndef PERSEUS_CUDA_DEVICE_BUFFERS_H_
#define PERSEUS_CUDA_DEVICE_BUFFERS_H_

#include <cstddef>

#include "cuda/runtime/cuda_api.h"

namespace perseus {
namespace gpu {

// The fusion buffer in device memory. Grows stream-ordered (cudaFreeAsync of the old
// block and cudaMallocAsync of the new one on the lane's stream), so growing never
// waits for work still queued on it; never shrinks.
class DeviceBuffer {
 public:
  Status Reserve(size_t bytes, cudaStream_t stream);
  char* data() const { return data_; }
  void Release(cudaStream_t stream);

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

// Pinned host memory (cudaMallocHost) for the host-staged path and the NaN check.
// Grown only when the caller has drained the lane's stream, since copies queued
// earlier may still read or write the old block; never shrinks.
class HostBuffer {
 public:
  size_t capacity() const { return capacity_; }
  Status Reserve(size_t bytes);  // precondition when growing: the lane's stream is idle
  char* data() const { return data_; }
  void Release();

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_DEVICE_BUFFERS_H_
