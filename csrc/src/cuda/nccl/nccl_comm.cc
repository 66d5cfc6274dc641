#include "cuda/nccl/nccl_comm.h"

#include "cuda/runtime/nccl_features.h"
#include "mpi/fault_tolerance.h"

namespace perseus {
namespace gpu {

bool NonblockingComms() {
  const NcclApi* nccl = Nccl();
  return nccl != nullptr && nccl->CommInitRankConfig != nullptr && nccl->version >= kNcclNonblocking &&
         FaultTolerant();
}

Status StartNcclComm(int nranks, const ncclUniqueId& id, int rank, const NcclCommOptions& options,
                     ncclComm_t* comm) {
  const NcclApi& nccl = *Nccl();
  *comm = nullptr;
  const bool nonblocking = NonblockingComms();
  const bool implicit = options.launch_order_implicit && nccl.CommInitRankConfig != nullptr;
  Status status;
  if (nonblocking || implicit) {
    NcclConfig config = MakeNcclConfig();
    if (nonblocking) config.blocking = 0;
    if (implicit) config.launchOrderImplicit = 1;
    config.commName = options.name;
    // A nonblocking creation may answer ncclInProgress: started, polled by AwaitNcclComm.
    const ncclResult_t rc = nccl.CommInitRankConfig(comm, nranks, id, rank, &config);
    status = NcclStatus(rc == kNcclInProgress ? kNcclSuccess : rc, "ncclCommInitRankConfig");
  } else {
    status = NcclStatus(nccl.CommInitRank(comm, nranks, id, rank), "ncclCommInitRank");
  }
  if (!status.ok()) *comm = nullptr;
  return status;
}

Status AwaitNcclComm(ncclComm_t comm, std::mutex* guard, const std::function<Status()>& stop) {
  // A creation takes milliseconds to seconds: a 1 ms nap between polls.
  return AwaitNcclAsync(comm, "NCCL communicator creation", guard, stop, std::chrono::milliseconds(1));
}

}  // namespace gpu
}  // namespace perseus
