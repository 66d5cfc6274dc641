// The launch rounds' exchange: one non-blocking MIN-allreduce over the world per
// round, of, per set id, the GPU batches this rank has agreed in that set (a
// non-member says "any"), so the result is, per set, what every member has agreed.
// What the rounds are for, when they run and what is done with their outcome is
// LaunchOrder's (engine/launch_order.h); this class only carries a round.
//
// The slot count is agreed by the previous round (a set registered on one rank but
// not yet on another waits a round), and any rank may end the rounds (shutdown):
// every rank then stops after the same round.
#ifndef PERSEUS_LAUNCH_ROUNDS_H_
#define PERSEUS_LAUNCH_ROUNDS_H_

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace perseus {

class LaunchRounds {
 public:
  static constexpr uint64_t kAny = UINT64_MAX;  // a set this rank is not a member of

  // `comm`: a duplicate of the world, owned from here on.
  explicit LaunchRounds(MPI_Comm comm);
  ~LaunchRounds();
  LaunchRounds(const LaunchRounds&) = delete;
  LaunchRounds& operator=(const LaunchRounds&) = delete;

  bool in_flight() const { return request_ != MPI_REQUEST_NULL; }
  bool ended() const { return ended_; }
  // Posts the next round. `agreed[s]`: the GPU batches this rank has agreed in set s
  // (kAny where it is not a member or does not know s). `leaving`: the rounds end after
  // this one, on every rank.
  Status Start(const std::vector<uint64_t>& agreed, bool leaving);
  // Tests the round in flight, never blocking. Once it is done: true, and *agreed[s]
  // is what every member of set s has agreed (kAny: no member spoke for s yet);
  // *changed: whether that differs from the round before (the same on every rank).
  bool Test(std::vector<uint64_t>* agreed, bool* changed, Status* error);
  // A peer is lost: the round in flight is left to MPI, which may still write its
  // buffers (they are leaked), and no other starts.
  void Abandon();

 private:
  MPI_Comm comm_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::vector<uint64_t>* send_;  // heap: left behind by Abandon
  std::vector<uint64_t>* recv_;
  size_t slots_;  // sets the round carries, agreed by the round before
  std::vector<uint64_t> last_;  // the last round's outcome
  bool ended_ = false, abandoned_ = false;
};

}  // namespace perseus

#endif  // PERSEUS_LAUNCH_ROUNDS_H_
