// A lane: an execution stream that runs agreed batches in the order they are queued.
// Every rank queues the same batches to the same lane in the same order, so lanes
// never need to agree on anything themselves. The engine sees only this interface;
// the lanes in lanes/ (MPI for CPU tensors, device lanes for GPU tensors) implement it,
// and a LaneFactory (lane_api/lane_factory.h) makes them.
#ifndef PERSEUS_LANE_API_LANE_H_
#define PERSEUS_LANE_API_LANE_H_

#include <functional>
#include <vector>

#include "common/batch.h"
#include "common/result.h"
#include "common/status.h"

namespace perseus {

// Called on the lane's thread when a batch finishes: one status and result per item.
using BatchDone = std::function<void(const Batch&, const std::vector<Status>&,
                                     std::vector<Result>&)>;

class Lane {
 public:
  virtual ~Lane() = default;  // an implementation finishes queued batches, then stops
  virtual void Push(Batch batch) = 0;
  // Runs `batch` on the calling thread when the lane is idle with nothing queued
  // (so the order on its communicator is unchanged); false when it is busy.
  virtual bool TryRunInline(const Batch& batch) = 0;
  // The world failed (a rank's process ended, ULFM): ends what the lane runs with the
  // dead peer on resources of its own that MPI's revoke does not reach (a device lane
  // aborts its NCCL communicator, which ends a kernel waiting for that peer), so that
  // its thread, and the lane's destruction, never wait for the dead; this batch and
  // later ones fail with `why`. Any thread, once; an MPI lane needs nothing (its
  // communicators are revoked).
  virtual void Abort(const Status& why) { (void)why; }
};

}  // namespace perseus

#endif  // PERSEUS_LANE_API_LANE_H_
