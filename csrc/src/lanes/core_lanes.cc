#include "lanes/core_lanes.h"

#include <utility>
#include <vector>

#include "lanes/device_lane.h"
#include "lanes/device_messages.h"
#include "lanes/mpi_lane.h"
#include "mpi/node_comms.h"

namespace perseus {

namespace {

class CoreLanes : public LaneFactory {
 public:
  CoreLanes(const MpiLaneSettings& mpi, const GpuSettings& gpu, bool thread_multiple,
            std::shared_ptr<gpu::CrossSetOrder> across)
      : mpi_(mpi), gpu_(gpu), thread_multiple_(thread_multiple), across_(std::move(across)) {}

  Status MakeHostLane(const LaneSpec& spec, std::unique_ptr<Lane>* out) override {
    std::unique_ptr<NodeComms> nodes;
    if (mpi_.hierarchical) {
      Status status = OpenNodeComms(spec.comm, (*spec.global_ranks)[spec.rank],
                                    mpi_.ranks_per_node, spec.index == 0, &nodes);
      if (!status.ok()) return status;
    }
    *out = std::make_unique<MpiLane>(spec.index, spec.comm, spec.rank, spec.size,
                                     mpi_.chunk_bytes, mpi_.nan_check, mpi_.wire_dtype,
                                     std::move(nodes), spec.global_ranks, spec.done);
    return Status::OK();
  }

  std::vector<std::unique_ptr<Lane>> MakeDeviceLanes(const std::vector<LaneSpec>& specs) override {
    // The set's, shared by its lanes.
    auto turns = std::make_shared<gpu::LaunchSequence>(specs.empty() ? 0 : specs[0].set_id, across_);
    std::vector<std::unique_ptr<Lane>> lanes;
    for (const LaneSpec& spec : specs) lanes.push_back(std::make_unique<DeviceLane>(spec, thread_multiple_, gpu_, turns));
    return lanes;
  }

 private:
  const MpiLaneSettings mpi_;
  const GpuSettings gpu_;
  const bool thread_multiple_;
  const std::shared_ptr<gpu::CrossSetOrder> across_;  // shared with the launch port
};

class CoreGpuEnqueue : public GpuEnqueue {
 public:
  explicit CoreGpuEnqueue(const GpuSettings& gpu) : gpu_(gpu) {}
  void WarmGpu() override { perseus::WarmGpu(gpu_); }
  Status PrepareGpuEntry(Entry* entry, ReadyEvents* call) override {
    return perseus::PrepareGpuEntry(entry, gpu_, call);
  }

 private:
  const GpuSettings gpu_;
};

// Hands the engine's grants to the order every set's device lanes launch in.
class CoreLaunchPort : public LaunchPort {
 public:
  CoreLaunchPort(const GpuSettings& gpu, std::shared_ptr<gpu::CrossSetOrder> across)
      : gpu_(gpu), across_(std::move(across)) {}
  bool MayUseGpu() override { return CudaLoads(gpu_); }
  void Begin(int64_t ungated) override { across_->Begin(ungated); }
  void Grant(const std::vector<LaunchGrant>& grants) override { across_->Grant(grants); }
  void End() override { across_->End(); }

 private:
  const GpuSettings gpu_;
  const std::shared_ptr<gpu::CrossSetOrder> across_;
};

}  // namespace

LaneBackend MakeCoreLanes(const MpiLaneSettings& mpi, const GpuSettings& gpu, bool thread_multiple) {
  auto across = std::make_shared<gpu::CrossSetOrder>();
  LaneBackend backend;
  backend.lanes = std::make_unique<CoreLanes>(mpi, gpu, thread_multiple, across);
  backend.gpu = std::make_unique<CoreGpuEnqueue>(gpu);
  backend.launches = std::make_unique<CoreLaunchPort>(gpu, std::move(across));
  backend.messages = std::make_unique<NcclDeviceMessages>(gpu, thread_multiple);
  return backend;
}

}  // namespace perseus
