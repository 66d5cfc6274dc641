// Reducescatter with NCCL. The first dimension is split as the request rule says
// (ScatterRows, common/request_rules.h), as the MPI path splits it: as evenly as
// possible, the first (rows % size) ranks getting one row more. Even splits are one
// ncclReduceScatter; uneven ones one ncclReduce per rank, grouped.
// Over one rank it is an allreduce, made whole (AllReduceWhole).
#include "common/dtype.h"
#include "common/request_rules.h"
#include "cuda/nccl/nccl_ops.h"

namespace perseus {
namespace gpu {

Status NcclReducescatter(const BatchItem& item, DeviceContext& ctx) {
  const Entry& entry = *item.entry;
  const TensorMeta& meta = entry.meta;
  const ncclDataType_t type = NcclType(meta.dtype);
  const int64_t esize = static_cast<int64_t>(DtypeSize(meta.dtype));
  const int64_t rows = meta.shape[0], row = meta.RowElements();
  std::vector<int64_t> counts(ctx.size);  // elements each rank receives
  for (int r = 0; r < ctx.size; ++r)
    counts[r] = ScatterRows(rows, r, ctx.size) * row;
  ReduceOp op;
  PERSEUS_RETURN_IF_ERROR(op.Create(meta, ctx));
  const char* in = static_cast<const char*>(entry.input);
  if (rows % ctx.size == 0) {
    if (counts[0] == 0) return Status::OK();
    if (ctx.size == 1)
      return AllReduceWhole(ctx, in, entry.output, counts[0], meta.dtype, op, "ncclReduceScatter");
    LaunchScope launch(ctx);
    return ctx.Nc(ctx.nccl->ReduceScatter(in, entry.output, counts[0], type, op.get(), ctx.comm,
                                          ctx.stream),
                  "ncclReduceScatter");
  }
  return InGroup(ctx, [&]() -> Status {
    int64_t offset = 0;
    for (int r = 0; r < ctx.size; ++r) {
      if (counts[r] > 0)  // the receive buffer is used on the root only
        PERSEUS_RETURN_IF_ERROR(ctx.Nc(
            ctx.nccl->Reduce(in + offset * esize, r == ctx.rank ? entry.output : nullptr,
                             counts[r], type, op.get(), r, ctx.comm, ctx.stream),
            "ncclReduce (uneven reducescatter)"));
      offset += counts[r];
    }
    return Status::OK();
  });
}

}  // namespace gpu
}  // namespace perseus
