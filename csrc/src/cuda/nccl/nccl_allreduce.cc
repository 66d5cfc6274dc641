// Allreduce with NCCL. One tensor is reduced straight from its input into its output
// (which may differ: ncclAllReduce(in, out)); several are packed into the lane's
// fusion buffer, reduced by one call, and unpacked (cuda/memory/batched_copy.h: one kernel launch
// each way). A joined rank's slots are zeros.
#include <vector>

#include "common/dtype.h"
#include "cuda/memory/batched_copy.h"
#include "cuda/nccl/nccl_ops.h"
#include "cuda/staged/staged_ops.h"

namespace perseus {
namespace gpu {

Status NcclAllreduce(const Batch& batch, DeviceContext& ctx) {
  const TensorMeta& head = batch.items.front().meta;
  const int64_t esize = static_cast<int64_t>(DtypeSize(head.dtype));
  if (ctx.nan_check && IsFloatingDtype(head.dtype))
    PERSEUS_RETURN_IF_ERROR(CheckFiniteOnHost(batch, ctx));
  ReduceOp op;
  PERSEUS_RETURN_IF_ERROR(op.Create(head, ctx));

  const BatchItem& only = batch.items.front();
  if (batch.items.size() == 1 && only.entry) {
    const int64_t n = head.NumElements();
    if (n == 0) return Status::OK();  // the same on every rank: the shape is agreed
    return AllReduceWhole(ctx, only.entry->input, only.entry->output, n, head.dtype, op,
                          "ncclAllReduce");
  }

  // Slots start on 16-byte boundaries (cuda/memory/batched_copy.h); `total` ends at the
  // last one's end.
  int64_t total = 0, offset = 0;
  for (const BatchItem& item : batch.items) {
    const int64_t bytes = item.meta.NumElements() * esize;
    total = offset + bytes;
    offset = NextFusionSlot(offset, bytes);
  }
  if (total == 0) return Status::OK();
  PERSEUS_RETURN_IF_ERROR(ctx.fusion->Reserve(total, ctx.stream));
  char* buffer = ctx.fusion->data();
  std::vector<DeviceCopy> pack, unpack;
  pack.reserve(batch.items.size());
  unpack.reserve(batch.items.size());
  offset = 0;
  for (const BatchItem& item : batch.items) {
    const int64_t bytes = item.meta.NumElements() * esize;
    if (item.entry) {
      pack.push_back({item.entry->input, buffer + offset, bytes});
      unpack.push_back({buffer + offset, item.entry->output, bytes});
    } else {
      pack.push_back({nullptr, buffer + offset, bytes});  // a joined rank adds zeros
    }
    offset = NextFusionSlot(offset, bytes);
  }
  PERSEUS_RETURN_IF_ERROR(CopyBatch(ctx, pack));
  PERSEUS_RETURN_IF_ERROR(AllReduceWhole(ctx, buffer, buffer, total / esize, head.dtype, op,
                                         "ncclAllReduce (fused)"));
  PERSEUS_RETURN_IF_ERROR(CopyBatch(ctx, unpack));
  return Status::OK();
}

}  // namespace gpu
}  // namespace perseus
