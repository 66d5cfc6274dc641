#include "mpi/wait_policy.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>

#include "common/counters.h"
#include "mpi/mpi_status.h"

namespace perseus {

namespace {
std::atomic<int> g_waiters{0};
std::atomic<bool> g_peer_lost{false}, g_peer_lost_elsewhere{false};
std::atomic<const WaitHook*> g_wait_hook{nullptr};
constexpr auto kMaxPoll = std::chrono::microseconds(200);
}  // namespace

void AddWaiter() { g_waiters.fetch_add(1, std::memory_order_relaxed); }
void RemoveWaiter() { g_waiters.fetch_sub(1, std::memory_order_relaxed); }
WaiterScope::WaiterScope() { AddWaiter(); }
WaiterScope::~WaiterScope() { RemoveWaiter(); }
bool SomeoneWaits() { return g_waiters.load(std::memory_order_relaxed) > 0; }
void SetWaitHook(const WaitHook* hook) { g_wait_hook.store(hook); }
void MarkPeerLost(bool elsewhere) {
  if (elsewhere) g_peer_lost_elsewhere.store(true);
  g_peer_lost.store(true);
}
bool PeerLost() { return g_peer_lost.load(); }
bool PeerLostElsewhere() { return g_peer_lost_elsewhere.load(); }

Clock::duration PollGap(Clock::duration waited, Clock::duration spin) {
  if (waited < spin) return Clock::duration::zero();
  return std::min<Clock::duration>(kMaxPoll, waited / 8);
}

Status CompleteRequest(int start_rc, MPI_Request* request, const char* what) {
  Count(kDataCollectives);
  if (start_rc != MPI_SUCCESS) return MpiStatus(start_rc, what);
  const Clock::time_point start = Clock::now();
  while (true) {
    int done = 0;
    int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return MpiStatus(rc, what);
    if (done) return Status::OK();
    // Even a waiter stops spinning after a while: with every core busy, its spin
    // would slow the late peer that everyone waits for.
    Clock::duration gap =
        PollGap(Clock::now() - start, SomeoneWaits() ? kDriverSpin : kBackgroundSpin);
    if (gap == Clock::duration::zero()) continue;
    if (const WaitHook* hook = g_wait_hook.load()) hook->call(hook->arg);
    if (PeerLost())
      return Status::Error(PERSEUS_SHUT_DOWN,
                           std::string(what) + " abandoned: a rank stopped responding");
    std::this_thread::sleep_for(gap);
  }
}

}  // namespace perseus
