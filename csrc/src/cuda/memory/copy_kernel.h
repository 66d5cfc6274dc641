// The pack kernel (kernels/batched_copy.cu) in the core: its PTX is embedded as text,
// loaded with cudaLibraryLoadData + cudaLibraryGetKernel (CUDA 12.0+; the driver
// compiles it for the GPU, at the load or, with lazy loading, at the first launch) and
// launched with cudaLaunchKernel, PERSEUS_COPY_MAX_ENTRIES copies per launch.
#ifndef PERSEUS_CUDA_COPY_KERNEL_H_
#define PERSEUS_CUDA_COPY_KERNEL_H_

#include "cuda/runtime/cuda_api.h"
#include "cuda/memory/copy_table.h"

namespace perseus {
namespace gpu {

// Loads the kernel. The library stays loaded for the life of the process (the caller
// loads it once: cuda/memory/batched_copy.cc). PERSEUS_UNSUPPORTED when the runtime lacks the
// calls; otherwise an error naming the call that failed.
Status LoadCopyKernel(const CudaApi& cuda, cudaKernel_t* kernel);

// Queues `copies` on `stream`: one launch per table (copy_table.h). Returns the first
// launch's failure.
cudaError_t LaunchCopyKernel(const CudaApi& cuda, cudaKernel_t kernel, cudaStream_t stream,
                             const DeviceCopy* copies, size_t count);

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_COPY_KERNEL_H_
