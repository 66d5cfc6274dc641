// The host-staged path: a GPU batch runs with the MPI algorithms (collectives/) on
// copies in the lane's pinned host buffer. Used for every GPU batch when
// PERSEUS_GPU_OPERATIONS=mpi or NCCL cannot be loaded (also how several ranks share
// one GPU), and for the batches NCCL cannot run exactly (cuda/nccl/nccl_ops.h, NcclServes).
#ifndef PERSEUS_CUDA_STAGED_OPS_H_
#define PERSEUS_CUDA_STAGED_OPS_H_

#include <vector>

#include "common/batch.h"
#include "cuda/context/device_context.h"

namespace perseus {
namespace gpu {

// Copies the inputs to host (the root's only, for broadcast), waits for them, runs
// the MPI algorithm, and queues the copies of the results back to the device.
// Core-allocated outputs (allgather, alltoall) come back in device memory.
// Collective over ctx.mpi: the ranks first agree that every one staged its inputs.
Status RunStaged(const Batch& batch, DeviceContext& ctx, std::vector<Result>* results);

// PERSEUS_ALLREDUCE_NANCHECK for an NCCL allreduce: copies the inputs to host and
// runs the MPI path's check there, collective over ctx.mpi (the same error on every
// rank). Only called when the check is on.
Status CheckFiniteOnHost(const Batch& batch, DeviceContext& ctx);

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_STAGED_OPS_H_
