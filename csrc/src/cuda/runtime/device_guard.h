// Makes a device current on the calling thread for a scope and restores the caller's
// device afterwards, so that Perseus never changes a framework thread's device.
#ifndef PERSEUS_CUDA_DEVICE_GUARD_H_
#define PERSEUS_CUDA_DEVICE_GUARD_H_

#include "cuda/runtime/cuda_api.h"

namespace perseus {
namespace gpu {

class DeviceGuard {
 public:
  // Requires the CUDA runtime to be loaded. *status reports a failure to switch.
  DeviceGuard(int device, Status* status) : cuda_(*Cuda()) {
    int previous = -1;
    *status = CudaStatus(cuda_.GetDevice(&previous), "cudaGetDevice");
    if (status->ok() && previous != device) {
      *status = CudaStatus(cuda_.SetDevice(device), "cudaSetDevice");
      if (status->ok()) restore_ = previous;
    }
  }
  ~DeviceGuard() {
    if (restore_ >= 0) cuda_.SetDevice(restore_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  const CudaApi& cuda_;
  int restore_ = -1;  // the caller's device, when it was changed
};

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_DEVICE_GUARD_H_
