#include "cuda/context/device_context.h"

#include <chrono>
#include <thread>

namespace perseus {
namespace gpu {

namespace {

// A result's data the caller never took: cudaFree orders itself after the device
// work (it synchronises); only on this rare path, never on the hot one.
void FreeUnclaimedOutput(void* data) {
  if (const CudaApi* cuda = Cuda()) cuda->Free(data);
}

}  // namespace

Status DrainStream(const DeviceContext& ctx) {
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    cudaError_t rc = ctx.cuda.StreamQuery(ctx.stream);
    if (rc == kCudaSuccess) return Status::OK();
    if (rc != kCudaErrorNotReady) return CudaStatus(rc, "cudaStreamQuery (lane stream)");
    if (ctx.comm != nullptr) {
      ncclResult_t async = kNcclSuccess;
      PERSEUS_RETURN_IF_ERROR(ctx.Nc(ctx.nccl->CommGetAsyncError(ctx.comm, &async),
                                     "ncclCommGetAsyncError"));
      if (async != kNcclSuccess && async != kNcclInProgress)
        return ctx.Nc(async, "NCCL (asynchronous error while waiting for the lane's stream)");
    }
    // Spin briefly (copies of small batches end within microseconds), then yield the core.
    if (std::chrono::steady_clock::now() - start > std::chrono::microseconds(200))
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Status AllocateOutput(const DeviceContext& ctx, int64_t bytes, Result* result) {
  void* p = nullptr;
  PERSEUS_RETURN_IF_ERROR(ctx.Cu(ctx.cuda.MallocAsync(&p, bytes > 0 ? bytes : 1, ctx.stream),
                                 "cudaMallocAsync (output)"));
  result->data = p;
  result->free_data = &FreeUnclaimedOutput;
  return Status::OK();
}

Status CopyAsync(const DeviceContext& ctx, void* dst, const void* src, int64_t bytes, int kind) {
  if (bytes <= 0) return Status::OK();
  return ctx.Cu(ctx.cuda.MemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, ctx.stream),
                "cudaMemcpyAsync");
}

}  // namespace gpu
}  // namespace perseus
