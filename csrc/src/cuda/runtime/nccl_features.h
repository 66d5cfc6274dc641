// What the NCCL in use can do beyond what every lane needs, and what Perseus takes of
// it: one place for the versions and for NCCL's own environment variables these
// depend on (read here, not in the config table: they are NCCL's, read by NCCL too).
#ifndef PERSEUS_CUDA_NCCL_FEATURES_H_
#define PERSEUS_CUDA_NCCL_FEATURES_H_

#include <string>

namespace perseus {
namespace gpu {

// Several ranks on one GPU: NCCL 2.30 and later allow it when NCCL_MULTI_RANK_GPU_ENABLE=1
// (NCCL 2.30 release notes; forcing NCCL_NVLS_ENABLE=1 with it is an error). Earlier
// versions refuse ("Duplicate GPU detected"), and the lanes then run host-staged.
constexpr int kNcclMultiRankGpu = 23000;
// Launch order implicit (cuda/context/launch_order.h): NCCL 2.26 reads
// NCCL_LAUNCH_ORDER_IMPLICIT from the environment, for every communicator of the library
// in the process; NCCL 2.31 also takes it per communicator
// (ncclConfig_t.launchOrderImplicit), which the environment variable, when set, overrides.
constexpr int kNcclLaunchOrderEnv = 22600;
constexpr int kNcclLaunchOrderConfig = 23100;
// Nonblocking communicators (NCCL 2.14: ncclCommInitRankConfig with config.blocking = 0):
// the creation returns at once, ncclCommGetAsyncError says ncclInProgress until it ends,
// and ncclCommAbort may end it meanwhile (cuda/nccl/nccl_comm.h).
constexpr int kNcclNonblocking = 21400;

struct NcclChoice {
  bool yes;
  std::string why;  // for perseusrun --check-build and warnings
};

// Whether ranks that share a GPU may run NCCL here (this process's view: every rank
// that shares the GPU must say yes).
NcclChoice MultiRankGpu(int nccl_version);

// Whether Perseus makes its communicators with launchOrderImplicit=1, and what makes the
// launch order the GPU's order otherwise.
NcclChoice LaunchOrderPerCommunicator(int nccl_version);

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_NCCL_FEATURES_H_
