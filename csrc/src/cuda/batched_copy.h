// Packing a batch's tensors into a device lane's fusion buffer and unpacking them: all
// of its copies in as few CUDA calls as the runtime allows, queued on the lane's stream
// (no host synchronisation). The way is chosen once per process, at the first batch
// that packs, and logged at debug level:
//   1. the pack kernel (copy_kernel.h): one launch per PERSEUS_COPY_MAX_ENTRIES (160)
//      copies, zero fills included;
//   2. where it cannot be loaded (a runtime older than CUDA 12.0, a driver that cannot
//      compile its PTX, a GPU older than Turing): cudaMemcpyBatchAsync (CUDA 12.8+), one
//      call for all the copies, plus one cudaMemsetAsync per zero fill; never on the
//      legacy stream, which it refuses (such a call takes way 3);
//   3. else one cudaMemcpyAsync per copy and one cudaMemsetAsync per zero fill.
// A way whose first use fails without queuing anything, in a way that would recur (lazy
// loading reports a driver that cannot compile the PTX at the first launch; a driver too
// old for batched copies), hands over to the next way for the rest of the process.
//
// CUDA graphs: a captured step may contain the kernel (a plain launch), NCCL and
// cudaMemcpyAsync, but not cudaMemcpyBatchAsync (way 2), which capture refuses.
#ifndef PERSEUS_CUDA_BATCHED_COPY_H_
#define PERSEUS_CUDA_BATCHED_COPY_H_

#include <vector>

#include "cuda/copy_table.h"
#include "cuda/device_context.h"

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

// Queues every copy (or zero fill) of `copies` on ctx.stream; they must not overlap.
// An error names the CUDA call that failed.
Status CopyBatch(const DeviceContext& ctx, const std::vector<DeviceCopy>& copies);

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_BATCHED_COPY_H_
