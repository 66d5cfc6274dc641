// Allreduce over MPI. One large tensor is reduced in place in chunks; several small
// ones are fused window by window through the lane's scratch buffer.
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/fused_windows.h"
#include "common/dtype.h"
#include "mpi/wait_policy.h"

namespace perseus {

Status RunAllreduce(const Batch& batch, ExecContext& ctx) {
  const TensorMeta& head = batch.items.front().meta;
  const int dtype = head.dtype;
  const size_t esize = DtypeSize(dtype);
  const MPI_Datatype mpi_type = MpiDatatype(dtype);
  MPI_Op op;
  Status status = MpiReduceOp(dtype, head.reduce_op, &op);
  if (!status.ok()) return status;
  const double average = head.reduce_op == PERSEUS_AVERAGE ? 1.0 / ctx.size : 1.0;
  const int64_t window = std::max<int64_t>(1, ctx.chunk_bytes / esize);

  auto reduce_in_place = [&](char* data, int64_t count) {
    MPI_Request request;
    return CompleteRequest(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), mpi_type,
                                          op, ctx.comm, &request),
                           &request, "MPI_Iallreduce");
  };

  const BatchItem& only = batch.items.front();
  if (batch.items.size() == 1 && only.entry) {
    // Straight on the output tensor: no staging copy.
    const int64_t n = head.NumElements();
    char* out = static_cast<char*>(only.entry->output);
    CopyScaled(dtype, out, only.entry->input, n, head.prescale);
    for (int64_t begin = 0; begin < n; begin += window) {
      status = reduce_in_place(out + begin * esize, std::min(window, n - begin));
      if (!status.ok()) return status;
    }
    CopyScaled(dtype, out, out, n, head.postscale * average);
    return Status::OK();
  }

  int64_t total = 0;
  for (const BatchItem& item : batch.items) total += item.meta.NumElements();
  ctx.scratch->resize(std::max<size_t>(ctx.scratch->size(), std::min(total, window) * esize));
  char* buffer = ctx.scratch->data();
  return ForEachWindow(
      batch, window,
      [&](const BatchItem& item, int64_t from, int64_t to, int64_t count) {
        char* dst = buffer + to * esize;
        if (item.entry) {  // a joined rank contributes zeros
          const char* src = static_cast<const char*>(item.entry->input) + from * esize;
          CopyScaled(dtype, dst, src, count, item.meta.prescale);
        } else {
          std::memset(dst, 0, count * esize);
        }
      },
      [&](int64_t count) { return reduce_in_place(buffer, count); },
      [&](const BatchItem& item, int64_t from, int64_t to, int64_t count) {
        if (!item.entry) return;
        char* dst = static_cast<char*>(item.entry->output) + from * esize;
        CopyScaled(dtype, dst, buffer + to * esize, count, item.meta.postscale * average);
      });
}

}  // namespace perseus
