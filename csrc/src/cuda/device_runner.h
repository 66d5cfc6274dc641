// What a device lane (lanes/device_lane.h) runs: GPU batches on one CUDA stream of
// its own, in the order the engine queued them (the same on every rank), with an
// NCCL communicator of its own or host-staged through its own MPI communicator.
//
// It opens at its first batch, together with the set's other members: every rank
// says whether it can use its GPU and NCCL, and all agree (AgreeOnStatus) before
// any NCCL call, so a rank that cannot load CUDA fails the batch on every rank
// instead of leaving its peers inside ncclCommInitRank. A failed opening is retried
// at the next batch, again by every rank. Then set rank 0 makes an ncclUniqueId,
// broadcasts it over MPI, and all call ncclCommInitRank.
//
// Ranks that share a GPU use NCCL where every one of them can (NCCL 2.30+ with
// NCCL_MULTI_RANK_GPU_ENABLE=1, cuda/runtime/nccl_features.h); otherwise they run host-staged,
// with one warning saying why.
//
// Per batch: the stream waits for each input's ready event (recorded at enqueue on
// the framework's stream), the operation's device work is queued in the batch's
// launch turn (cuda/context/launch_order.h), a completion event is recorded, and the handles
// complete at once, carrying that event: no host wait on the NCCL path. After an NCCL or CUDA failure mid-batch the communicator is
// aborted and the runner fails its later batches, rather than hang.
#ifndef PERSEUS_CUDA_DEVICE_RUNNER_H_
#define PERSEUS_CUDA_DEVICE_RUNNER_H_

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/batch.h"
#include "common/result.h"
#include "cuda/device_backend.h"
#include "cuda/context/device_buffers.h"
#include "cuda/context/device_context.h"
#include "cuda/context/launch_order.h"

namespace perseus {
namespace gpu {

struct DeviceRunnerArgs {
  int index;             // the lane's, 0 .. lanes-1 within the set (messages)
  int set_id;            // the process set's (the NCCL communicator's name)
  MPI_Comm comm;         // the lane's own MPI communicator over the set
  int rank, size;        // within the set
  const std::vector<int>* global_ranks;  // the set's, outliving the runner
  bool thread_multiple;  // MPI_THREAD_MULTIPLE (device lanes need it)
  GpuSettings settings;
  std::shared_ptr<LaunchSequence> turns;  // the set's launch order, shared by its device lanes
};

class DeviceRunner {
 public:
  explicit DeviceRunner(DeviceRunnerArgs args);
  ~DeviceRunner();  // waits for the stream, frees all: after the last batch
  DeviceRunner(const DeviceRunner&) = delete;
  DeviceRunner& operator=(const DeviceRunner&) = delete;

  // Opens first if not yet, then queues the batch's device work; `results` (one per
  // item) carry the completion event. Call from one thread at a time.
  Status Execute(const Batch& batch, std::vector<Result>* results);
  // Open (NCCL or host-staged): a batch runs without opening's collective calls
  // (ncclCommInitRank), so it may run on another thread than the lane's.
  bool open() const { return mode_ == Mode::kNccl || mode_ == Mode::kStaged; }
  // The world failed (Lane::Abort): the NCCL communicator is aborted, never destroyed
  // (ncclCommDestroy of a broken communicator can hang), and this batch and later ones
  // fail with `why`. Any thread. A batch being run is given a moment (kAbortGrace) to
  // leave on its own, and its thread then aborts the communicator itself, outside any
  // NCCL call; one still inside after it is blocked in NCCL, waiting for the dead peer,
  // and the communicator is aborted from here, which ends that call (what
  // ncclCommAbort from another thread is for).
  void Abort(const Status& why);

 private:
  enum class Mode { kClosed, kNccl, kStaged, kBroken };

  Status Open();
  Status OpenNccl();
  Status Run(const Batch& batch, LaunchTurn* turn, std::vector<Result>* results);
  void Break(const Status& why);
  void Close();
  void DropStream();
  DeviceContext Context();
  void AbortCommLocked();  // with abort_mu_ held

  DeviceRunnerArgs args_;
  Mode mode_ = Mode::kClosed;  // touched only by the thread running a batch
  Status broken_;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  std::string comm_name_;  // what NCCL 2.31+ names the communicator (its logs)
  DeviceBuffer fusion_;
  HostBuffer host_;
  std::vector<char> scratch_;
  // The abort, against the lane's thread: comm_ is aborted at most once (comm_aborted_,
  // after which nothing calls NCCL with it); running_ while the thread runs a batch.
  std::mutex abort_mu_;
  std::condition_variable left_;  // running_ became false
  bool aborted_ = false, running_ = false;
  std::atomic<bool> comm_aborted_{false};  // read by the lane's thread without the lock
  Status aborted_why_;
};

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_DEVICE_RUNNER_H_
