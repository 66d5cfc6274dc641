// What the operations of a device lane work with, and helpers they share.
#ifndef PERSEUS_CUDA_DEVICE_CONTEXT_H_
#define PERSEUS_CUDA_DEVICE_CONTEXT_H_

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "common/result.h"
#include "cuda/runtime/cuda_api.h"
#include "cuda/context/device_buffers.h"
#include "cuda/context/launch_order.h"

#define PERSEUS_RETURN_IF_ERROR(expr)    \
  do {                                   \
    ::perseus::Status _status = (expr);  \
    if (!_status.ok()) return _status;   \
  } while (0)

namespace perseus {
namespace gpu {

struct DeviceContext {
  const CudaApi& cuda;
  const NcclApi* nccl;    // null in host-staged mode
  ncclComm_t comm;        // the lane's NCCL communicator; null in host-staged mode
  cudaStream_t stream;    // the lane's stream, on `device`
  int device;
  MPI_Comm mpi;           // the lane's own MPI communicator (metadata, host-staged work)
  int rank, size;         // within the process set
  const std::vector<int>* global_ranks;
  int64_t chunk_bytes;    // PERSEUS_CHUNK_SIZE, for the MPI algorithms
  bool nan_check;         // PERSEUS_ALLREDUCE_NANCHECK
  DeviceBuffer* fusion;
  HostBuffer* host;
  std::vector<char>* scratch;  // host scratch of the MPI algorithms
  LaunchTurn* turn = nullptr;  // the batch's launch turn (launch_order.h), held around its NCCL calls
  // Set once `comm` was aborted (the world failed; DeviceRunner::Abort, maybe while a
  // call of this batch was in NCCL): nothing may use `comm` after, not even to free
  // what was made with it (ncclRedOpDestroy), which went with it.
  const std::atomic<bool>* comm_aborted = nullptr;
  bool CommAborted() const { return comm_aborted != nullptr && comm_aborted->load(); }

  Status Cu(cudaError_t rc, const char* what) const { return CudaStatus(rc, what); }
  // Every NCCL call of the lane's operations: a launch that NCCL says is in progress
  // (a nonblocking communicator) is waited for here.
  Status Nc(ncclResult_t rc, const char* what) const { return NcclLaunched(rc, what, comm, comm_aborted); }
};

// The batch's NCCL calls, in its launch turn: waits for the turn when made, passes it
// on when gone. Each batch makes its NCCL calls inside one such scope; its packing
// before and unpacking after stay outside, so lanes do that host work side by side.
class LaunchScope {
 public:
  explicit LaunchScope(const DeviceContext& ctx) : turn_(ctx.turn) {
    if (turn_ != nullptr) turn_->Take();
  }
  ~LaunchScope() {
    if (turn_ != nullptr) turn_->Pass();
  }
  LaunchScope(const LaunchScope&) = delete;
  LaunchScope& operator=(const LaunchScope&) = delete;

 private:
  LaunchTurn* turn_;
};

// Waits on the host until the lane's stream is idle. While NCCL work is queued, a
// peer's failure shows as an asynchronous NCCL error rather than as completion: it
// is checked on every pass, so the wait ends with that error instead of hanging.
Status DrainStream(const DeviceContext& ctx);

// Allocates a core-owned output of `bytes` (at least 1) on the lane's stream
// (cudaMallocAsync) into result->data; the caller frees it stream-ordered with
// perseus_free_device_buffer, or the handle table with cudaFree if never taken.
Status AllocateOutput(const DeviceContext& ctx, int64_t bytes, Result* result);

// cudaMemcpyAsync on the lane's stream; no call for zero bytes.
Status CopyAsync(const DeviceContext& ctx, void* dst, const void* src, int64_t bytes, int kind);

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_DEVICE_CONTEXT_H_
