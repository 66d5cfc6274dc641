// Broadcast with NCCL, as bytes (so tensors of any dtype fuse): one tensor straight
// from the root's input into every output; several packed into the fusion buffer.
#include "common/dtype.h"
#include "cuda/nccl_ops.h"

namespace perseus {
namespace gpu {

Status NcclBroadcast(const Batch& batch, DeviceContext& ctx) {
  const int root = batch.items.front().meta.root_rank;
  const bool is_root = ctx.rank == root;
  auto bytes_of = [](const BatchItem& item) { return PayloadBytes(item.meta); };

  if (batch.items.size() == 1) {
    const Entry& entry = *batch.items.front().entry;
    const int64_t n = bytes_of(batch.items.front());
    if (n == 0) return Status::OK();
    // The send buffer is read on the root only.
    return ctx.Nc(ctx.nccl->Broadcast(is_root ? entry.input : entry.output, entry.output, n,
                                      kNcclUint8, root, ctx.comm, ctx.stream),
                  "ncclBroadcast");
  }

  int64_t total = 0;
  for (const BatchItem& item : batch.items) total += bytes_of(item);
  if (total == 0) return Status::OK();
  PERSEUS_RETURN_IF_ERROR(ctx.fusion->Reserve(total, ctx.stream));
  char* buffer = ctx.fusion->data();
  int64_t offset = 0;
  if (is_root) {
    for (const BatchItem& item : batch.items) {
      PERSEUS_RETURN_IF_ERROR(CopyAsync(ctx, buffer + offset, item.entry->input, bytes_of(item),
                                        kDeviceToDevice));
      offset += bytes_of(item);
    }
  }
  PERSEUS_RETURN_IF_ERROR(ctx.Nc(
      ctx.nccl->Broadcast(buffer, buffer, total, kNcclUint8, root, ctx.comm, ctx.stream),
      "ncclBroadcast (fused)"));
  offset = 0;
  for (const BatchItem& item : batch.items) {
    const int64_t n = bytes_of(item);
    if (!is_root || item.entry->output != item.entry->input)
      PERSEUS_RETURN_IF_ERROR(CopyAsync(ctx, item.entry->output, buffer + offset, n, kDeviceToDevice));
    offset += n;
  }
  return Status::OK();
}

}  // namespace gpu
}  // namespace perseus
