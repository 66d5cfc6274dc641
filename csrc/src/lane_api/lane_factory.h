// How the engine gets its lanes without knowing a transport: the C ABI hands it a
// LaneFactory (lanes/core_lanes.h), which makes the MPI and device lanes, and nothing
// else. The engine includes no CUDA, NCCL or lane header.
#ifndef PERSEUS_LANE_API_LANE_FACTORY_H_
#define PERSEUS_LANE_API_LANE_FACTORY_H_

#include <mpi.h>

#include <memory>
#include <vector>

#include "common/batch.h"
#include "common/status.h"
#include "lane_api/lane.h"

namespace perseus {

// One lane of a process set, as the engine describes it.
struct LaneSpec {
  int index;             // 0 .. lanes-1 within the set and kind (timeline, messages)
  MPI_Comm comm;         // the lane's own communicator over the set, duplicated for it
  int rank, size;        // within the set
  const std::vector<int>* global_ranks;  // the set's, outliving the lane
  BatchDone done;
  int set_id = 0;        // the process set's (names, messages)
};

class LaneFactory {
 public:
  virtual ~LaneFactory() = default;

  // A lane for CPU tensors. May make collective calls on spec.comm (hierarchical
  // mode splits it by node), so every member makes its lanes in the same order.
  virtual Status MakeHostLane(const LaneSpec& spec, std::unique_ptr<Lane>* out) = 0;
  // The lanes for a set's GPU tensors, one per spec, made together: they launch their
  // batches in the set's agreed order (Batch::launch_turn). Each opens, with the set's
  // other members, at its first batch.
  virtual std::vector<std::unique_ptr<Lane>> MakeDeviceLanes(const std::vector<LaneSpec>& specs) = 0;
};

}  // namespace perseus

#endif  // PERSEUS_LANE_API_LANE_FACTORY_H_
