// Broadcast with NCCL, as bytes (so tensors of any dtype fuse): one tensor straight
// from the root's input into every output; several packed into the fusion buffer
// (cuda/memory/batched_copy.h) by the root, broadcast by one call, and unpacked.
#include <vector>

#include "common/dtype.h"
#include "cuda/memory/batched_copy.h"
#include "cuda/nccl/nccl_ops.h"

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
    LaunchScope launch(ctx);
    return ctx.Nc(ctx.nccl->Broadcast(is_root ? entry.input : entry.output, entry.output, n,
                                      kNcclUint8, root, ctx.comm, ctx.stream),
                  "ncclBroadcast");
  }

  // Slots start on 16-byte boundaries (cuda/memory/batched_copy.h); `total` ends at the
  // last one's end.
  int64_t total = 0, offset = 0;
  for (const BatchItem& item : batch.items) {
    total = offset + bytes_of(item);
    offset = NextFusionSlot(offset, bytes_of(item));
  }
  if (total == 0) return Status::OK();
  PERSEUS_RETURN_IF_ERROR(ctx.fusion->Reserve(total, ctx.stream));
  char* buffer = ctx.fusion->data();
  std::vector<DeviceCopy> pack, unpack;
  offset = 0;
  for (const BatchItem& item : batch.items) {
    const Entry& entry = *item.entry;
    if (is_root) pack.push_back({entry.input, buffer + offset, bytes_of(item)});
    if (!is_root || entry.output != entry.input)  // the root's in-place tensors hold it already
      unpack.push_back({buffer + offset, entry.output, bytes_of(item)});
    offset = NextFusionSlot(offset, bytes_of(item));
  }
  PERSEUS_RETURN_IF_ERROR(CopyBatch(ctx, pack));
  {
    LaunchScope launch(ctx);
    PERSEUS_RETURN_IF_ERROR(ctx.Nc(
        ctx.nccl->Broadcast(buffer, buffer, total, kNcclUint8, root, ctx.comm, ctx.stream),
        "ncclBroadcast (fused)"));
  }
  PERSEUS_RETURN_IF_ERROR(CopyBatch(ctx, unpack));
  return Status::OK();
}

}  // namespace gpu
}  // namespace perseus
