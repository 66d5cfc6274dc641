// The one switch from a batch's operation to its MPI algorithm, shared by the MPI
// lane and by the host-staged path of the device lanes.
#include "collectives/collectives.h"
#include "collectives/nan_check.h"
#include "common/dtype.h"

namespace perseus {

namespace {

Status RunReduction(const Batch& batch, ExecContext& ctx) {
  return batch.items[0].meta.reduce_op == PERSEUS_ADASUM ? RunAdasum(batch, ctx)
                                                         : RunAllreduce(batch, ctx);
}

// PERSEUS_ALLREDUCE_NANCHECK: the items holding NaN/Inf on some rank fail alone, the
// same on every rank; the others are reduced as if the bad ones had not been fused.
Status RunCheckedReduction(const Batch& batch, ExecContext& ctx, std::vector<Status>* statuses) {
  if (!ctx.nan_check || !IsFloatingDtype(batch.items[0].meta.dtype))
    return RunReduction(batch, ctx);
  std::vector<Status> verdicts;
  Status status = FindNonFinite(batch, ctx, &verdicts);
  if (!status.ok()) return status;
  Batch clean;
  clean.agreed = batch.agreed;
  for (size_t i = 0; i < batch.items.size(); ++i)
    if (verdicts[i].ok()) clean.items.push_back(batch.items[i]);
  if (clean.items.size() == batch.items.size()) return RunReduction(batch, ctx);
  if (!clean.items.empty()) status = RunReduction(clean, ctx);
  if (status.ok()) *statuses = std::move(verdicts);
  return status;
}

}  // namespace

Status RunMpiBatch(const Batch& batch, ExecContext& ctx, std::vector<Result>* results,
                   std::vector<Status>* statuses) {
  statuses->assign(batch.items.size(), Status::OK());
  switch (batch.op_type()) {
    case PERSEUS_ALLREDUCE: return RunCheckedReduction(batch, ctx, statuses);
    case PERSEUS_BROADCAST: return RunBroadcast(batch, ctx);
    case PERSEUS_ALLGATHER: return RunAllgather(batch.items[0], ctx, &(*results)[0]);
    case PERSEUS_ALLTOALL: return RunAlltoall(batch.items[0], ctx, &(*results)[0]);
    case PERSEUS_REDUCESCATTER: return RunReducescatter(batch.items[0], ctx);
    case PERSEUS_BARRIER: return RunBarrier(ctx);
    default: return Status::Error(PERSEUS_INTERNAL_ERROR, "lane got an unknown operation");
  }
}

}  // namespace perseus
