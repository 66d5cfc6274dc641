// Packing a batch's tensors into a device lane's fusion buffer and unpacking them: all
// of its copies in as few CUDA calls as the runtime allows, queued on the lane's stream
// (no host synchronisation). The way is chosen once per process (PreparePacking) and
// logged at debug level:
//   1. the pack kernel (copy_kernel.h): one launch per PERSEUS_COPY_MAX_ENTRIES (160)
//      copies, zero fills included;
//   2. where it cannot be loaded (a runtime older than CUDA 12.0, a driver that cannot
//      compile its PTX, a GPU older than Turing): cudaMemcpyBatchAsync (CUDA 12.8+), one
//      call for all the copies, plus one cudaMemsetAsync per zero fill; never on the
//      legacy stream, which it refuses (such a call takes way 3);
//   3. else one cudaMemcpyAsync per copy and one cudaMemsetAsync per zero fill.
// The choice launches the kernel once, with nothing to copy, so that a driver that
// cannot compile the PTX (which lazy loading reports at the first launch only) leads to
// way 2 or 3 from the start. A driver too old for batched copies, which shows at their
// first call, turns way 2 into way 3 for the rest of the process.
//
// CUDA graphs: the lane's stream joins a capture through the events it waits on. The
// kernel (a plain launch), NCCL and cudaMemcpyAsync can be captured; cudaMemcpyBatchAsync
// cannot (cudaErrorStreamCaptureUnsupported, the capture going on), so way 2 copies each
// tensor of a batch that meets a capture.
#ifndef PERSEUS_CUDA_BATCHED_COPY_H_
#define PERSEUS_CUDA_BATCHED_COPY_H_

#include <vector>

#include "cuda/memory/copy_table.h"
#include "cuda/context/device_context.h"

namespace perseus {
namespace gpu {

// Each item's slot in a fusion buffer starts at a multiple of this many bytes, so that
// the kernel moves 16-byte vectors wherever the tensor itself is 16-byte aligned. The
// padding between slots is reduced (or broadcast) with them and never unpacked; every
// rank pads alike, since the plan of a batch is agreed.
constexpr int64_t kFusionSlotAlignment = 16;

// The offset of the slot after one of `bytes` at `offset`.
inline int64_t NextFusionSlot(int64_t offset, int64_t bytes) {
  return (offset + bytes + kFusionSlotAlignment - 1) / kFusionSlotAlignment * kFusionSlotAlignment;
}

// Chooses the way, once per process, when the first NCCL lane opens, before it queues
// any NCCL kernel: the pack kernel is loaded and launched once with nothing to copy, so
// that the driver compiles it then. With lazy loading (PyTorch's default) a kernel is
// loaded at its first launch, which "might require context synchronization" (CUDA
// Programming Guide, Lazy Loading): mid-training that would wait for NCCL kernels that
// wait for other ranks (NCCL loads its own kernels at init for this reason).
void PreparePacking(const DeviceContext& ctx);

// Queues every copy (or zero fill) of `copies` on ctx.stream; they must not overlap.
// An error names the CUDA call that failed.
Status CopyBatch(const DeviceContext& ctx, const std::vector<DeviceCopy>& copies);

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_BATCHED_COPY_H_
