// How Perseus threads wait for MPI: one policy for negotiation rounds and collectives.
//
// MPICH advances a request only inside MPI calls, and its blocking calls spin. On a
// machine whose cores all run training (the CPU case), a background thread that
// spins in MPI takes its core from the training thread, and two ranks' background
// threads then meet only when both happen to be scheduled. So: spin while some
// thread waits for a result (it has nothing else to do), otherwise test with a
// growing pause and leave the core to the framework. Even a waiter's spin is
// bounded: with every core busy it would slow the late peer that everyone awaits.
#ifndef PERSEUS_WAIT_POLICY_H_
#define PERSEUS_WAIT_POLICY_H_

#include <mpi.h>

#include <chrono>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace perseus {

// While a thread that waits for (or drives) a request holds one of these, MPI waits
// spin for kDriverSpin rather than kBackgroundSpin. Cheap: one atomic increment.
class WaiterScope {
 public:
  WaiterScope();
  ~WaiterScope();
  WaiterScope(const WaiterScope&) = delete;
  WaiterScope& operator=(const WaiterScope&) = delete;
};
bool SomeoneWaits();
// The same count for a waiter that is not a blocked thread: a completion callback
// (perseus_on_complete) counts from registration until it runs.
void AddWaiter();
void RemoveWaiter();

// Back-to-back tests for this long before pausing: a thread that waits for the
// result (a driver) spins longer than the background thread, while a core is idle.
constexpr auto kDriverSpin = std::chrono::microseconds(1000);
constexpr auto kBackgroundSpin = std::chrono::microseconds(20);
// The spin of a thread that waits for the result: kDriverSpin, or kBackgroundSpin while
// the machine has no idle core (more threads runnable than cores, looked at every
// 20 ms at most), where a spin takes the core of a runnable thread, maybe of the peer
// everyone waits for. (torch's DDP over the "perseus" backend, np 2 on 2 cores under
// load 5-6, both spins in one job: steps 19 % longer with kDriverSpin always on
// ddp_bench's many_small, 8 % on large; benchmarks/README.md.)
Clock::duration WaiterSpin();

// The pause before testing again a request pending for `waited`: none while within
// `spin`, then an eighth of the time waited, at most 200 us.
Clock::duration PollGap(Clock::duration waited, Clock::duration spin);

// Completes the request of a non-blocking MPI call that returned `start_rc`, by the
// policy above. `what` names the call in errors. Once a peer is lost, a request that
// does not complete within the spin fails instead: it may wait on that peer forever.
Status CompleteRequest(int start_rc, MPI_Request* request, const char* what);

// Called now and then by a thread that waits long in CompleteRequest (past its spin,
// once per pause): the engine's stall inspector checks from there, since the waiting
// thread may be the one that runs the engine. Null: none. Not used with serialized MPI,
// where the waiting thread holds the MPI lock.
struct WaitHook {
  void (*call)(void* arg);
  void* arg;
};
void SetWaitHook(const WaitHook* hook);

// Members stopped answering and the stall inspector gave up on them (`ranks`, of the
// job's world); `elsewhere`: one of them runs on another host. From then on this
// process's MPI waits give up rather than wait for them, and MPI is not finalized at
// exit (MPI_Finalize would wait for them too). Never cleared.
void MarkPeerLost(bool elsewhere, const std::vector<int>& ranks);
bool PeerLost();
bool PeerLostElsewhere();
std::vector<int> LostPeers();  // every rank given up so far, sorted

}  // namespace perseus

#endif  // PERSEUS_WAIT_POLICY_H_
