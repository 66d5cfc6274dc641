#include "cuda/batched_copy.h"

#include <atomic>
#include <mutex>
#include <string>

#include "common/logging.h"
#include "cuda/copy_kernel.h"

namespace perseus {
namespace gpu {

namespace {

enum Way : int { kKernel, kBatchedCopy, kCopyEach };

std::string WayText(int way) {
  switch (way) {
    case kKernel:
      return "the pack kernel (one launch per " + std::to_string(PERSEUS_COPY_MAX_ENTRIES) + " copies)";
    case kBatchedCopy:
      return "cudaMemcpyBatchAsync (one call per batch, one cudaMemsetAsync per zero fill)";
    default:
      return "one cudaMemcpyAsync per copy";
  }
}

struct Choice {
  std::once_flag once;
  std::atomic<int> way{kCopyEach};
  cudaKernel_t kernel = nullptr;  // set before `way` says kKernel
};

Choice& TheChoice() {
  static Choice* choice = new Choice;  // never destroyed: lanes may run during exit
  return *choice;
}

bool HasBatchedCopy(const CudaApi& cuda) {
  return cuda.MemcpyBatchAsync12 != nullptr || cuda.MemcpyBatchAsync13 != nullptr;
}

void Choose(const CudaApi& cuda) {
  Choice& choice = TheChoice();
  Status kernel = LoadCopyKernel(cuda, &choice.kernel);
  std::string why;
  int way = kKernel;
  if (!kernel.ok()) {
    way = HasBatchedCopy(cuda) ? kBatchedCopy : kCopyEach;
    why = " (the pack kernel: " + kernel.message +
          (way == kCopyEach ? "; cudaMemcpyBatchAsync needs CUDA 12.8" : "") + ")";
  }
  choice.way.store(way, std::memory_order_release);
  PERSEUS_LOG(kDebug) << "GPU fusion buffers are packed with " << WayText(way) << why;
}

// Failures that queue nothing and would recur at every call: the driver cannot compile
// or run the kernel's PTX here (reported by the first launch under lazy loading), or is
// too old for a call the runtime has.
bool Recurring(cudaError_t rc) {
  switch (rc) {
    case 35:   // cudaErrorInsufficientDriver
    case 36:   // cudaErrorCallRequiresNewerDriver
    case 98:   // cudaErrorInvalidDeviceFunction
    case 200:  // cudaErrorInvalidKernelImage
    case 209:  // cudaErrorNoKernelImageForDevice
    case 218:  // cudaErrorInvalidPtx
    case 221:  // cudaErrorJitCompilerNotFound
    case 222:  // cudaErrorUnsupportedPtxVersion
    case 223:  // cudaErrorJitCompilationDisabled
    case 303:  // cudaErrorSharedObjectInitFailed
    case 801:  // cudaErrorNotSupported
      return true;
    default:
      return false;
  }
}

// Way `from` failed with `rc` (Recurring) at `call`: the next way, for good.
int HandOver(const CudaApi& cuda, int from, cudaError_t rc, const char* call) {
  cuda.GetLastError();  // not sticky: cleared, so that no later call reports it
  const int to = from == kKernel && HasBatchedCopy(cuda) ? kBatchedCopy : kCopyEach;
  int expected = from;
  if (TheChoice().way.compare_exchange_strong(expected, to)) {
    PERSEUS_LOG(kDebug) << "GPU fusion buffers are packed with " << WayText(to) << " from now on: "
                        << CudaStatus(rc, call).message;
  }
  return TheChoice().way.load(std::memory_order_acquire);
}

Status ZeroAsync(const DeviceContext& ctx, void* dst, int64_t bytes) {
  return ctx.Cu(ctx.cuda.MemsetAsync(dst, 0, static_cast<size_t>(bytes), ctx.stream),
                "cudaMemsetAsync (joined rank's zeros)");
}

Status CopyEach(const DeviceContext& ctx, const std::vector<DeviceCopy>& copies) {
  for (const DeviceCopy& copy : copies) {
    if (copy.bytes <= 0) continue;
    if (copy.src != nullptr)
      PERSEUS_RETURN_IF_ERROR(CopyAsync(ctx, copy.dst, copy.src, copy.bytes, kDeviceToDevice));
    else
      PERSEUS_RETURN_IF_ERROR(ZeroAsync(ctx, copy.dst, copy.bytes));
  }
  return Status::OK();
}

// cudaMemcpyBatchAsync for the copies, then a memset per zero fill. Returns the batched
// call's failure (then nothing was queued); a memset's goes to `*status`.
cudaError_t BatchedCopy(const DeviceContext& ctx, const std::vector<DeviceCopy>& copies,
                        Status* status) {
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  for (const DeviceCopy& copy : copies) {
    if (copy.src == nullptr || copy.bytes <= 0) continue;
    dsts.push_back(copy.dst);
    srcs.push_back(copy.src);
    sizes.push_back(static_cast<size_t>(copy.bytes));
  }
  if (!dsts.empty()) {
    // One attribute for all: sources read in stream order, after the work before them.
    MemcpyAttributes attrs{kMemcpySrcAccessOrderStream, {0, 0}, {0, 0}, 0};
    size_t first = 0, failed = 0;
    const cudaError_t rc =
        ctx.cuda.MemcpyBatchAsync13
            ? ctx.cuda.MemcpyBatchAsync13(dsts.data(), srcs.data(), sizes.data(), dsts.size(),
                                          &attrs, &first, 1, ctx.stream)
            : ctx.cuda.MemcpyBatchAsync12(dsts.data(), srcs.data(), sizes.data(), dsts.size(),
                                          &attrs, &first, 1, &failed, ctx.stream);
    if (rc != kCudaSuccess) return rc;
  }
  for (const DeviceCopy& copy : copies) {
    if (copy.src != nullptr || copy.bytes <= 0) continue;
    *status = ZeroAsync(ctx, copy.dst, copy.bytes);
    if (!status->ok()) break;
  }
  return kCudaSuccess;
}

}  // namespace

Status CopyBatch(const DeviceContext& ctx, const std::vector<DeviceCopy>& copies) {
  Choice& choice = TheChoice();
  std::call_once(choice.once, [&] { Choose(ctx.cuda); });
  int way = choice.way.load(std::memory_order_acquire);
  if (way == kKernel) {
    int launched = 0;
    const cudaError_t rc =
        LaunchCopyKernel(ctx.cuda, choice.kernel, ctx.stream, copies.data(), copies.size(), &launched);
    if (rc == kCudaSuccess) return Status::OK();
    if (launched > 0 || !Recurring(rc)) return ctx.Cu(rc, "cudaLaunchKernel (the pack kernel)");
    way = HandOver(ctx.cuda, kKernel, rc, "cudaLaunchKernel (the pack kernel)");
  }
  // cudaMemcpyBatchAsync refuses the legacy stream (NULL, or cudaStreamLegacy).
  const bool legacy = ctx.stream == nullptr || ctx.stream == reinterpret_cast<cudaStream_t>(1);
  if (way == kBatchedCopy && !legacy) {
    Status zeros;
    const cudaError_t rc = BatchedCopy(ctx, copies, &zeros);
    if (rc == kCudaSuccess) return zeros;
    if (!Recurring(rc)) return ctx.Cu(rc, "cudaMemcpyBatchAsync");
    way = HandOver(ctx.cuda, kBatchedCopy, rc, "cudaMemcpyBatchAsync");
  }
  return CopyEach(ctx, copies);
}

}  // namespace gpu
}  // namespace perseus
