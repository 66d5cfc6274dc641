// The device lane: a lane for GPU batches, its own thread running them through a
// DeviceRunner (cuda/device_runner.h: NCCL on the lane's CUDA stream, or host-staged
// through MPI), which opens with the set's other members at the lane's first batch.
#ifndef PERSEUS_LANES_DEVICE_LANE_H_
#define PERSEUS_LANES_DEVICE_LANE_H_

#include <memory>

#include "cuda/device_backend.h"
#include "cuda/device_runner.h"
#include "cuda/context/launch_order.h"
#include "lane_api/lane_factory.h"
#include "lanes/lane_worker.h"

namespace perseus {

class DeviceLane : public Lane {
 public:
  // `thread_multiple`: MPI_THREAD_MULTIPLE, without which every batch fails. `turns`:
  // the launch order shared by the set's device lanes.
  DeviceLane(const LaneSpec& spec, bool thread_multiple, const GpuSettings& settings,
             std::shared_ptr<gpu::LaunchSequence> turns);
  ~DeviceLane() override;  // finishes queued batches, waits for the stream, frees all
  void Push(Batch batch) override;
  bool TryRunInline(const Batch& batch) override;
  void Abort(const Status& why) override { runner_.Abort(why); }

 private:
  void Execute(const Batch& batch);

  const int index_;
  BatchDone done_;
  gpu::DeviceRunner runner_;
  LaneWorker worker_;  // last: its thread stops before the members above go
};

}  // namespace perseus

#endif  // PERSEUS_LANES_DEVICE_LANE_H_
