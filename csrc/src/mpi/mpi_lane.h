// The MPI lane: one worker thread with its own duplicated communicator, running the
// MPI collectives (collectives/) on host buffers.
#ifndef PERSEUS_MPI_MPI_LANE_H_
#define PERSEUS_MPI_MPI_LANE_H_

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/lane.h"

namespace perseus {

class MpiLane : public Lane {
 public:
  // `global_ranks` (the set's, outliving the lane) name ranks in error messages;
  // `index` (0 .. lanes-1 within the set) names the lane in the timeline.
  MpiLane(int index, MPI_Comm comm, int rank, int size, int64_t chunk_bytes, bool nan_check,
       const std::vector<int>* global_ranks, BatchDone done);
  ~MpiLane() override;  // finishes queued batches, then stops
  void Push(Batch batch) override;
  bool TryRunInline(const Batch& batch) override;

 private:
  void Run();
  void Execute(const Batch& batch);

  // Records the batch's QUEUED and execution spans on each tensor's track.
  void Trace(const Batch& batch, std::chrono::steady_clock::time_point start,
             std::chrono::steady_clock::time_point end) const;

  const int index_;
  MPI_Comm comm_;
  int rank_, size_;
  int64_t chunk_bytes_;
  bool nan_check_;
  const std::vector<int>* global_ranks_;
  BatchDone done_;
  std::vector<char> scratch_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  bool stop_ = false;
  bool busy_ = false;  // a batch is executing, on the lane thread or inline
  std::thread thread_;
};

}  // namespace perseus

#endif  // PERSEUS_MPI_MPI_LANE_H_
