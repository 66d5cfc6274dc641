#include "cuda/nccl/nccl_pair.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>

#include "cuda/context/launch_order.h"
#include "cuda/nccl/nccl_comm.h"
#include "cuda/runtime/device_guard.h"
#include "cuda/runtime/event_pool.h"

namespace perseus {
namespace gpu {

void NcclPairs::AbortAll() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_.store(true);
  for (NcclPair* pair : live_) pair->AbortLocked();
}

NcclPair::NcclPair(int device, NcclPairs* all) : device_(device), all_(all) {
  std::lock_guard<std::mutex> lock(all_->mu_);
  all_->live_.push_back(this);
}

// Waits on the host until the stream is idle, or the communicator reports a failure, or
// it was aborted (each poll under the pairs' lock, which an abort takes).
Status NcclPair::Drain() {
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    {
      std::lock_guard<std::mutex> lock(all_->mu_);
      if (aborted_.load()) return Status::Error(PERSEUS_INTERNAL_ERROR, "the pair's communicator was aborted");
      cudaError_t rc = Cuda()->StreamQuery(stream_);
      if (rc == kCudaSuccess) return Status::OK();
      if (rc != kCudaErrorNotReady) return CudaStatus(rc, "cudaStreamQuery (message stream)");
      ncclResult_t async = kNcclSuccess;
      Status status = NcclStatus(Nccl()->CommGetAsyncError(comm_, &async), "ncclCommGetAsyncError", comm_);
      if (status.ok() && async != kNcclSuccess && async != kNcclInProgress)
        status = NcclStatus(async, "NCCL (asynchronous error)", comm_);
      if (!status.ok()) return status;
    }
    if (std::chrono::steady_clock::now() - start > std::chrono::microseconds(200))
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

NcclPair::~NcclPair() {
  Status status;
  std::unique_ptr<DeviceGuard> guard;  // CUDA is loaded once the pair made anything
  if (comm_ != nullptr || stream_ != nullptr) guard = std::make_unique<DeviceGuard>(device_, &status);
  Status drained = comm_ != nullptr && !aborted_.load() ? Drain() : Status::OK();
  {
    std::lock_guard<std::mutex> lock(all_->mu_);  // gone from the pairs before an abort could see it freed
    if (comm_ != nullptr && !aborted_.load()) drained.ok() ? (void)Nccl()->CommDestroy(comm_) : AbortLocked();
    all_->live_.erase(std::remove(all_->live_.begin(), all_->live_.end(), this), all_->live_.end());
  }
  if (stream_ != nullptr) Cuda()->StreamDestroy(stream_);
}

Status NcclPair::NewId(ncclUniqueId* id) { return NcclStatus(Nccl()->GetUniqueId(id), "ncclGetUniqueId"); }

Status NcclPair::Open(const ncclUniqueId& id, int index) {
  Status status;
  DeviceGuard guard(device_, &status);
  index_ = index;
  if (status.ok() && stream_ == nullptr)
    status = CudaStatus(Cuda()->StreamCreateWithFlags(&stream_, kStreamNonBlocking),
                        "cudaStreamCreateWithFlags (messages)");
  // Not in launch order implicit: a message must not wait on the GPU for collectives.
  ncclComm_t made = nullptr;
  if (status.ok()) status = StartNcclComm(2, id, index, NcclCommOptions(), &made);
  {
    std::lock_guard<std::mutex> lock(all_->mu_);  // an abort from now on reaches it
    comm_ = made;
    if (all_->aborted_.load()) AbortLocked();  // the world failed while it was started
  }
  if (status.ok()) {
    status = AwaitNcclComm(made, &all_->mu_, [this] {
      return aborted_.load() ? Status::Error(PERSEUS_INTERNAL_ERROR, "the pair's communicator was aborted")
                             : Status::OK();
    });
  }
  if (!status.ok()) Abort();  // half-made: nothing to wait for
  return status;
}

Status NcclPair::Launch(bool recv, void* data, int64_t bytes, const std::shared_ptr<void>& ready,
                        std::shared_ptr<void>* done) {
  if (!open()) return Status::Error(PERSEUS_INTERNAL_ERROR, "the pair's NCCL communicator is not open");
  Status status;
  DeviceGuard guard(device_, &status);
  if (status.ok() && ready)
    status = CudaStatus(Cuda()->StreamWaitEvent(stream_, AsEvent(ready), 0), "cudaStreamWaitEvent (message ready)");
  if (status.ok()) {
    SoloLaunch alone;
    const int peer = 1 - index_;
    const size_t count = static_cast<size_t>(bytes);
    status = recv ? NcclLaunched(Nccl()->Recv(data, count, kNcclUint8, peer, comm_, stream_), "ncclRecv", comm_,
                                 &aborted_)
                  : NcclLaunched(Nccl()->Send(data, count, kNcclUint8, peer, comm_, stream_), "ncclSend", comm_,
                                 &aborted_);
  }
  if (status.ok()) status = AcquireEvent(device_, done);
  if (status.ok())
    status = CudaStatus(Cuda()->EventRecord(AsEvent(*done), stream_), "cudaEventRecord (message done)");
  return status;
}

void NcclPair::Abort() {
  std::lock_guard<std::mutex> lock(all_->mu_);
  AbortLocked();
}

void NcclPair::AbortLocked() {
  if (comm_ == nullptr || aborted_.load()) return;
  aborted_.store(true);  // first: a call of the messages' thread returning meanwhile leaves it alone
  Status status;
  DeviceGuard guard(device_, &status);
  Nccl()->CommAbort(comm_);  // never ncclCommDestroy: on a broken communicator it can hang
}

}  // namespace gpu
}  // namespace perseus
