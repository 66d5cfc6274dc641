// Making an NCCL communicator, for a device lane (cuda/device_runner.h) or a pair of
// ranks' messages (nccl_pair.h): one place for how it is made.
//
// NCCL's creation waits for every rank of the communicator (its bootstrap): a rank that
// dies meanwhile leaves the others inside it for good, and a blocking ncclCommInitRank
// gives its caller nothing to abort. So where the job outlives a rank (FaultTolerant():
// mpirun --with-ft ulfm) and NCCL has nonblocking communicators (2.14 and later), the
// communicator is made nonblocking (config.blocking = 0): StartNcclComm returns at once
// with the communicator, which the maker publishes where an abort reaches it, and
// AwaitNcclComm polls ncclCommGetAsyncError until the creation ends, or until the maker
// says stop (the world failed), after which the maker aborts it (ncclCommAbort, which
// NCCL allows during creation). Its launches may then answer ncclInProgress, which
// NcclLaunched (cuda/runtime/cuda_api.h) waits out. Elsewhere (no ULFM: a dead rank ends
// the job anyway) communicators stay blocking, as before.
#ifndef PERSEUS_CUDA_NCCL_NCCL_COMM_H_
#define PERSEUS_CUDA_NCCL_NCCL_COMM_H_

#include <functional>
#include <mutex>

#include "common/status.h"
#include "cuda/runtime/cuda_api.h"

namespace perseus {
namespace gpu {

struct NcclCommOptions {
  const char* name = nullptr;          // NCCL 2.31+ names the communicator in its logs
  bool launch_order_implicit = false;  // cuda/runtime/nccl_features.h's LaunchOrderPerCommunicator
};

// Whether communicators are made nonblocking here (the header says when), and why.
bool NonblockingComms();

// Starts making rank `rank` of `nranks` of the communicator `id` names; *comm is the
// communicator (still being made when nonblocking, made when not). Call on the lane's
// device. An error leaves *comm null.
Status StartNcclComm(int nranks, const ncclUniqueId& id, int rank, const NcclCommOptions& options,
                     ncclComm_t* comm);

// Waits until `comm`, from StartNcclComm, is made: OK, or its creation's error, or the
// error `stop` returns. `stop` is asked before each poll, both under `*guard`, so that
// an abort taken under that lock never meets a poll. After an error the caller aborts
// `comm` (never ncclCommDestroy), unless its abort did already.
Status AwaitNcclComm(ncclComm_t comm, std::mutex* guard, const std::function<Status()>& stop);

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_NCCL_NCCL_COMM_H_
