// A rank of the job failed (its process ended) under ULFM (mpi/fault_tolerance.h):
// what the engine does about it, in one place.
//
// Any status that reports a process failure (a negotiation round's, a lane's
// collective's) is noted, from whichever thread sees it first. The engine's next step
// then declares the failure once: it revokes every communicator the engine made, so
// that every rank blocked with the dead peer, or not aware of it yet, finds out;
// names the failed ranks; and every request of this world fails with that error
// (PERSEUS_RANK_FAILED), the ones in flight included. Nothing more runs in this world:
// shutdown keeps its communicator, and the next init forms the world of the survivors
// from it (MPIX_Comm_shrink, in c_api.cc). Without ULFM a process failure ends the job
// (MPI's default), and nothing here is used.
#ifndef PERSEUS_RANK_FAILURE_H_
#define PERSEUS_RANK_FAILURE_H_

#include <mpi.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "common/status.h"

namespace perseus {

class RankFailure {
 public:
  explicit RankFailure(bool fault_tolerant) : enabled_(fault_tolerant) {}

  // Whether this run outlives a rank (mpirun --with-ft ulfm on a ULFM build).
  bool enabled() const { return enabled_; }
  // Notes `status`; true when it reports a process failure in a fault-tolerant run:
  // the engine must then Declare (at its next step).
  bool Note(const Status& status);
  // A failure was noted and not declared yet.
  bool pending() const { return noted_.load() && !declared_.load(); }
  bool noted() const { return noted_.load(); }
  bool declared() const { return declared_.load(); }
  // Revokes `comms` and builds the error every request of this world fails with,
  // naming the failed ranks of `world` (its ranks are the global ones).
  Status Declare(MPI_Comm world, const std::vector<MPI_Comm>& comms);
  Status error();

 private:
  const bool enabled_;
  std::atomic<bool> noted_{false}, declared_{false};
  std::mutex mu_;
  Status first_;  // the first failure noted: where it was seen
  Status error_;
};

}  // namespace perseus

#endif  // PERSEUS_RANK_FAILURE_H_
