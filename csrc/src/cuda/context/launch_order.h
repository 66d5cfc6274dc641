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
// refuses two threads launching at once. The order between two sets' collectives is
// each rank's own (their negotiations are separate).
#ifndef PERSEUS_CUDA_LAUNCH_ORDER_H_
#define PERSEUS_CUDA_LAUNCH_ORDER_H_

#include <cstdint>

namespace perseus {
namespace gpu {

// The launch turns of one process set's device lanes (shared by them).
class LaunchSequence {
 public:
  LaunchSequence() = default;
  LaunchSequence(const LaunchSequence&) = delete;
  LaunchSequence& operator=(const LaunchSequence&) = delete;

 private:
  friend class LaunchTurn;
  int64_t next_ = 0;  // the turn whose batch launches next; guarded by the process's launch lock
};

// One batch's turn: Take() before its NCCL calls, Pass() after them. A batch that
// launches nothing (host-staged, failed) still passes its turn, in order: the
// destructor does, so no path leaves later batches waiting.
class LaunchTurn {
 public:
  // `turn` < 0 or no sequence: no ordering (a batch the engine did not number).
  LaunchTurn(LaunchSequence* sequence, int64_t turn) : sequence_(turn >= 0 ? sequence : nullptr), turn_(turn) {}
  ~LaunchTurn() { Pass(); }
  LaunchTurn(const LaunchTurn&) = delete;
  LaunchTurn& operator=(const LaunchTurn&) = delete;

  // Waits until every earlier batch of the set has launched and no other lane of the
  // process is launching; the GPU is this batch's to launch on until Pass().
  void Take();
  // Lets the next batch launch (waiting first for this one's turn if it was not taken).
  void Pass();

 private:
  LaunchSequence* sequence_;
  int64_t turn_;
  bool taken_ = false, passed_ = false;
};

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_LAUNCH_ORDER_H_
