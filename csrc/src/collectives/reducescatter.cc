// Reducescatter over MPI: the first dimension is split as the request rule says
// (ScatterRows, common/request_rules.h): as evenly as possible, the first
// (rows % size) ranks getting one row more.
#include <climits>

#include "collectives/collectives.h"
#include "common/dtype.h"
#include "common/request_rules.h"
#include "mpi/wait_policy.h"

namespace perseus {

Status RunReducescatter(const BatchItem& item, ExecContext& ctx) {
  const Entry& entry = *item.entry;
  const TensorMeta& meta = entry.meta;
  const int dtype = meta.dtype;
  const size_t esize = DtypeSize(dtype);
  MPI_Op op;
  Status status = MpiReduceOp(dtype, meta.reduce_op, &op);
  if (!status.ok()) return status;
  const int64_t rows = meta.shape[0], row = meta.RowElements();
  std::vector<int> counts(ctx.size);
  for (int r = 0; r < ctx.size; ++r) {
    int64_t n = ScatterRows(rows, r, ctx.size) * row;
    if (n > INT_MAX) return Status::Error(PERSEUS_UNSUPPORTED, "reducescatter piece over INT_MAX");
    counts[r] = static_cast<int>(n);
  }
  const void* send = entry.input;
  if (meta.prescale != 1.0) {
    ctx.scratch->resize(std::max<size_t>(ctx.scratch->size(), meta.NumElements() * esize));
    CopyScaled(dtype, ctx.scratch->data(), entry.input, meta.NumElements(), meta.prescale);
    send = ctx.scratch->data();
  }
  static char empty;  // MPI wants a valid pointer even for zero elements
  void* out = entry.output ? entry.output : &empty;
  MPI_Request request;
  status = CompleteRequest(MPI_Ireduce_scatter(send ? send : &empty, out, counts.data(),
                                               MpiDatatype(dtype), op, ctx.comm, &request),
                           &request, "MPI_Ireduce_scatter");
  if (!status.ok()) return status;
  const double average = meta.reduce_op == PERSEUS_AVERAGE ? 1.0 / ctx.size : 1.0;
  CopyScaled(dtype, out, out, counts[ctx.rank], meta.postscale * average);
  return Status::OK();
}

}  // namespace perseus
