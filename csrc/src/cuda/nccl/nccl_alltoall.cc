// Alltoall with NCCL: rank i sends splits[j] rows to rank j; what it receives is
// learned first over the lane's MPI communicator, as the MPI path does.
#include <numeric>

#include "common/dtype.h"
#include "cuda/nccl/nccl_ops.h"
#include "mpi/mpi_lock.h"
#include "mpi/wait_policy.h"

namespace perseus {
namespace gpu {

Status NcclAlltoall(const BatchItem& item, DeviceContext& ctx, Result* result) {
  const Entry& entry = *item.entry;
  const int64_t row_bytes =
      entry.meta.RowElements() * static_cast<int64_t>(DtypeSize(entry.meta.dtype));
  // Step 1: exchange how many rows go to each rank.
  std::vector<int64_t> recv_rows(ctx.size);
  {
    auto mpi = LockMpi();
    MPI_Request request;
    PERSEUS_RETURN_IF_ERROR(CompleteRequest(MPI_Ialltoall(entry.splits.data(), 1, MPI_INT64_T,
                                                          recv_rows.data(), 1, MPI_INT64_T, ctx.mpi,
                                                          &request),
                                            &request, "MPI_Ialltoall (splits)"));
  }
  const int64_t total = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
  result->recv_splits = recv_rows;
  result->shape = entry.meta.shape;
  result->shape[0] = total;
  PERSEUS_RETURN_IF_ERROR(AllocateOutput(ctx, total * row_bytes, result));
  if (row_bytes == 0) return Status::OK();
  // Step 2: move the rows: this rank's own share by a copy, the others point to point.
  const char* in = static_cast<const char*>(entry.input);
  char* out = static_cast<char*>(result->data);
  std::vector<int64_t> send_at(ctx.size, 0), recv_at(ctx.size, 0);
  for (int r = 1; r < ctx.size; ++r) {
    send_at[r] = send_at[r - 1] + entry.splits[r - 1] * row_bytes;
    recv_at[r] = recv_at[r - 1] + recv_rows[r - 1] * row_bytes;
  }
  PERSEUS_RETURN_IF_ERROR(CopyAsync(ctx, out + recv_at[ctx.rank], in + send_at[ctx.rank],
                                    entry.splits[ctx.rank] * row_bytes, kDeviceToDevice));
  return InGroup(ctx, [&]() -> Status {
    for (int r = 0; r < ctx.size; ++r) {
      if (r == ctx.rank) continue;
      const int64_t send = entry.splits[r] * row_bytes, recv = recv_rows[r] * row_bytes;
      if (send > 0)
        PERSEUS_RETURN_IF_ERROR(ctx.Nc(
            ctx.nccl->Send(in + send_at[r], send, kNcclUint8, r, ctx.comm, ctx.stream), "ncclSend"));
      if (recv > 0)
        PERSEUS_RETURN_IF_ERROR(ctx.Nc(
            ctx.nccl->Recv(out + recv_at[r], recv, kNcclUint8, r, ctx.comm, ctx.stream), "ncclRecv"));
    }
    return Status::OK();
  });
}

}  // namespace gpu
}  // namespace perseus
