// The device lane: runs GPU batches on its own CUDA stream, in the order the engine
// queued them (the same on every rank), with an NCCL communicator of its own or
// host-staged through its own MPI communicator.
//
// It opens at its first batch, together with the set's other members: every rank
// says whether it can use its GPU and NCCL, and all agree (AgreeOnStatus) before
// any NCCL call, so a rank that cannot load CUDA fails the batch on every rank
// instead of leaving its peers inside ncclCommInitRank. A failed opening is retried
// at the next batch, again by every rank. Then set rank 0 makes an ncclUniqueId,
// broadcasts it over MPI, and all call ncclCommInitRank.
//
// Per batch: the stream waits for each input's ready event (recorded at enqueue on
// the framework's stream), the operation's device work is queued, a completion event
// is recorded, and the handles complete at once, carrying that event: no host wait
// on the NCCL path. After an NCCL or CUDA failure mid-batch the communicator is
// aborted and the lane fails its later batches, rather than hang.
#ifndef PERSEUS_CUDA_DEVICE_LANE_H_
#define PERSEUS_CUDA_DEVICE_LANE_H_

#include <vector>

#include "cuda/device_backend.h"
#include "cuda/device_buffers.h"
#include "cuda/device_context.h"
#include "engine/lane_worker.h"

namespace perseus {
namespace gpu {

class DeviceLane : public Lane {
 public:
  explicit DeviceLane(DeviceLaneArgs args);
  ~DeviceLane() override;  // finishes queued batches, waits for the stream, frees all
  void Push(Batch batch) override;
  bool TryRunInline(const Batch& batch) override;

 private:
  enum class Mode { kClosed, kNccl, kStaged, kBroken };

  void Execute(const Batch& batch);
  Status Open();
  Status OpenNccl();
  Status Run(const Batch& batch, std::vector<Result>* results);
  void Break(const Status& why);
  void Close();
  void DropStream();
  DeviceContext Context();

  DeviceLaneArgs args_;
  Mode mode_ = Mode::kClosed;  // touched only by the thread running a batch
  Status broken_;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  DeviceBuffer fusion_;
  HostBuffer host_;
  std::vector<char> scratch_;
  LaneWorker worker_;  // last: its thread stops before the members above go
};

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_DEVICE_LANE_H_
