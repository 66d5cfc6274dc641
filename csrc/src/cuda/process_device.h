// The one GPU this process drives: fixed by its first GPU request that could be
// prepared, so that every request, lane and NCCL communicator of the process uses it.
#ifndef PERSEUS_CUDA_PROCESS_DEVICE_H_
#define PERSEUS_CUDA_PROCESS_DEVICE_H_

namespace perseus {
namespace gpu {

// Binds `device` unless another is bound; returns the bound device.
int BindDevice(int device);
// The bound device, or -1.
int BoundDevice();

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_PROCESS_DEVICE_H_
