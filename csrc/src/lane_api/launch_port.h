// The device lanes' side of the order of GPU launches across process sets: what the
// engine's LaunchOrder (engine/launch_order.h) tells them, on the thread that steps
// the engine. The core's port hands it to the lanes' gpu::CrossSetOrder
// (cuda/context/launch_order.h; made in lanes/core_lanes.h).
#ifndef PERSEUS_LANE_API_LAUNCH_PORT_H_
#define PERSEUS_LANE_API_LAUNCH_PORT_H_

#include <cstdint>
#include <vector>

#include "common/batch.h"

namespace perseus {

class LaunchPort {
 public:
  virtual ~LaunchPort() = default;

  // Whether this rank could ever run GPU work (a CUDA runtime loads).
  virtual bool MayUseGpu() = 0;
  // Batches marked launch_gated from now on wait for grants, after the first `ungated`
  // GPU batches of the global set.
  virtual void Begin(int64_t ungated) = 0;
  // Appends grants, in the order this rank launches them.
  virtual void Grant(const std::vector<LaunchGrant>& grants) = 0;
  // No more grants: gated batches launch in their own set's order only.
  virtual void End() = 0;
};

}  // namespace perseus

#endif  // PERSEUS_LANE_API_LAUNCH_PORT_H_
