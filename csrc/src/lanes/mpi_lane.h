// The MPI lane: one worker thread with its own duplicated communicator, running the
// MPI collectives (collectives/) on host buffers.
#ifndef PERSEUS_LANES_MPI_LANE_H_
#define PERSEUS_LANES_MPI_LANE_H_

#include <mpi.h>

#include <memory>
#include <vector>

#include "lane_api/lane.h"
#include "lanes/lane_worker.h"
#include "mpi/node_comms.h"

namespace perseus {

class MpiLane : public Lane {
 public:
  // `global_ranks` (the set's, outliving the lane) name ranks in error messages;
  // `index` (0 .. lanes-1 within the set) names the lane in the timeline.
  MpiLane(int index, MPI_Comm comm, int rank, int size, int64_t chunk_bytes, bool nan_check,
          int wire_dtype, std::unique_ptr<NodeComms> nodes, const std::vector<int>* global_ranks,
          BatchDone done);
  ~MpiLane() override;  // finishes queued batches, then stops
  void Push(Batch batch) override;
  bool TryRunInline(const Batch& batch) override;

 private:
  void Execute(const Batch& batch);

  const int index_;
  MPI_Comm comm_;
  int rank_, size_;
  int64_t chunk_bytes_;
  bool nan_check_;
  int wire_dtype_;  // PERSEUS_ALLREDUCE_DTYPE; -1 = none
  std::unique_ptr<NodeComms> nodes_;  // PERSEUS_ALLREDUCE_MODE=hierarchical; null = flat
  const std::vector<int>* global_ranks_;
  BatchDone done_;
  std::vector<char> scratch_;
  LaneWorker worker_;  // last: its thread stops before the members above go
};

}  // namespace perseus

#endif  // PERSEUS_LANES_MPI_LANE_H_
