// The order in which a process's device lanes launch their collectives on its GPU.
//
// NCCL kernels of different communicators deadlock a GPU when two ranks launch them in
// different orders and the GPU cannot run them all at once: each occupies the GPU
// until every peer has started the same kernel, which a peer cannot do while its GPU
// is full of kernels waiting for this rank. Lanes are threads, so without a rule the
// order between lane A's ncclAllReduce and lane B's is the order their threads get
// there, which differs from rank to rank. The rule: every rank launches a process
// set's device collectives in the order its negotiation agreed them (Batch::launch_turn,
// numbered by the engine), one launch at a time. A lane waits for its batch's turn to
// *launch* (the NCCL calls queue device work and return), not for the previous
// collective to finish, so lanes still run together on the GPU; NCCL's launch order
// implicit (set per communicator where NCCL has it, cuda/runtime/nccl_features.h) makes the
// launch order the order the GPU starts them in.
//
// One launch at a time holds across process sets too (a lock per process, which drives
// one GPU): NCCL's implicit order takes the GPU's order from the order of launches and
// refuses two threads launching at once. Once more than one set can have GPU work, the
// order across sets is agreed too (engine/launch_rounds.h): a batch marked
// Batch::launch_gated launches only when the grants the engine hands in
// (CrossSetOrder::Grant, in the same order on every rank) reach it.
#ifndef PERSEUS_CUDA_LAUNCH_ORDER_H_
#define PERSEUS_CUDA_LAUNCH_ORDER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "common/batch.h"

namespace perseus {
namespace gpu {

// One engine's order across its process sets, shared by every set's LaunchSequence.
// Guarded by the process's launch lock.
class CrossSetOrder {
 public:
  // From now on gated batches launch in the order of the grants, and only after the
  // first `ungated` batches of the global set (agreed before the order began, launched
  // without grants) have launched.
  void Begin(int64_t ungated);
  // Appends grants, in the order this rank launches them.
  void Grant(const std::vector<LaunchGrant>& grants);
  // No more grants will come (the rounds ended, or no rank can use a GPU): gated
  // batches launch in their own set's order only.
  void End();

 private:
  friend class LaunchTurn;
  bool Heads(int set_id, int64_t turn) const;  // the first grant is this batch's
  bool MayLaunch(int set_id, int64_t turn) const;
  void Launched(int set_id, int64_t turn);
  int64_t ungated_total_ = 0, ungated_passed_ = 0;
  std::deque<LaunchGrant> grants_;
  bool ended_ = false;
};

// The launch turns of one process set's device lanes (shared by them).
class LaunchSequence {
 public:
  LaunchSequence(int set_id, std::shared_ptr<CrossSetOrder> across)
      : set_id_(set_id), across_(std::move(across)) {}
  LaunchSequence(const LaunchSequence&) = delete;
  LaunchSequence& operator=(const LaunchSequence&) = delete;

 private:
  friend class LaunchTurn;
  const int set_id_;
  const std::shared_ptr<CrossSetOrder> across_;
  int64_t next_ = 0;  // the turn whose batch launches next; guarded by the process's launch lock
};

// One batch's turn: Take() before its NCCL calls, Pass() after them. A batch that
// launches nothing (host-staged, failed) still passes its turn, in order: the
// destructor does, so no path leaves later batches waiting.
class LaunchTurn {
 public:
  // `turn` < 0 or no sequence: no ordering (a batch the engine did not number).
  // `gated`: Batch::launch_gated.
  LaunchTurn(LaunchSequence* sequence, int64_t turn, bool gated = false)
      : sequence_(turn >= 0 ? sequence : nullptr), turn_(turn), gated_(gated) {}
  ~LaunchTurn() { Pass(); }
  LaunchTurn(const LaunchTurn&) = delete;
  LaunchTurn& operator=(const LaunchTurn&) = delete;

  // Waits until every earlier batch of the set has launched (and, gated, every batch
  // granted before it), and no other lane of the process is launching; the GPU is this
  // batch's to launch on until Pass().
  void Take();
  // Lets the next batch launch (waiting first for this one's turn if it was not taken).
  void Pass();

 private:
  bool Reached() const;  // under the launch lock: earlier batches have launched
  LaunchSequence* sequence_;
  int64_t turn_;
  bool gated_;
  bool taken_ = false, passed_ = false;
};

// A launch outside every set's turns (a point-to-point message, which no negotiation
// orders): waits until no lane of the process is launching, and keeps the others out
// until it goes (NCCL refuses launches on one GPU from two threads at once).
class SoloLaunch {
 public:
  SoloLaunch();
  ~SoloLaunch();
  SoloLaunch(const SoloLaunch&) = delete;
  SoloLaunch& operator=(const SoloLaunch&) = delete;
};

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_LAUNCH_ORDER_H_
