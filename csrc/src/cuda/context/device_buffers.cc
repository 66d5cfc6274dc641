#include "cuda/context/device_buffers.h"

namespace perseus {
namespace gpu {

namespace {

constexpr size_t kGranule = 1 << 20;  // grow in whole MiB: fewer regrowths of odd sizes

size_t RoundUp(size_t bytes) { return (bytes + kGranule - 1) / kGranule * kGranule; }

}  // namespace

Status DeviceBuffer::Reserve(size_t bytes, cudaStream_t stream) {
  if (bytes <= capacity_) return Status::OK();
  const CudaApi& cuda = *Cuda();
  if (data_ != nullptr) {
    Status status = CudaStatus(cuda.FreeAsync(data_, stream), "cudaFreeAsync (fusion buffer)");
    data_ = nullptr;
    capacity_ = 0;
    if (!status.ok()) return status;
  }
  const size_t size = RoundUp(bytes);
  void* p = nullptr;
  Status status = CudaStatus(cuda.MallocAsync(&p, size, stream), "cudaMallocAsync (fusion buffer)");
  if (!status.ok()) return status;
  data_ = static_cast<char*>(p);
  capacity_ = size;
  return Status::OK();
}

void DeviceBuffer::Release(cudaStream_t stream) {
  if (data_ != nullptr) Cuda()->FreeAsync(data_, stream);
  data_ = nullptr;
  capacity_ = 0;
}

Status HostBuffer::Reserve(size_t bytes) {
  if (bytes <= capacity_) return Status::OK();
  const CudaApi& cuda = *Cuda();
  Release();
  const size_t size = RoundUp(bytes);
  void* p = nullptr;
  Status status = CudaStatus(cuda.MallocHost(&p, size), "cudaMallocHost (staging buffer)");
  if (!status.ok()) return status;
  data_ = static_cast<char*>(p);
  capacity_ = size;
  return Status::OK();
}

void HostBuffer::Release() {
  if (data_ != nullptr) Cuda()->FreeHost(data_);
  data_ = nullptr;
  capacity_ = 0;
}

}  // namespace gpu
}  // namespace perseus
