#include "cuda/memory/copy_kernel.h"

namespace perseus {
namespace gpu {

namespace {

// The PTX of kernels/batched_copy.cu, made by scripts/gen_pack_ptx.sh (NUL-terminated
// text, as cudaLibraryLoadData takes PTX).
const char kPtx[] =
#include "cuda/memory/kernels/batched_copy_ptx.inc"
    ;
constexpr char kKernelName[] = "perseus_batched_copy";

}  // namespace

Status LoadCopyKernel(const CudaApi& cuda, cudaKernel_t* kernel) {
  if (!cuda.LibraryLoadData || !cuda.LibraryGetKernel || !cuda.LaunchKernel)
    return Status::Error(PERSEUS_UNSUPPORTED,
                         "the CUDA runtime " + std::to_string(cuda.runtime_version / 1000) + "." +
                             std::to_string(cuda.runtime_version % 1000 / 10) +
                             " lacks cudaLibraryLoadData (CUDA 12.0+)");
  cudaLibrary_t library = nullptr;
  cudaError_t rc = cuda.LibraryLoadData(&library, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (rc != kCudaSuccess) {
    cuda.GetLastError();  // not sticky: cleared, so that no later call reports it
    return CudaStatus(rc, "cudaLibraryLoadData (the pack kernel's PTX)");
  }
  rc = cuda.LibraryGetKernel(kernel, library, kKernelName);
  if (rc != kCudaSuccess) {
    cuda.GetLastError();
    if (cuda.LibraryUnload) cuda.LibraryUnload(library);
    return CudaStatus(rc, "cudaLibraryGetKernel (perseus_batched_copy)");
  }
  return Status::OK();
}

cudaError_t LaunchCopyKernel(const CudaApi& cuda, cudaKernel_t kernel, cudaStream_t stream,
                             const DeviceCopy* copies, size_t count) {
  PerseusCopyTable table{};  // unused entries zero: a launch's parameter is all defined bytes
  CopyCursor cursor;
  while (const unsigned blocks = FillCopyTable(copies, count, &cursor, &table)) {
    void* args[] = {&table};  // copied by the launch: the table may be refilled at once
    const cudaError_t rc = cuda.LaunchKernel(reinterpret_cast<const void*>(kernel), Dim3{blocks, 1, 1},
                                             Dim3{PERSEUS_COPY_THREADS, 1, 1}, args, 0, stream);
    if (rc != kCudaSuccess) return rc;
  }
  return kCudaSuccess;
}

}  // namespace gpu
}  // namespace perseus
