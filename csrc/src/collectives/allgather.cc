// Allgather over MPI: ranks may contribute different numbers of rows.
#include <cstdlib>
#include <numeric>

#include "collectives/collectives.h"
#include "collectives/row_type.h"
#include "common/dtype.h"
#include "mpi/wait_policy.h"

namespace perseus {

Status RunAllgather(const BatchItem& item, ExecContext& ctx, Result* result) {
  const TensorMeta& meta = item.entry->meta;
  const int64_t row_bytes = meta.RowElements() * DtypeSize(meta.dtype);
  // Step 1: learn every rank's row count.
  std::vector<int64_t> rows(ctx.size);
  int64_t mine = meta.shape[0];
  MPI_Request request;
  Status status = CompleteRequest(
      MPI_Iallgather(&mine, 1, MPI_INT64_T, rows.data(), 1, MPI_INT64_T, ctx.comm, &request),
      &request, "MPI_Iallgather");
  if (!status.ok()) return status;
  const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  // Step 2: gather the rows into one output the caller will own.
  result->shape = meta.shape;
  result->shape[0] = total;
  result->data = std::malloc(std::max<int64_t>(1, total * row_bytes));
  if (result->data == nullptr) return Status::Error(PERSEUS_INTERNAL_ERROR, "out of memory");
  if (row_bytes == 0) return Status::OK();
  std::vector<int> counts, displs;
  status = RowCounts(rows, &counts, &displs);
  if (!status.ok()) return status;
  RowType row(row_bytes);
  if (row.get() == MPI_DATATYPE_NULL)
    return Status::Error(PERSEUS_UNSUPPORTED, "rows larger than 2 GiB are not supported");
  return CompleteRequest(MPI_Iallgatherv(item.entry->input, counts[ctx.rank], row.get(),
                                        result->data, counts.data(), displs.data(), row.get(),
                                        ctx.comm, &request),
                         &request, "MPI_Iallgatherv");
}

}  // namespace perseus
