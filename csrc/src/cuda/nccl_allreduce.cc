// Allreduce with NCCL. One tensor is reduced straight from its input into its output
// (which may differ: ncclAllReduce(in, out)); several are packed into the lane's
// fusion buffer, reduced by one call, and unpacked. A joined rank's slots are zeros.
#include "common/dtype.h"
#include "cuda/nccl_ops.h"
#include "cuda/staged_ops.h"

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

  int64_t total = 0;
  for (const BatchItem& item : batch.items) total += item.meta.NumElements();
  if (total == 0) return Status::OK();
  PERSEUS_RETURN_IF_ERROR(ctx.fusion->Reserve(total * esize, ctx.stream));
  char* buffer = ctx.fusion->data();
  int64_t offset = 0;
  for (const BatchItem& item : batch.items) {  // pack
    const int64_t bytes = item.meta.NumElements() * esize;
    if (item.entry) {
      PERSEUS_RETURN_IF_ERROR(CopyAsync(ctx, buffer + offset, item.entry->input, bytes, kDeviceToDevice));
    } else if (bytes > 0) {
      PERSEUS_RETURN_IF_ERROR(ctx.Cu(ctx.cuda.MemsetAsync(buffer + offset, 0, bytes, ctx.stream),
                                     "cudaMemsetAsync (joined rank's zeros)"));
    }
    offset += bytes;
  }
  PERSEUS_RETURN_IF_ERROR(
      AllReduceWhole(ctx, buffer, buffer, total, head.dtype, op, "ncclAllReduce (fused)"));
  offset = 0;
  for (const BatchItem& item : batch.items) {  // unpack
    const int64_t bytes = item.meta.NumElements() * esize;
    if (item.entry)
      PERSEUS_RETURN_IF_ERROR(CopyAsync(ctx, item.entry->output, buffer + offset, bytes, kDeviceToDevice));
    offset += bytes;
  }
  return Status::OK();
}

}  // namespace gpu
}  // namespace perseus
