#include "mpi/wait_policy.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/counters.h"
#include "mpi/mpi_status.h"

namespace perseus {

namespace {
std::atomic<int> g_waiters{0};
std::atomic<bool> g_peer_lost{false}, g_peer_lost_elsewhere{false};
std::mutex g_lost_mu;
std::vector<int> g_lost_peers;  // under g_lost_mu
std::atomic<const WaitHook*> g_wait_hook{nullptr};
constexpr auto kMaxPoll = std::chrono::microseconds(200);
constexpr auto kIdleCoreCheck = std::chrono::milliseconds(20);
std::atomic<Clock::rep> g_idle_core_checked{0};  // Clock ticks; 0: never
std::atomic<bool> g_no_idle_core{false};

// Whether more threads are runnable now than the machine has cores: the fourth field
// of /proc/loadavg, "runnable/all" (the reader is one of them). Elsewhere: false.
bool NoIdleCore() {
  static const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[128];
  ssize_t n = read(fd, text, sizeof(text) - 1);
  close(fd);
  if (n <= 0) return false;
  text[n] = '\0';
  const char* field = text;
  for (int i = 0; i < 3 && field != nullptr; ++i) {
    field = std::strchr(field, ' ');
    if (field != nullptr) ++field;
  }
  return field != nullptr && std::strtol(field, nullptr, 10) > cores;
}
}  // namespace

Clock::duration WaiterSpin() {
  const Clock::rep now = Clock::now().time_since_epoch().count();
  Clock::rep checked = g_idle_core_checked.load(std::memory_order_relaxed);
  // One waiter looks at a time; the others use what it saw last.
  if (now - checked >= std::chrono::duration_cast<Clock::duration>(kIdleCoreCheck).count() &&
      g_idle_core_checked.compare_exchange_strong(checked, now, std::memory_order_relaxed))
    g_no_idle_core.store(NoIdleCore(), std::memory_order_relaxed);
  return g_no_idle_core.load(std::memory_order_relaxed) ? kBackgroundSpin : kDriverSpin;
}

void AddWaiter() { g_waiters.fetch_add(1, std::memory_order_relaxed); }
void RemoveWaiter() { g_waiters.fetch_sub(1, std::memory_order_relaxed); }
WaiterScope::WaiterScope() { AddWaiter(); }
WaiterScope::~WaiterScope() { RemoveWaiter(); }
bool SomeoneWaits() { return g_waiters.load(std::memory_order_relaxed) > 0; }
void SetWaitHook(const WaitHook* hook) { g_wait_hook.store(hook); }
void MarkPeerLost(bool elsewhere, const std::vector<int>& ranks) {
  {
    std::lock_guard<std::mutex> lock(g_lost_mu);
    g_lost_peers.insert(g_lost_peers.end(), ranks.begin(), ranks.end());
    std::sort(g_lost_peers.begin(), g_lost_peers.end());
    g_lost_peers.erase(std::unique(g_lost_peers.begin(), g_lost_peers.end()), g_lost_peers.end());
  }
  if (elsewhere) g_peer_lost_elsewhere.store(true);
  g_peer_lost.store(true);
}
bool PeerLost() { return g_peer_lost.load(); }
bool PeerLostElsewhere() { return g_peer_lost_elsewhere.load(); }
std::vector<int> LostPeers() {
  std::lock_guard<std::mutex> lock(g_lost_mu);
  return g_lost_peers;
}

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
        PollGap(Clock::now() - start, SomeoneWaits() ? WaiterSpin() : kBackgroundSpin);
    if (gap == Clock::duration::zero()) continue;
    if (const WaitHook* hook = g_wait_hook.load()) hook->call(hook->arg);
    if (PeerLost())
      return Status::Error(PERSEUS_SHUT_DOWN,
                           std::string(what) + " abandoned: a rank stopped responding");
    std::this_thread::sleep_for(gap);
  }
}

}  // namespace perseus
