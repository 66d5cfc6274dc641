#include "cuda/memory/batched_copy.h"

#include <atomic>
#include <mutex>
#include <string>

#include "common/logging.h"
#include "cuda/memory/copy_kernel.h"
#include "cuda/runtime/device_guard.h"

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

// Launches the kernel once with one empty entry: it touches no memory.
Status Probe(const CudaApi& cuda, cudaKernel_t kernel, cudaStream_t stream) {
  PerseusCopyTable table{};
  table.count = 1;  // one entry of 0 bytes: its one block returns at once
  void* args[] = {&table};
  const cudaError_t rc = cuda.LaunchKernel(reinterpret_cast<const void*>(kernel), Dim3{1, 1, 1},
                                           Dim3{PERSEUS_COPY_THREADS, 1, 1}, args, 0, stream);
  if (rc == kCudaSuccess) return Status::OK();
  cuda.GetLastError();  // not sticky: cleared, so that no later call reports it
  return CudaStatus(rc, "cudaLaunchKernel (the pack kernel, first launch)");
}

void Choose(const CudaApi& cuda, cudaStream_t stream) {
  Choice& choice = TheChoice();
  Status kernel = LoadCopyKernel(cuda, &choice.kernel);
  if (kernel.ok()) kernel = Probe(cuda, choice.kernel, stream);
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

constexpr cudaError_t kErrorStreamCaptureUnsupported = 900;

// cudaMemcpyBatchAsync failures that queue nothing and would recur at every call: a
// driver older than the runtime.
bool Recurring(cudaError_t rc) {
  return rc == 35 /* cudaErrorInsufficientDriver */ || rc == 36 /* cudaErrorCallRequiresNewerDriver */ ||
         rc == 801 /* cudaErrorNotSupported */;
}

// Batched copies failed for good (Recurring): one copy per tensor from now on.
void HandOver(const CudaApi& cuda, cudaError_t rc) {
  cuda.GetLastError();  // not sticky: cleared, so that no later call reports it
  int expected = kBatchedCopy;
  if (TheChoice().way.compare_exchange_strong(expected, kCopyEach)) {
    PERSEUS_LOG(kDebug) << "GPU fusion buffers are packed with " << WayText(kCopyEach)
                        << " from now on: " << CudaStatus(rc, "cudaMemcpyBatchAsync").message;
  }
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

void PreparePacking(const DeviceContext& ctx) {
  Status current;
  DeviceGuard guard(ctx.device, &current);
  if (current.ok()) std::call_once(TheChoice().once, [&] { Choose(ctx.cuda, ctx.stream); });
}

Status CopyBatch(const DeviceContext& ctx, const std::vector<DeviceCopy>& copies) {
  Choice& choice = TheChoice();
  std::call_once(choice.once, [&] { Choose(ctx.cuda, ctx.stream); });
  const int way = choice.way.load(std::memory_order_acquire);
  if (way == kKernel)
    return ctx.Cu(LaunchCopyKernel(ctx.cuda, choice.kernel, ctx.stream, copies.data(), copies.size()),
                  "cudaLaunchKernel (the pack kernel)");
  // cudaMemcpyBatchAsync refuses the legacy stream (NULL, or cudaStreamLegacy).
  const bool legacy = ctx.stream == nullptr || ctx.stream == reinterpret_cast<cudaStream_t>(1);
  if (way == kBatchedCopy && !legacy) {
    Status zeros;
    const cudaError_t rc = BatchedCopy(ctx, copies, &zeros);
    if (rc == kCudaSuccess) return zeros;
    if (rc == kErrorStreamCaptureUnsupported) {
      // The stream is being captured into a CUDA graph, which cannot hold batched copies
      // (the capture goes on): this batch copies each tensor, later ones try again.
      ctx.cuda.GetLastError();
      return CopyEach(ctx, copies);
    }
    if (!Recurring(rc)) return ctx.Cu(rc, "cudaMemcpyBatchAsync");
    HandOver(ctx.cuda, rc);
  }
  return CopyEach(ctx, copies);
}

}  // namespace gpu
}  // namespace perseus
