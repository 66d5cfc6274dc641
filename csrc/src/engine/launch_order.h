// The order of GPU collective launches across process sets: one object, which owns the
// sets' launch turns, the gating, the launch rounds, the grants and the wait of the
// batches that wait for them; the engine calls Number, MakeRounds and Step, and the
// stall inspector reads WaitingSince.
//
// Each set's negotiation orders its own GPU batches (Batch::launch_turn, numbered here),
// and the device lanes launch them in that order (cuda/context/launch_order.h). Two sets
// that share ranks negotiate separately, so rank 0 may agree set A's batch before set
// B's and rank 1 the other way round; launched in those orders on GPUs that cannot run
// both kernels at once, each GPU holds the kernel the other rank has not started. A
// set's round runs only when its members have requests, so a rank cannot learn the order
// from another set's rounds. So, once more than one set can have GPU work, every rank
// runs the launch rounds (engine/launch_rounds.h): per set, what every member has
// agreed. Every rank launches what a round makes launchable in (round, set id, turn)
// order: one total order, the same on every rank, which no launch on any rank
// contradicts. When the rounds run is SchedulePolicy's rule 6 (engine/schedule.h).
//
// Threads: Number and Step on the thread that steps the engine (under its step_mu_);
// MakeRounds on a thread adding a process set (under its control_mu_); WaitingSince on
// any thread. No lock of its own.
#ifndef PERSEUS_ENGINE_LAUNCH_ORDER_H_
#define PERSEUS_ENGINE_LAUNCH_ORDER_H_

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "common/batch.h"
#include "common/clock.h"
#include "lane_api/launch_port.h"

namespace perseus {

class LaunchRounds;

// What Step tells the engine.
struct LaunchStep {
  bool busy = false;  // a round is in flight: poll it
  Clock::time_point wake_at = Clock::time_point::max();  // when to step again
  bool over = false;  // no round will run any more: a shutdown may end
};

class LaunchOrder {
 public:
  // `port`: the device lanes' side. `may_order`: more than one rank and
  // MPI_THREAD_MULTIPLE (without it there are no GPU batches); else nothing is gated.
  LaunchOrder(std::unique_ptr<LaunchPort> port, bool may_order);
  ~LaunchOrder();  // frees the rounds' communicator: before MPI may be finalized
  LaunchOrder(const LaunchOrder&) = delete;
  LaunchOrder& operator=(const LaunchOrder&) = delete;

  // Engine::Apply: numbers the GPU batches of a round of set `set_id` in the agreed
  // order, and marks them gated once the order has begun. `begins`: the round is the
  // global set's that agreed the first add_process_set's meeting, the same point of its
  // agreed sequence on every rank; the global set's GPU batches agreed before it launch
  // ungated, and before any gated one.
  void Number(int set_id, bool begins, std::vector<Batch>* batches);

  // Engine::AddProcessSet, after its meeting, on every rank that met (collective over
  // `world`): makes the rounds, unless no rank can load a CUDA runtime (then gated
  // batches launch in their own set's order only). Once; the next Step takes them up.
  void MakeRounds(MPI_Comm world);

  // Engine::Iterate, after the sets' steps: tests the round in flight and grants what it
  // made launchable, then starts the next when rule 6 says so. `sets`: this rank's
  // process sets, by id in ascending order; `leaving`: this rank shuts down and every
  // set has stopped; `driving`: a waiting caller runs the step. A peer given up on
  // (PeerLost) ends the rounds: what waits launches in its own set's order.
  LaunchStep Step(const std::vector<int>& sets, bool leaving, bool driving, Clock::time_point now);

  // A rank of the world failed (engine/rank_failure.h): the next Step ends the rounds,
  // as for a peer given up on.
  void GiveUp() { given_up_.store(true); }

  // Since when GPU batches of this rank have waited for a grant (time_point(): none),
  // from any thread: a wait of the global set for the stall inspector, which a frozen
  // rank anywhere causes.
  Clock::time_point WaitingSince() const {
    return Clock::time_point(Clock::duration(waiting_since_.load(std::memory_order_relaxed)));
  }

 private:
  // A set's GPU batches: numbered (the next one's turn) and granted (turns below may
  // launch).
  struct Turns {
    int64_t numbered = 0, granted = 0;
  };

  // Tests the round in flight; once it is done, grants and sets the next pause. False
  // while it is in flight or once the rounds are over.
  bool Finish(const std::vector<int>& sets, bool driving, Clock::time_point now, LaunchStep* step);
  // Starts the next round if rule 6 says so.
  void StartNext(const std::vector<int>& sets, bool leaving, Clock::time_point now, LaunchStep* step);
  // Hands the lanes what a round agreed, in (set id, turn) order.
  void Grant(const std::vector<int>& sets, const std::vector<uint64_t>& agreed);
  // Whether GPU batches of this rank wait for a grant; keeps waiting_since_.
  bool NoteWaiting(const std::vector<int>& sets, Clock::time_point now);
  // No more grants (`abandon`: the round in flight is left to MPI).
  void End(bool abandon);

  const std::unique_ptr<LaunchPort> port_;
  const bool may_order_;
  // MakeRounds' rounds (none when no rank can use a GPU), published by made_.
  std::unique_ptr<LaunchRounds> made_rounds_;
  std::atomic<bool> made_{false};

  // The stepping thread's.
  bool gated_ = false;        // the order has begun: GPU batches numbered from now on are gated
  bool taken_ = false;        // the rounds were taken from MakeRounds
  bool lost_ = false;         // a peer was given up on: the rounds were abandoned
  std::atomic<bool> given_up_{false};  // GiveUp() was called
  std::unique_ptr<LaunchRounds> rounds_;
  std::map<int, Turns> turns_;  // by set id
  int64_t counted_ = 0;  // the GPU batches agreed in every set, as the last round carried
  Clock::time_point round_start_, retry_at_;
  Clock::duration backoff_{};

  std::atomic<Clock::rep> waiting_since_{0};
};

}  // namespace perseus

#endif  // PERSEUS_ENGINE_LAUNCH_ORDER_H_
