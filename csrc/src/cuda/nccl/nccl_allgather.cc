// Allgather with NCCL; ranks may contribute different numbers of rows.
#include <numeric>

#include "common/dtype.h"
#include "cuda/nccl/nccl_ops.h"
#include "mpi/mpi_lock.h"
#include "mpi/wait_policy.h"

namespace perseus {
namespace gpu {

Status NcclAllgather(const BatchItem& item, DeviceContext& ctx, Result* result) {
  const Entry& entry = *item.entry;
  const TensorMeta& meta = entry.meta;
  const int64_t row_bytes = meta.RowElements() * static_cast<int64_t>(DtypeSize(meta.dtype));
  // Step 1: learn every rank's row count (a few bytes over the lane's MPI communicator).
  std::vector<int64_t> rows(ctx.size);
  int64_t mine = meta.shape[0];
  {
    auto mpi = LockMpi();
    MPI_Request request;
    PERSEUS_RETURN_IF_ERROR(CompleteRequest(
        MPI_Iallgather(&mine, 1, MPI_INT64_T, rows.data(), 1, MPI_INT64_T, ctx.mpi, &request),
        &request, "MPI_Iallgather (row counts)"));
  }
  const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  // Step 2: an output the caller will own, on the lane's stream.
  result->shape = meta.shape;
  result->shape[0] = total;
  PERSEUS_RETURN_IF_ERROR(AllocateOutput(ctx, total * row_bytes, result));
  if (total * row_bytes == 0) return Status::OK();
  char* out = static_cast<char*>(result->data);
  // Step 3: one ncclAllGather when the counts are even, else one broadcast per rank.
  bool even = true;
  for (int64_t r : rows) even = even && r == rows[0];
  if (even) {
    LaunchScope launch(ctx);
    return ctx.Nc(ctx.nccl->AllGather(entry.input, out, rows[0] * row_bytes, kNcclUint8, ctx.comm,
                                      ctx.stream),
                  "ncclAllGather");
  }
  return InGroup(ctx, [&]() -> Status {
    int64_t offset = 0;
    for (int r = 0; r < ctx.size; ++r) {
      const int64_t n = rows[r] * row_bytes;
      if (n > 0) {
        const void* send = r == ctx.rank ? entry.input : out + offset;
        PERSEUS_RETURN_IF_ERROR(ctx.Nc(
            ctx.nccl->Broadcast(send, out + offset, n, kNcclUint8, r, ctx.comm, ctx.stream),
            "ncclBroadcast (uneven allgather)"));
      }
      offset += n;
    }
    return Status::OK();
  });
}

}  // namespace gpu
}  // namespace perseus
