#include "cuda/nccl/nccl_pair.h"

#include <chrono>
#include <thread>

#include "cuda/context/launch_order.h"
#include "cuda/runtime/device_guard.h"
#include "cuda/runtime/event_pool.h"

namespace perseus {
namespace gpu {

namespace {

// Waits on the host until `stream` is idle, or the communicator reports a failure.
Status Drain(cudaStream_t stream, ncclComm_t comm) {
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    cudaError_t rc = Cuda()->StreamQuery(stream);
    if (rc == kCudaSuccess) return Status::OK();
    if (rc != kCudaErrorNotReady) return CudaStatus(rc, "cudaStreamQuery (message stream)");
    ncclResult_t async = kNcclSuccess;
    Status status = NcclStatus(Nccl()->CommGetAsyncError(comm, &async), "ncclCommGetAsyncError", comm);
    if (status.ok() && async != kNcclSuccess && async != kNcclInProgress)
      status = NcclStatus(async, "NCCL (asynchronous error)", comm);
    if (!status.ok()) return status;
    if (std::chrono::steady_clock::now() - start > std::chrono::microseconds(200))
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

NcclPair::~NcclPair() {
  if (stream_ == nullptr && comm_ == nullptr) return;
  Status status;
  DeviceGuard guard(device_, &status);
  if (comm_ != nullptr) {
    Status drained = Drain(stream_, comm_);
    drained.ok() ? Nccl()->CommDestroy(comm_) : Nccl()->CommAbort(comm_);
  }
  if (stream_ != nullptr) Cuda()->StreamDestroy(stream_);
}

Status NcclPair::NewId(ncclUniqueId* id) { return NcclStatus(Nccl()->GetUniqueId(id), "ncclGetUniqueId"); }

Status NcclPair::Open(const ncclUniqueId& id, int index) {
  Status status;
  DeviceGuard guard(device_, &status);
  if (status.ok() && stream_ == nullptr)
    status = CudaStatus(Cuda()->StreamCreateWithFlags(&stream_, kStreamNonBlocking),
                        "cudaStreamCreateWithFlags (messages)");
  if (status.ok()) status = NcclStatus(Nccl()->CommInitRank(&comm_, 2, id, index), "ncclCommInitRank (messages)");
  if (!status.ok()) comm_ = nullptr;
  index_ = index;
  return status;
}

Status NcclPair::Launch(bool recv, void* data, int64_t bytes, const std::shared_ptr<void>& ready,
                        std::shared_ptr<void>* done) {
  if (comm_ == nullptr) return Status::Error(PERSEUS_INTERNAL_ERROR, "the pair's NCCL communicator is not open");
  Status status;
  DeviceGuard guard(device_, &status);
  if (status.ok() && ready)
    status = CudaStatus(Cuda()->StreamWaitEvent(stream_, AsEvent(ready), 0), "cudaStreamWaitEvent (message ready)");
  if (status.ok()) {
    SoloLaunch alone;
    const int peer = 1 - index_;
    const size_t count = static_cast<size_t>(bytes);
    status = recv ? NcclStatus(Nccl()->Recv(data, count, kNcclUint8, peer, comm_, stream_), "ncclRecv", comm_)
                  : NcclStatus(Nccl()->Send(data, count, kNcclUint8, peer, comm_, stream_), "ncclSend", comm_);
  }
  if (status.ok()) status = AcquireEvent(device_, done);
  if (status.ok())
    status = CudaStatus(Cuda()->EventRecord(AsEvent(*done), stream_), "cudaEventRecord (message done)");
  return status;
}

void NcclPair::Abort() {
  if (comm_ == nullptr) return;
  Status status;
  DeviceGuard guard(device_, &status);
  Nccl()->CommAbort(comm_);
  comm_ = nullptr;
}

}  // namespace gpu
}  // namespace perseus
