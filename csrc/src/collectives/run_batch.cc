// The one switch from a batch's operation to its MPI algorithm, shared by the MPI
// lane and by the host-staged path of the device lanes.
#include "collectives/collectives.h"

namespace perseus {

Status RunMpiBatch(const Batch& batch, ExecContext& ctx, std::vector<Result>* results) {
  switch (batch.op_type()) {
    case PERSEUS_ALLREDUCE:
      return batch.items[0].meta.reduce_op == PERSEUS_ADASUM ? RunAdasum(batch, ctx)
                                                             : RunAllreduce(batch, ctx);
    case PERSEUS_BROADCAST: return RunBroadcast(batch, ctx);
    case PERSEUS_ALLGATHER: return RunAllgather(batch.items[0], ctx, &(*results)[0]);
    case PERSEUS_ALLTOALL: return RunAlltoall(batch.items[0], ctx, &(*results)[0]);
    case PERSEUS_REDUCESCATTER: return RunReducescatter(batch.items[0], ctx);
    case PERSEUS_BARRIER: return RunBarrier(ctx);
    default: return Status::Error(PERSEUS_INTERNAL_ERROR, "lane got an unknown operation");
  }
}

}  // namespace perseus
