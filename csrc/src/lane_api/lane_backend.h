// What the C ABI hands Engine::Start: the lanes' side of the core, in four parts, each
// an interface of its own so that the engine knows no transport. lanes/core_lanes.h
// makes the core's.
#ifndef PERSEUS_LANE_API_LANE_BACKEND_H_
#define PERSEUS_LANE_API_LANE_BACKEND_H_

#include <memory>

#include "lane_api/device_messages.h"
#include "lane_api/gpu_enqueue.h"
#include "lane_api/lane_factory.h"
#include "lane_api/launch_port.h"

namespace perseus {

struct LaneBackend {
  std::unique_ptr<LaneFactory> lanes;    // makes every set's lanes
  std::unique_ptr<GpuEnqueue> gpu;       // the GPU work of enqueue
  std::unique_ptr<LaunchPort> launches;  // the order of GPU launches across sets
  std::unique_ptr<DeviceMessages> messages;  // point-to-point messages of GPU memory
};

}  // namespace perseus

#endif  // PERSEUS_LANE_API_LANE_BACKEND_H_
