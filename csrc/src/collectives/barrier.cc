#include "collectives/collectives.h"
#include "mpi/wait_policy.h"

namespace perseus {

Status RunBarrier(ExecContext& ctx) {
  MPI_Request request;
  return CompleteRequest(MPI_Ibarrier(ctx.comm, &request), &request, "MPI_Ibarrier");
}

}  // namespace perseus
