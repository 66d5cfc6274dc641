// Alltoall over MPI: rank i sends splits[j] rows to rank j and learns what it receives.
#include <cstdlib>
#include <numeric>

#include "collectives/collectives.h"
#include "collectives/row_type.h"
#include "common/dtype.h"
#include "mpi/wait_policy.h"

namespace perseus {

Status RunAlltoall(const BatchItem& item, ExecContext& ctx, Result* result) {
  const Entry& entry = *item.entry;
  const int64_t row_bytes = entry.meta.RowElements() * DtypeSize(entry.meta.dtype);
  // Step 1: exchange how many rows go to each rank.
  std::vector<int64_t> recv_rows(ctx.size);
  MPI_Request request;
  Status status = CompleteRequest(MPI_Ialltoall(entry.splits.data(), 1, MPI_INT64_T,
                                                recv_rows.data(), 1, MPI_INT64_T, ctx.comm,
                                                &request),
                                  &request, "MPI_Ialltoall");
  if (!status.ok()) return status;
  const int64_t total = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
  result->recv_splits = recv_rows;
  result->shape = entry.meta.shape;
  result->shape[0] = total;
  result->data = std::malloc(std::max<int64_t>(1, total * row_bytes));
  if (result->data == nullptr) return Status::Error(PERSEUS_INTERNAL_ERROR, "out of memory");
  if (row_bytes == 0) return Status::OK();
  // Step 2: move the rows.
  std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
  status = RowCounts(entry.splits, &send_counts, &send_displs);
  if (status.ok()) status = RowCounts(recv_rows, &recv_counts, &recv_displs);
  if (!status.ok()) return status;
  RowType row(row_bytes);
  if (row.get() == MPI_DATATYPE_NULL)
    return Status::Error(PERSEUS_UNSUPPORTED, "rows larger than 2 GiB are not supported");
  return CompleteRequest(MPI_Ialltoallv(entry.input, send_counts.data(), send_displs.data(),
                                       row.get(), result->data, recv_counts.data(),
                                       recv_displs.data(), row.get(), ctx.comm, &request),
                         &request, "MPI_Ialltoallv");
}

}  // namespace perseus
