#include "cuda/staged/staged_ops.h"

#include <algorithm>

#include "collectives/collectives.h"
#include "collectives/nan_check.h"
#include "common/dtype.h"
#include "common/request_rules.h"
#include "mpi/mpi_lock.h"

namespace perseus {
namespace gpu {

namespace {

// Where each item's input, and its output where that differs (reducescatter's own
// rows), sit in the pinned buffer.
struct HostLayout {
  std::vector<int64_t> in_at, out_at;
  int64_t bytes = 0;
};

int64_t Aligned(int64_t bytes) { return (bytes + 63) / 64 * 64; }

int64_t OwnScatterBytes(const TensorMeta& m, const DeviceContext& ctx) {
  return ScatterRows(m.shape[0], ctx.rank, ctx.size) * m.RowElements() *
         static_cast<int64_t>(DtypeSize(m.dtype));
}

HostLayout Plan(const Batch& batch, const DeviceContext& ctx) {
  HostLayout layout;
  for (const BatchItem& item : batch.items) {
    layout.in_at.push_back(layout.bytes);
    layout.bytes += Aligned(PayloadBytes(item.meta));
    if (item.meta.op_type == PERSEUS_REDUCESCATTER) {
      layout.out_at.push_back(layout.bytes);
      layout.bytes += Aligned(OwnScatterBytes(item.meta, ctx));
    } else {
      layout.out_at.push_back(layout.in_at.back());  // in place
    }
  }
  return layout;
}

ExecContext MpiContext(DeviceContext& ctx) {
  return ExecContext{ctx.mpi,         ctx.rank,    ctx.size,     ctx.chunk_bytes,
                     ctx.scratch,     ctx.global_ranks, ctx.nan_check};
}

// Queues the device-to-host copies, waits for them, and makes *host: `batch` with
// each entry pointing into the pinned buffer.
Status StageIn(const Batch& batch, DeviceContext& ctx, const HostLayout& layout, Batch* host) {
  const int64_t need = std::max<int64_t>(layout.bytes, 1);
  if (ctx.host->capacity() < static_cast<size_t>(need)) {
    PERSEUS_RETURN_IF_ERROR(DrainStream(ctx));  // queued copies may still use the old block
    PERSEUS_RETURN_IF_ERROR(ctx.host->Reserve(need));
  }
  char* base = ctx.host->data();
  *host = batch;
  for (size_t i = 0; i < host->items.size(); ++i) {
    BatchItem& item = host->items[i];
    if (!item.entry) continue;  // a joined rank: the MPI algorithm adds zeros
    auto staged = std::make_shared<Entry>(*item.entry);
    staged->input = base + layout.in_at[i];
    staged->output = base + layout.out_at[i];
    const bool needed = item.meta.op_type != PERSEUS_BROADCAST || ctx.rank == item.meta.root_rank;
    if (needed)
      PERSEUS_RETURN_IF_ERROR(CopyAsync(ctx, base + layout.in_at[i], item.entry->input,
                                        PayloadBytes(item.meta), kDeviceToHost));
    item.entry = std::move(staged);
  }
  return DrainStream(ctx);
}

// Queues the copies of the results back to the device.
Status StageOut(const Batch& batch, const HostLayout& layout, std::vector<Result>& host_results,
                DeviceContext& ctx, std::vector<Result>* results) {
  char* base = ctx.host->data();
  switch (batch.op_type()) {
    case PERSEUS_ALLREDUCE:
    case PERSEUS_BROADCAST:
      for (size_t i = 0; i < batch.items.size(); ++i) {
        const BatchItem& item = batch.items[i];
        if (item.entry)
          PERSEUS_RETURN_IF_ERROR(CopyAsync(ctx, item.entry->output, base + layout.in_at[i],
                                            PayloadBytes(item.meta), kHostToDevice));
      }
      return Status::OK();
    case PERSEUS_REDUCESCATTER: {
      const BatchItem& item = batch.items[0];
      return CopyAsync(ctx, item.entry->output, base + layout.out_at[0],
                       OwnScatterBytes(item.meta, ctx), kHostToDevice);
    }
    case PERSEUS_ALLGATHER:
    case PERSEUS_ALLTOALL: {
      // The MPI algorithm malloc'd the output: copy it into device memory the caller
      // will own, wait (the copy reads pageable memory), free the host copy.
      Result& staged = host_results[0];
      Result& out = (*results)[0];
      out.shape = staged.shape;
      out.recv_splits = staged.recv_splits;
      const TensorMeta& meta = batch.items[0].meta;
      const int64_t bytes = staged.shape[0] * meta.RowElements() * DtypeSize(meta.dtype);
      Status status = AllocateOutput(ctx, bytes, &out);
      if (status.ok()) status = CopyAsync(ctx, out.data, staged.data, bytes, kHostToDevice);
      if (status.ok()) status = DrainStream(ctx);
      staged.FreeData();
      return status;
    }
    default:
      return Status::Error(PERSEUS_INTERNAL_ERROR, std::string("host-staged ") +
                                                       OpTypeName(batch.op_type()));
  }
}

}  // namespace

Status RunStaged(const Batch& batch, DeviceContext& ctx, std::vector<Result>* results) {
  const HostLayout layout = Plan(batch, ctx);
  Batch host;
  Status staged = StageIn(batch, ctx, layout, &host);
  std::vector<Result> host_results(batch.items.size());
  {
    // A rank that could not stage its inputs must not leave the others inside the
    // MPI collective: all agree first.
    auto mpi = LockMpi();
    PERSEUS_RETURN_IF_ERROR(AgreeOnStatus(ctx.mpi, staged));
    ExecContext ec = MpiContext(ctx);
    std::vector<Status> statuses;  // NaN-checked before staging: never a lone failure here
    Status status = RunMpiBatch(host, ec, &host_results, &statuses);
    for (const Status& s : statuses)
      if (status.ok() && !s.ok()) status = s;
    if (!status.ok()) {
      for (Result& r : host_results) r.FreeData();
      return status;
    }
  }
  return StageOut(batch, layout, host_results, ctx, results);
}

Status CheckFiniteOnHost(const Batch& batch, DeviceContext& ctx) {
  const HostLayout layout = Plan(batch, ctx);
  Batch host;
  Status staged = StageIn(batch, ctx, layout, &host);
  auto mpi = LockMpi();
  PERSEUS_RETURN_IF_ERROR(AgreeOnStatus(ctx.mpi, staged));
  ExecContext ec = MpiContext(ctx);
  return CheckFinite(host, ec);
}

}  // namespace gpu
}  // namespace perseus
