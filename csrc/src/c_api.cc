// The C ABI (perseus.h): owns the one engine of the process and turns Status into
// result codes plus a per-thread message.
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/wire_dtype.h"
#include "common/counters.h"
#include "common/fatal_signals.h"
#include "common/list_string.h"
#include "common/logging.h"
#include "common/request_rules.h"
#include "common/timeline.h"
#include "cuda/device_backend.h"
#include "engine/config.h"
#include "engine/config_agreement.h"
#include "engine/engine.h"
#include "lanes/core_lanes.h"
#include "mpi/failure_detector.h"
#include "mpi/fault_tolerance.h"
#include "mpi/job_processes_here.h"
#include "mpi/launcher_pmi.h"
#include "mpi/launcher_world.h"
#include "mpi/mpi_library.h"
#include "mpi/mpi_lock.h"
#include "mpi/mpi_status.h"
#include "mpi/runtime_processes.h"
#include "mpi/wait_policy.h"
#include "perseus/perseus.h"

using namespace perseus;

namespace {

// Never destroyed: exit() may come from inside an MPI call on one of the engine's
// threads, and a destructor that stopped the engine would wait for that thread.
// Pointers, because a forked child replaces them (AfterForkInChild).
std::timed_mutex* g_mu = new std::timed_mutex;  // serialises init and shutdown
std::shared_ptr<Engine>* g_engine = new std::shared_ptr<Engine>;  // null while not initialised
// Outlives engines, so late waiters still get an answer.
HandleTable& g_handles = *new HandleTable;
bool g_finalize_at_exit = false;
bool g_atfork_registered = false;
// Set by perseus_init before it starts MPI, never cleared: from then on MPI and the
// engine belong to this process, so a child forked from it must not use them. Atomic:
// the fork may come from any thread, init's own included (MPI_Init_thread may fork).
std::atomic<bool> g_started{false};
// In a child forked after init() started: the pid of the parent that owns MPI and the engine.
pid_t g_forked_from = 0;
// How long an exit path waits for the engine to stop before leaving it to the exit.
constexpr double kExitShutdownS = 10.0;
// The exit code of a process that ends the job after giving up on a member, and how
// long it lets MPI_Abort try before it leaves on its own.
constexpr int kLostPeerExitCode = 1;
constexpr double kAbortGraceS = 5.0;
constexpr int kLeaveTogetherTag = 0x7065;  // MPI_Comm_create_group's, at exit
thread_local std::string g_last_error;
// How long perseus_wait lets its caller run the engine before sleeping on the handle.
constexpr double kWaitDriveS = 0.5;

perseus_status_t Report(const Status& s) {
  g_last_error = s.message;
  return s.code;
}

// In a forked child every call that would touch the parent's state (the engine, the
// handle table, the timeline, whose mutexes a parent thread may have held at the
// fork) refuses with this instead; shutdown is a no-op.
Status ForkedChild() {
  return Status::Error(PERSEUS_NOT_INITIALIZED,
                       "Perseus cannot be used in a process forked after init(): MPI and the "
                       "engine belong to the parent (pid " + std::to_string(g_forked_from) +
                           "); call Perseus from the parent only");
}

Status NotInitialized() {
  if (g_forked_from) return ForkedChild();
  return Status::Error(PERSEUS_NOT_INITIALIZED,
                       "Perseus has not been initialized; call init() first");
}

// The communicator of a world that lost a rank (ULFM), kept from its engine's shutdown
// until the next perseus_init shrinks it to the survivors. Under g_mu.
MPI_Comm g_failed_world = MPI_COMM_NULL;
// A world of this process lost a rank: MPI_Finalize is skipped at exit. Its closing
// fence over the job's processes waited for the dead one in about a quarter of the runs
// here (Open MPI 5.0.11, 4 ranks, one SIGKILLed); a survivor that leaves without it
// ends the job at once, mpirun's exit code 0 (8 of 8).
std::atomic<bool> g_lost_a_rank{false};
// The peer timeout of the last init that started MPI: it bounds MPI_Finalize under ULFM.
double g_peer_timeout_s = 0;

// The processes on this host of that world: (rank in it, process id).
std::vector<std::pair<int, int>> g_failed_world_here;
// The same of the last world that shut down, lost rank or not: a grow from it follows
// them (Grow). Under g_mu.
std::vector<std::pair<int, int>> g_last_world_here;
// And every process of that world as the launcher's runtime names it (fault-tolerant
// runs under Open MPI; else empty).
std::vector<RuntimeProcess> g_failed_world_runtime;

// While alive, bounds an MPI call that may wait for a dead process (under ULFM, Open
// MPI's start-up and MPI_Finalize still wait for every process of the job): past
// `limit_s` (none if 0) the process logs `why` and leaves with `exit_code`. Sooner once
// a check given to LeaveWhen says a process the call waits for is gone: it is polled
// every kPollMs (under the watch's lock, so never after the watch ended).
class CallWatch {
 public:
  CallWatch(double limit_s, std::string why, int exit_code) {
    if (limit_s <= 0) return;
    auto state = state_ = std::make_shared<State>();
    std::thread([state, limit_s, why, exit_code] {
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(limit_s));
      std::unique_lock<std::mutex> lock(state->mu);
      std::string gone;
      while (!state->done && gone.empty() && std::chrono::steady_clock::now() < deadline) {
        const bool polling = static_cast<bool>(state->gone);
        const auto next = polling ? std::min(deadline, std::chrono::steady_clock::now() +
                                                           std::chrono::milliseconds(kPollMs))
                                  : deadline;
        state->cv.wait_until(lock, next,
                             [&] { return state->done || (!polling && state->gone); });
        if (!state->done && state->gone) gone = state->gone();
      }
      if (state->done) return;
      if (gone.empty()) {
        PERSEUS_LOG(kError) << why << "; leaving with exit code " << exit_code;
      } else {
        PERSEUS_LOG(kError) << state->gone_why << ": " << gone << "; leaving with exit code "
                            << exit_code;
      }
      std::fflush(stderr);
      _exit(exit_code);
    }).detach();
  }
  ~CallWatch() {
    if (!state_) return;
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->done = true;
    state_->cv.notify_all();
  }
  // From now on the watch also leaves (saying `why`: what `gone` returned) as soon as
  // `gone` returns a non-empty text. No-op on a watch without a limit.
  void LeaveWhen(std::function<std::string()> gone, std::string why) {
    if (!state_) return;
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->gone = std::move(gone);
    state_->gone_why = std::move(why);
    state_->cv.notify_all();
  }
  CallWatch(const CallWatch&) = delete;
  CallWatch& operator=(const CallWatch&) = delete;

 private:
  static constexpr int kPollMs = 100;
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::function<std::string()> gone;
    std::string gone_why;
  };
  std::shared_ptr<State> state_;
};

std::string PeerTimeoutText(double s) {
  std::ostringstream text;
  text << s << " s (PERSEUS_PEER_TIMEOUT_SECONDS)";
  return text.str();
}

// While alive, MPI errors on `comm` (MPI_COMM_WORLD) return instead of ending the job:
// under ULFM, init's calls on it may meet a dead process. MPI_COMM_NULL: no change.
class ReturnErrors {
 public:
  explicit ReturnErrors(MPI_Comm comm) : comm_(comm) {
    if (comm_ == MPI_COMM_NULL) return;
    MPI_Comm_get_errhandler(comm_, &saved_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~ReturnErrors() {
    if (comm_ == MPI_COMM_NULL) return;
    MPI_Comm_set_errhandler(comm_, saved_);
    MPI_Errhandler_free(&saved_);
  }
  ReturnErrors(const ReturnErrors&) = delete;
  ReturnErrors& operator=(const ReturnErrors&) = delete;

 private:
  MPI_Comm comm_;
  MPI_Errhandler saved_ = MPI_ERRHANDLER_NULL;
};

// Growing in place (issue 46, Open MPI 5): once the job grew, the communicator of all
// its processes, the ranks that spawned first and those spawned after them
// (MPI_Comm_spawn, MPI_Intercomm_merge); perseus_init forms its world from it instead
// of MPI_COMM_WORLD. A spawned process's first init joins it the same way
// (MPI_Comm_get_parent). MPI_COMM_NULL: the job never grew. Under g_mu.
MPI_Comm g_job = MPI_COMM_NULL;
bool g_joined_parents = false;  // this process's first init looked for a parent
std::atomic<bool> g_spawned{false};  // and found one: it was spawned to grow a job
// The intercommunicators of the grows this process took part in, oldest first (its
// parent's, then those of the grows it spawned from): disconnected at exit, before
// MPI_Finalize, which otherwise waited for the other side (Open MPI 5.0.11).
std::vector<MPI_Comm> g_job_links;
// The first of g_job_links made after the last shrink: those before may hold a dead
// process, whose disconnect would wait for it.
size_t g_links_after_shrink = 0;

// At exit: disconnects the job's links that hold no dead process (all when none died;
// then the job's communicator is freed first). Every process of those links calls it, in
// the same order. After a lost rank g_job is left alone: freeing it there spun for good
// (tests/mpi/test_fault_tolerance_edges.py, a peer dying during shutdown).
void LeaveGrownJob() {
  if (!g_lost_a_rank && g_job != MPI_COMM_NULL) MPI_Comm_free(&g_job);
  const size_t first = g_lost_a_rank ? g_links_after_shrink : 0;
  for (size_t i = first; i < g_job_links.size(); ++i) MPI_Comm_disconnect(&g_job_links[i]);
  g_job_links.clear();
}

// What perseus_grow asked of the next perseus_init. Under g_mu.
struct GrowRequest {
  int count = 0;
  std::string command;
  std::vector<std::string> args;
  std::string wdir;
  // Where the new processes go, in rank order (empty: MPI's choice): each host, how many
  // there, and "host:slots" where the host is to be added to the job's (PMIX_ADD_HOST).
  struct Place {
    std::string host;
    int count;
    std::string add;
  };
  std::vector<Place> hosts;
};
GrowRequest g_grow;

// Test hooks (tests/rank_scripts/elastic_edges.py, elastic_grow.py), read where they act:
// PERSEUS_TEST_DIE_IN_INIT=start kills this process once its MPI started, =world once
// its new world is made, the others forming the world with it.
// PERSEUS_TEST_DIE_IN_GROW=spawn kills an old rank as the grow's MPI_Comm_spawn starts,
// =merge before its MPI_Intercomm_merge; =child kills the last process of each spawn
// before it merges with its parents.
bool DiesIn(const char* hook, const char* where) {
  const char* value = std::getenv(hook);
  return value != nullptr && std::strcmp(value, where) == 0;
}
bool DiesInInit(const char* where) { return DiesIn("PERSEUS_TEST_DIE_IN_INIT", where); }
bool DiesInGrow(const char* where) { return DiesIn("PERSEUS_TEST_DIE_IN_GROW", where); }

// A grow in place that cannot finish (a process of the job or a new one ended during the
// spawn or the merge) ends every process that took part with this code, the one
// hvd.elastic.run's ranks stop with for new hosts (HOSTS_UPDATED_EXIT): perseusrun
// --elastic then starts the job on the new hosts from the commit persisted before the
// grow. Leaving is the one bounded way out: MPI_Intercomm_merge with a dead process
// spins for good (Open MPI 5.0.11), and the ranks cannot agree on a world while some
// are stuck in it.
constexpr int kGrowFailedExitCode = 75;

[[noreturn]] void LeaveFailedResize(const char* resize, const std::string& what) {
  PERSEUS_LOG(kError) << resize << " the job in place failed: " << what
                      << "; leaving with exit code " << kGrowFailedExitCode
                      << " for perseusrun --elastic to start the job on the new hosts";
  std::fflush(stderr);
  _exit(kGrowFailedExitCode);
}

[[noreturn]] void LeaveFailedGrow(const std::string& what) { LeaveFailedResize("growing", what); }

std::string GrowTimeoutText(const char* who) {
  return std::string("growing the job in place failed: ") + who +
         " did not finish within " + PeerTimeoutText(g_peer_timeout_s) +
         ": a process of the job or a new one probably ended during it (perseusrun "
         "--elastic starts the job on the new hosts)";
}

// Makes a grow's `watch` leave at once when a process of the job on this host ends (the
// ranks, the new processes as they appear: `processes`), rather than at the peer
// timeout: the new processes' start-up and the merge wait for it for good. Not before
// `may_leave()` says so, where given.
void LeaveWhenAProcessHereEnds(CallWatch& watch, const char* during,
                               std::shared_ptr<JobProcessesWatch> processes,
                               std::function<bool()> may_leave = nullptr) {
  processes->Ended();  // those running now
  watch.LeaveWhen(
      [processes, may_leave] {
        const std::string ended = processes->Ended();
        return ended.empty() || !may_leave || may_leave() ? ended : std::string();
      },
      std::string("growing the job in place failed: a process of the job on this host ended "
                  "during ") +
          during + " (perseusrun --elastic starts the job on the new hosts)");
}

// A spawned process's view of the job's processes here, from its start-up to its merge.
std::shared_ptr<JobProcessesWatch> g_grow_processes;

// A process started by MPI_Comm_spawn: Open MPI gives it its parents' port there.
bool Spawned() { return std::getenv("OMPI_PARENT_PORT") != nullptr; }

// A process that a running job spawned to grow: the merge with the spawning ranks, this
// one's ranks after theirs. *job stays MPI_COMM_NULL without a parent.
Status JoinParents(MPI_Comm* job) {
  MPI_Comm parent = MPI_COMM_NULL;
  MPI_Comm_get_parent(&parent);
  if (parent == MPI_COMM_NULL) return Status::OK();
  MPI_Comm_set_errhandler(parent, MPI_ERRORS_RETURN);
  const bool ulfm = FaultTolerant();
  CallWatch watch(ulfm ? g_peer_timeout_s : 0, GrowTimeoutText("joining it"),
                  kGrowFailedExitCode);
  if (!g_grow_processes) g_grow_processes = std::make_shared<JobProcessesWatch>();
  LeaveWhenAProcessHereEnds(watch, "the merge with the processes that spawned this one",
                            g_grow_processes);
  if (DiesInGrow("child")) {
    int rank = 0, size = 0;
    MPI_Comm_rank(parent, &rank);
    MPI_Comm_size(parent, &size);
    if (rank == size - 1) raise(SIGKILL);
  }
  Status status = MpiStatus(MPI_Intercomm_merge(parent, /*high=*/1, job), "MPI_Intercomm_merge");
  if (!status.ok() && ulfm) LeaveFailedGrow(status.message);
  if (status.ok()) MPI_Comm_set_errhandler(*job, MPI_ERRORS_RETURN);
  g_job_links.push_back(parent);
  return status;
}

// Collective over `base`: starts `request.count` processes (rank 0's request) and
// merges them after base's ranks into *job. With request.hosts, one app a host
// (MPI_Comm_spawn_multiple, each told its host: under --oversubscribe Open MPI maps a
// spawn on the job's first host whatever the slots named), a host new to the job added
// to its allocation by its app (PRRTE starts its daemon there through its launch agent).
Status Grow(MPI_Comm base, const GrowRequest& request, MPI_Comm* job) {
  const size_t apps = request.hosts.empty() ? 1 : request.hosts.size();
  std::vector<MPI_Info> infos(apps);
  std::vector<int> counts(apps, request.count);
  for (size_t i = 0; i < apps; ++i) {
    MPI_Info_create(&infos[i]);
    if (!request.wdir.empty()) MPI_Info_set(infos[i], "wdir", request.wdir.c_str());
    // Open MPI binds a spawned job to cores by default and refuses it where the cores are
    // taken (then MPI_Comm_spawn fails, or mpirun hangs: docs/investigations/grow-in-place.md).
    MPI_Info_set(infos[i], "bind_to", "none");
    if (request.hosts.empty()) continue;
    const GrowRequest::Place& place = request.hosts[i];
    MPI_Info_set(infos[i], "PMIX_HOST", place.host.c_str());
    counts[i] = place.count;
    if (!place.add.empty()) MPI_Info_set(infos[i], "PMIX_ADD_HOST", place.add.c_str());
  }
  std::vector<char*> argv;
  for (const std::string& arg : request.args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> commands(apps, const_cast<char*>(request.command.c_str()));
  std::vector<char**> argvs(apps, argv.data());
  MPI_Comm inter = MPI_COMM_NULL;
  // Under ULFM a process that ends during the grow must not hold the others: the spawn
  // returns an error once an old rank ended (MPI_COMM_WORLD's too, while here); the
  // merge spins, and ULFM's agreement over the intercommunicator did not see a new
  // process end either (tried): the watch bounds both.
  const bool ulfm = FaultTolerant();
  ReturnErrors world_errors(ulfm && base == MPI_COMM_WORLD ? MPI_COMM_WORLD : MPI_COMM_NULL);
  CallWatch watch(ulfm ? g_peer_timeout_s : 0,
                  GrowTimeoutText("MPI_Comm_spawn and MPI_Intercomm_merge"), kGrowFailedExitCode);
  // The last world's processes here (one may have ended before this looked) and the new
  // ones are followed from the spawn on (one may end a moment after its start-up). A
  // process that ended is reported once the spawn returned, or once every new process
  // of a spawn on this host started here, ending them first: leaving while the new ones
  // were not yet in their start-up left them waiting there for parents gone before
  // they looked. (An old rank's end during the spawn mostly makes it fail once the new
  // ones joined, but under load it waited for good: one CI run of about ten.)
  auto spawn_returned = std::make_shared<std::atomic<bool>>(false);
  std::vector<int> last_world_here;
  for (const auto& process : g_last_world_here) last_world_here.push_back(process.second);
  auto processes = std::make_shared<JobProcessesWatch>(last_world_here);
  const size_t new_here = request.hosts.empty() ? request.count : SIZE_MAX;
  LeaveWhenAProcessHereEnds(watch, "MPI_Comm_spawn or MPI_Intercomm_merge", processes,
                            [processes, spawn_returned, new_here] {
                              if (*spawn_returned) return true;
                              if (processes->Appeared() < new_here) return false;
                              processes->EndAppeared();
                              return true;
                            });
  if (DiesInGrow("spawn")) raise(SIGKILL);
  int rc = request.hosts.empty()
               ? MPI_Comm_spawn(request.command.c_str(), argv.data(), request.count, infos[0],
                                0, base, &inter, MPI_ERRCODES_IGNORE)
               : MPI_Comm_spawn_multiple(static_cast<int>(apps), commands.data(), argvs.data(),
                                         counts.data(), infos.data(), 0, base, &inter,
                                         MPI_ERRCODES_IGNORE);
  for (MPI_Info& info : infos) MPI_Info_free(&info);
  if (rc != MPI_SUCCESS) {
    if (ulfm) LeaveFailedGrow(MpiStatus(rc, "MPI_Comm_spawn").message);
    return MpiStatus(rc, "MPI_Comm_spawn");
  }
  MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
  *spawn_returned = true;
  if (DiesInGrow("merge")) raise(SIGKILL);
  rc = MPI_Intercomm_merge(inter, /*high=*/0, job);
  g_job_links.push_back(inter);
  if (rc != MPI_SUCCESS && ulfm) LeaveFailedGrow(MpiStatus(rc, "MPI_Intercomm_merge").message);
  if (rc != MPI_SUCCESS) return MpiStatus(rc, "MPI_Intercomm_merge");
  MPI_Comm_set_errhandler(*job, MPI_ERRORS_RETURN);
  return Status::OK();
}

// What the next perseus_init may need of the world that `engine` ran: its processes
// here and, where it lost a rank, the failed world.
void KeepLastWorld(Engine& engine) {
  std::lock_guard<std::timed_mutex> lock(*g_mu);
  g_last_world_here = engine.node_processes();
  MPI_Comm failed = engine.TakeFailedWorld();
  if (failed == MPI_COMM_NULL) return;
  g_lost_a_rank = true;
  if (g_failed_world != MPI_COMM_NULL) MPI_Comm_free(&g_failed_world);
  g_failed_world = failed;
  g_failed_world_here = engine.node_processes();
  g_failed_world_runtime = engine.runtime_processes();
}



std::shared_ptr<Engine> Current() {
  std::lock_guard<std::timed_mutex> lock(*g_mu);
  return *g_engine;
}

// fork() after init() started. There is no prefork handler on purpose: the fork may
// come from a thread that holds g_mu (MPI_Init_thread inside perseus_init forks to
// start Open MPI's singleton daemon; another library may spawn a process while we
// hold it), so waiting for g_mu there would deadlock. The child therefore may find
// g_mu locked and g_engine half-changed by a thread it does not have. It reads
// neither: it takes a fresh mutex and an empty engine slot and leaks the old ones
// (destroying them could join threads that do not exist). A lock_guard that the
// forking thread still holds refers to the old mutex, which stays valid. The child
// exits cleanly and refuses every call (ForkedChild); only this thread runs here,
// and glibc's fork leaves malloc usable in the child.
void AfterForkInChild() {
  g_mu = new std::timed_mutex;
  g_engine = new std::shared_ptr<Engine>;
  if (g_started.load()) g_forked_from = getppid();
}

// After a lost member (no ULFM), the first process to leave without MPI_Finalize makes
// the launcher end the job at once (hydra), the other survivors included: one still at
// work (writing its checkpoint) was killed mid-way, and mpirun said 0. So the survivors
// leave together: a barrier among them alone (MPI_Comm_create_group involves only its
// members), bounded by the peer timeout, past which this one leaves anyway.
void LeaveWithTheOtherSurvivors() {
  const std::vector<int> lost = LostPeers();
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<int> survivors;
  for (int rank = 0; rank < size; ++rank)
    if (!std::binary_search(lost.begin(), lost.end(), rank)) survivors.push_back(rank);
  if (survivors.size() < 2 || lost.empty()) return;
  CallWatch watch(g_peer_timeout_s,
                  "the other survivors did not leave within " + PeerTimeoutText(g_peer_timeout_s),
                  kLostPeerExitCode);
  ReturnErrors world_errors(MPI_COMM_WORLD);
  MPI_Group world = MPI_GROUP_NULL, alive = MPI_GROUP_NULL;
  MPI_Comm together = MPI_COMM_NULL;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Group_incl(world, static_cast<int>(survivors.size()), survivors.data(), &alive);
  if (MPI_Comm_create_group(MPI_COMM_WORLD, alive, kLeaveTogetherTag, &together) == MPI_SUCCESS &&
      together != MPI_COMM_NULL)
    MPI_Barrier(together);
}

void FinalizeAtExit() {
  if (g_forked_from) return;
  // exit() called on a thread inside one of our MPI calls (MPI giving up on a failed
  // call): stopping the engine or finalizing MPI could wait on that very call.
  if (InMpiCaller()) return;
  // From here on MPI calls end the process's MPI (each progresses the detector).
  StopHeartbeatPump();
  if (perseus_shutdown_within(kExitShutdownS) != PERSEUS_SUCCESS) return;
  // A member stopped answering (the stall inspector gave up on it): MPI_Finalize would
  // wait for it forever. On this host, leaving without it is enough: the host's daemon
  // sees this process go and ends the job, the lost rank included. On another host,
  // mpirun would wait for that host's exit status, which never comes when the host is
  // unreachable or its ranks are stopped: MPI_Abort ends the job, mpirun killing what
  // it can reach. The abort waits for the launcher to end this process, which on a host
  // cut off from mpirun never comes: leave anyway after a grace time.
  if (PeerLostElsewhere()) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::duration<double>(kAbortGraceS));
      _exit(kLostPeerExitCode);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, kLostPeerExitCode);
  }
  if (PeerLost()) {
    if (!FaultTolerant() && g_job == MPI_COMM_NULL) LeaveWithTheOtherSurvivors();
    return;
  }
  const bool ulfm = FaultTolerant();
  if (g_lost_a_rank) {
    if (g_job_links.size() <= g_links_after_shrink) return;
    // The processes a grow added since the last shrink wait in their disconnect for
    // this one's (bounded as MPI_Finalize below).
    CallWatch watch(ulfm ? g_peer_timeout_s : 0,
                    "leaving the grown job did not finish within " +
                        PeerTimeoutText(g_peer_timeout_s),
                    0);
    LeaveGrownJob();
    return;
  }
  // Under ULFM a process may die after the engine stopped (during shutdown() or after):
  // skipped as above when it is known here, else bounded, as the job's work is done.
  if (ulfm && !FailedRanks(MPI_COMM_WORLD).empty()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  CallWatch watch(ulfm ? g_peer_timeout_s : 0,
                  "MPI_Finalize did not finish within " + PeerTimeoutText(g_peer_timeout_s) +
                      ": a process of the job probably ended during it",
                  0);
  LeaveGrownJob();  // a job that grew: its links, in the order every process made them
  MPI_Finalize();
}

// A fatal signal on its way (common/fatal_signals.h): the peers hear of it first.
void LeaveOnSignal(int signo) {
  if (g_forked_from) return;
  const std::string how = std::string("was killed by ") + FatalSignalName(signo);
  perseus_leave(how.c_str(), kFatalSignalWaitS - 0.5);
}

const char* ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
  }
}

Status StartMpi(const Config& config, bool* thread_multiple) {
  int initialized = 0, finalized = 0, provided = 0;
  double heartbeat_s = 0;  // the period of the heartbeats this process must keep up
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized)
    return Status::Error(PERSEUS_MPI_ERROR, "MPI was already finalized; Perseus cannot start");
  if (!initialized) {
    // UCX (the mpich wheel's transport) notices a dead TCP link by keepalive within
    // about 20 s, and MPICH, which installs no UCX error handler, then crashes the rank.
    // With the peer timeout on, Perseus gives up on unreachable peers itself, with an
    // error naming them on every rank: keepalive off, unless the user set it.
    if (config.peer_timeout_seconds > 0) setenv("UCX_TCP_KEEPIDLE", "inf", /*overwrite=*/0);
    // Another MPI's launcher: say so here, as MPI_Init may abort with its own words.
    Status launcher = CheckLauncherPmiHere();
    if (!launcher.ok()) return launcher;
    // A fault-tolerant job: a frozen rank is declared failed after the stall shutdown
    // time (else the peer timeout), even alone on its host, and excluded as a dead one.
    if (FaultTolerant())
      heartbeat_s = ArmFailureDetector(config.stall_shutdown_seconds > 0
                                           ? config.stall_shutdown_seconds
                                           : config.peer_timeout_seconds);
    int rc;
    {
      // A process that died before joining MPI's start-up holds the others there for
      // good (its PMIx fence; with the asynchronous modex, MPI_Init fails instead).
      // A spawned process's start-up connects to its parents: one that ended leaves it
      // there, and the grow failed (its exit code, for perseusrun's restart).
      const bool spawned = Spawned();
      CallWatch watch(FaultTolerant() ? config.peer_timeout_seconds : 0,
                      "MPI's start-up (MPI_Init_thread) did not finish within " +
                          PeerTimeoutText(config.peer_timeout_seconds) +
                          (spawned ? ": this process was spawned to grow the job, and a process "
                                     "of the job probably ended during the grow"
                                   : ": a process of the job probably ended before joining it, "
                                     "and Open MPI's start-up needs every process, even under "
                                     "ULFM"),
                      spawned ? kGrowFailedExitCode : kLostPeerExitCode);
      if (spawned) {
        g_grow_processes = std::make_shared<JobProcessesWatch>();
        LeaveWhenAProcessHereEnds(watch, "this spawned process's MPI_Init_thread",
                                  g_grow_processes);
      }
      rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    }
    g_peer_timeout_s = config.peer_timeout_seconds;
    if (rc != MPI_SUCCESS) return MpiStatus(rc, "MPI_Init_thread");
    if (!g_finalize_at_exit) std::atexit(FinalizeAtExit);
    g_finalize_at_exit = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED)
    return Status::Error(PERSEUS_UNSUPPORTED,
                         std::string("Perseus needs MPI_THREAD_SERIALIZED or better, but MPI was "
                                     "initialized with ") +
                             ThreadLevelName(provided) +
                             " (with mpi4py, leave mpi4py.rc.thread_level at 'multiple')");
  *thread_multiple = provided == MPI_THREAD_MULTIPLE;
  SetMpiSerialized(!*thread_multiple);
  if (*thread_multiple) StartHeartbeatPump(heartbeat_s);
  // N processes started by a launcher, each alone in a world of 1: an error, not N
  // independent trainings.
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  return CheckLauncherWorld(world_size, LoadedMpi(), std::getenv);
}

// PERSEUS_TIMELINE: rank 0 (of the communicator Perseus runs on) opens the file.
Status StartConfiguredTimeline(const Config& config, MPI_Comm world) {
  if (config.timeline_path.empty()) return Status::OK();
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  if (rank != 0) return Status::OK();
  Status status = Timeline::Get().Start(config.timeline_path, config.timeline_mark_cycles);
  if (!status.ok())
    status = Status::Error(PERSEUS_CONFIG_ERROR,
                           std::string(ConfigSpelling("PERSEUS_TIMELINE")) + ": " + status.message);
  return status;
}

GpuSettings GpuSettingsOf(const Config& config) {
  return GpuSettings{config.cuda_lib, config.nccl_lib, config.gpu_use_nccl, config.nan_check,
                     config.chunk_bytes};
}

// The GPU settings of the running engine, else of the environment (the GPU calls
// work before init, for perseusrun --check-build).
Status CurrentGpuSettings(GpuSettings* out) {
  Config config;
  if (auto engine = Current()) {
    config = engine->config();
  } else {
    Status status = LoadConfig(&config);
    if (!status.ok()) return status;
  }
  *out = GpuSettingsOf(config);
  return Status::OK();
}

// The lanes the engine runs batches on, as the configuration sets them, with the GPU
// work of enqueue and the port of the launch order across sets (lane_api/lane_backend.h).
LaneBackend MakeLanes(const Config& config, bool thread_multiple) {
  MpiLaneSettings mpi;
  mpi.chunk_bytes = config.chunk_bytes;
  mpi.nan_check = config.nan_check;
  mpi.wire_dtype = WireDtypeSetting(config.allreduce_dtype);
  mpi.hierarchical = config.allreduce_mode == "hierarchical";
  mpi.ranks_per_node = config.ranks_per_node;
  return MakeCoreLanes(mpi, GpuSettingsOf(config), thread_multiple);
}



// The world of this init from `parent` (its survivors when `shrink`, else a duplicate)
// and its engine, each step agreed by every rank. On an error nothing is left but
// `*world` (freed by the engine once it started).
Status FormWorld(MPI_Comm parent, bool shrink, const Config& config, const Status& config_status,
                 bool thread_multiple, MPI_Comm* world, std::unique_ptr<Engine>* engine) {
  *world = MPI_COMM_NULL;
  Status status;
  if (shrink) {
    status = Shrink(parent, world);
    if (status.ok()) EndExcludedRanks(parent, *world, g_failed_world_here, g_failed_world_runtime);
    // The job's processes are now these survivors: a later grow spawns from them.
    MPI_Comm survivors = MPI_COMM_NULL;
    if (status.ok() && MPI_Comm_dup(*world, &survivors) == MPI_SUCCESS) {
      if (g_job != MPI_COMM_NULL) MPI_Comm_free(&g_job);
      g_job = survivors;
      g_links_after_shrink = g_job_links.size();
    }
  } else {
    status = MpiStatus(MPI_Comm_dup(parent, world), "MPI_Comm_dup");
  }
  if (!status.ok()) {
    *world = MPI_COMM_NULL;
    return status;
  }
  if (DiesInInit("world")) raise(SIGKILL);
  MPI_Comm_set_errhandler(*world, MPI_ERRORS_RETURN);  // inherited by every dup below
  // A bad value on one rank fails init() on every rank, rather than leaving the
  // others blocked in the engine's first collectives. So do settings that differ
  // across ranks (the engine's plans would differ), before the timeline's file is
  // opened (and truncated); a path rank 0 cannot write fails init() everywhere too.
  // Each step gives every rank the same status, so all take the same steps.
  status = AgreeOnStatus(*world, config_status);
  if (status.ok()) status = AgreeOnConfig(config, thread_multiple, *world);
  if (status.ok()) status = AgreeOnStatus(*world, StartConfiguredTimeline(config, *world));
  if (status.ok())
    status = Engine::Start(config, *world, thread_multiple, MakeLanes(config, thread_multiple),
                           &g_handles, engine);
  if (!status.ok()) Timeline::Get().Stop();
  return status;
}

template <typename Getter>
perseus_status_t GetInt(int32_t* out, Getter get) {
  auto engine = Current();
  if (!engine) return Report(NotInitialized());
  *out = get(*engine);
  return PERSEUS_SUCCESS;
}

}  // namespace

extern "C" {


perseus_status_t perseus_init(int64_t comm_f2c) {
  // Bound once: should MPI_Init_thread fork and return in the child too, the child's
  // fresh engine slot stays empty, so the child still refuses every call.
  std::shared_ptr<Engine>& slot = *g_engine;
  std::lock_guard<std::timed_mutex> lock(*g_mu);
  if (slot) return PERSEUS_SUCCESS;
  if (g_forked_from) return Report(ForkedChild());
  if (!g_atfork_registered)
    g_atfork_registered = pthread_atfork(nullptr, nullptr, AfterForkInChild) == 0;
  // Before any other MPI call (MPI_Initialized included): with a mixed build those
  // hang or crash. MPI initialised by mpi4py is checked the same way.
  Status status = CheckMpiLibrary();
  if (!status.ok()) return Report(status);
  g_started = true;  // before MPI_Init_thread, which may fork
  MpiCallerScope mpi_caller;  // an exit() inside MPI_Init must not wait for g_mu
  Config config;
  Status config_status = LoadConfig(&config);
  if (config_status.ok()) SetLogLevel(config.log_level);
  bool thread_multiple = false;
  status = StartMpi(config, &thread_multiple);
  if (!status.ok()) return Report(status);
  if (DiesInInit("start")) raise(SIGKILL);
  MPI_Comm base = comm_f2c == -1 ? MPI_COMM_WORLD : MPI_Comm_f2c(static_cast<MPI_Fint>(comm_f2c));
  // The last world lost a rank (ULFM): this one is its survivors (collective over them).
  const bool from_failed = g_failed_world != MPI_COMM_NULL && comm_f2c == -1;
  if (comm_f2c == -1 && !g_joined_parents) {  // spawned by a job that grew: join it
    g_joined_parents = true;
    status = JoinParents(&g_job);
    if (!status.ok()) return Report(status);
    g_spawned = g_job != MPI_COMM_NULL;
  }
  if (comm_f2c == -1 && !from_failed && g_grow.count > 0) {  // perseus_grow: grow first
    GrowRequest request;
    std::swap(request, g_grow);
    MPI_Comm grown = MPI_COMM_NULL;
    status = Grow(g_job != MPI_COMM_NULL ? g_job : MPI_COMM_WORLD, request, &grown);
    if (!status.ok()) return Report(status);
    if (g_job != MPI_COMM_NULL) MPI_Comm_free(&g_job);
    g_job = grown;
  }
  if (comm_f2c == -1 && g_job != MPI_COMM_NULL) base = g_job;
  MPI_Comm parent = from_failed ? g_failed_world : base;
  // Under ULFM a process may die while the world is formed: every survivor then forms
  // it again from `parent`'s survivors (tests/mpi/test_fault_tolerance_edges.py).
  const bool may_reform = FaultTolerant() && comm_f2c == -1;
  ReturnErrors world_errors(may_reform ? MPI_COMM_WORLD : MPI_COMM_NULL);
  MPI_Comm world = MPI_COMM_NULL;
  std::unique_ptr<Engine> engine;
  for (bool shrink = from_failed;; shrink = true) {
    status = FormWorld(parent, shrink, config, config_status, thread_multiple, &world, &engine);
    if (!may_reform) break;
    // Uniform over the survivors, unlike the steps' own errors (a death fails some
    // ranks' collectives, not all): bit 0, formed here; bit 1, no error other than a
    // failed process here.
    int flags = (status.ok() ? 1 : 0) | (status.ok() || status.code == PERSEUS_RANK_FAILED ? 2 : 0);
    Status agreed = AgreeAmongSurvivors(parent, &flags);
    if (agreed.ok() && (flags & 1)) break;
    if (engine) {
      engine->Shutdown();  // frees the world
      engine.reset();
      world = MPI_COMM_NULL;
      Timeline::Get().Stop();
    }
    if (!agreed.ok() || !(flags & 2)) {
      if (status.ok())
        status = agreed.ok() ? Status::Error(PERSEUS_MPI_ERROR, "init() failed on another rank")
                             : agreed;
      break;
    }
    if (world != MPI_COMM_NULL) MPI_Comm_free(&world);
    g_lost_a_rank = true;  // MPI_Finalize's closing fence would wait for the dead
    PERSEUS_LOG(kWarning) << "a process failed while the world was formed ("
                          << (status.ok() ? "on another rank" : status.message)
                          << "): forming it again from the survivors";
  }
  if (from_failed) {
    MPI_Comm_free(&g_failed_world);
    g_failed_world_here.clear();
    g_failed_world_runtime.clear();
  }
  if (!status.ok()) {
    if (world != MPI_COMM_NULL) MPI_Comm_free(&world);
    return Report(status);
  }
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  slot = std::move(engine);
  WatchFatalSignals(LeaveOnSignal);
  // Rank 0 only: every rank normally has the same environment (the launcher exports
  // it), and one copy of each warning is easier to see than one per rank.
  if (rank == 0) WarnUnknownVariables();
  return PERSEUS_SUCCESS;
}

perseus_status_t perseus_shutdown(void) {
  if (g_forked_from) return PERSEUS_SUCCESS;  // the parent's engine and timeline are not ours
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::timed_mutex> lock(*g_mu);
    engine.swap(*g_engine);
  }
  if (engine) {
    engine->Shutdown();
    KeepLastWorld(*engine);
  }
  Timeline::Get().Stop();  // after the engine: its last events are in
  return PERSEUS_SUCCESS;
}

perseus_status_t perseus_shutdown_within(double timeout_s) {
  const auto limit = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::max(0.0, timeout_s)));
  const auto give_up = std::chrono::steady_clock::now() + limit;
  if (g_forked_from) return PERSEUS_SUCCESS;
  std::shared_ptr<Engine> engine;
  {
    std::unique_lock<std::timed_mutex> lock(*g_mu, std::defer_lock);
    if (!lock.try_lock_until(give_up))
      return Report(Status::Error(PERSEUS_TIMEOUT, "shutdown: init() or shutdown() is still running"));
    engine.swap(*g_engine);
  }
  if (!engine) return PERSEUS_SUCCESS;
  // The engine stops on a helper thread, so the wait is bounded: a thread stuck in
  // a failed MPI call may hold what the engine needs to stop.
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto done = std::make_shared<Done>();
  std::thread stopper([engine, done]() mutable {
    engine->Shutdown();
    KeepLastWorld(*engine);
    engine.reset();
    std::lock_guard<std::mutex> lock(done->mu);
    done->done = true;
    done->cv.notify_all();
  });
  engine.reset();
  bool stopped;
  {
    std::unique_lock<std::mutex> lock(done->mu);
    stopped = done->cv.wait_until(lock, give_up, [&] { return done->done; });
  }
  if (!stopped) {
    stopper.detach();  // left to the process's exit
    return Report(Status::Error(PERSEUS_TIMEOUT, "shutdown did not finish within " +
                                                     std::to_string(timeout_s) + " s"));
  }
  stopper.join();
  Timeline::Get().Stop();
  return PERSEUS_SUCCESS;
}

perseus_status_t perseus_leave(const char* how, double timeout_s) {
  if (std::shared_ptr<Engine> engine = Current()) engine->SetLeavingHow(how ? how : "");
  return perseus_shutdown_within(timeout_s);
}

perseus_status_t perseus_start_timeline(const char* path, int32_t mark_cycles) {
  auto engine = Current();
  if (!engine) return Report(NotInitialized());
  if (path == nullptr || *path == '\0')
    return Report(Status::Error(PERSEUS_INVALID_ARGUMENT, "start_timeline needs a file path"));
  Status status = engine->StartTimeline(path, mark_cycles != 0);
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

perseus_status_t perseus_stop_timeline(void) {
  if (g_forked_from) return PERSEUS_SUCCESS;  // the parent's file, and maybe its locked mutex
  Timeline::Get().Stop();
  return PERSEUS_SUCCESS;
}

perseus_status_t perseus_check_mpi_library(void) {
  Status status = CheckMpiLibrary();
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

const char* perseus_mpi_header_version(void) { return HeaderMpi(); }

int perseus_is_initialized(void) { return Current() ? 1 : 0; }

int perseus_world_failed(void) {
  auto engine = Current();
  return engine && engine->world_failed() ? 1 : 0;
}

int perseus_joined_job(void) { return g_spawned ? 1 : 0; }

perseus_status_t perseus_keep_in_job(int32_t keep) {
  std::lock_guard<std::timed_mutex> lock(*g_mu);
  if (*g_engine || !g_started)
    return Report(Status::Error(PERSEUS_INVALID_ARGUMENT,
                                "perseus_keep_in_job: call it between shutdown() and init()"));
  // Those that leave end without MPI_Finalize (which would wait for the job's end): only
  // a job that outlives its processes (ULFM) may lose them.
  if (!FaultTolerant())
    return Report(Status::Error(PERSEUS_UNSUPPORTED,
                                "perseus_keep_in_job: ranks can leave a running job only under "
                                "ULFM (mpirun --with-ft ulfm)"));
  MPI_Comm job = g_job != MPI_COMM_NULL ? g_job : MPI_COMM_WORLD;
  int rank = 0;
  MPI_Comm_rank(job, &rank);
  MPI_Comm kept = MPI_COMM_NULL;
  int rc;
  {
    CallWatch watch(g_peer_timeout_s,
                    "shrinking the job in place failed: MPI_Comm_split did not finish within " +
                        PeerTimeoutText(g_peer_timeout_s) +
                        ": a process of the job probably ended during it (perseusrun "
                        "--elastic starts the job on the new hosts)",
                    kGrowFailedExitCode);
    ReturnErrors job_errors(job);
    rc = MPI_Comm_split(job, keep ? 0 : MPI_UNDEFINED, rank, &kept);
  }
  if (rc != MPI_SUCCESS) LeaveFailedResize("shrinking", MpiStatus(rc, "MPI_Comm_split").message);
  if (!keep) return PERSEUS_SUCCESS;  // the caller ends this process next
  MPI_Comm_set_errhandler(kept, MPI_ERRORS_RETURN);
  if (g_job != MPI_COMM_NULL) MPI_Comm_free(&g_job);
  g_job = kept;  // the next init's world, and a later grow's base
  // As after a shrink: the processes that left are gone for MPI_Finalize and for the
  // links made before (their disconnect would wait for them).
  g_lost_a_rank = true;
  g_links_after_shrink = g_job_links.size();
  return PERSEUS_SUCCESS;
}

perseus_status_t perseus_grow(int32_t count, const char* command, const char* args, int32_t nargs,
                              const char* wdir, const char* hosts, const char* add_hosts) {
  std::lock_guard<std::timed_mutex> lock(*g_mu);
  if (count < 0 || nargs < 0 || (count > 0 && (command == nullptr || *command == '\0')) ||
      (nargs > 0 && args == nullptr))
    return Report(Status::Error(PERSEUS_INVALID_ARGUMENT,
                                "perseus_grow: a count of 0 or more, a command and its arguments"));
  GrowRequest request;
  request.count = count;
  if (count > 0) {
    request.command = command;
    for (int32_t i = 0; i < nargs; ++i) {
      request.args.emplace_back(args);
      args += request.args.back().size() + 1;
    }
    if (wdir != nullptr) request.wdir = wdir;
    if (hosts != nullptr && *hosts != '\0') {
      // host:count,... and host:slots,... (PMIX_ADD_HOST), each value within an MPI
      // info value (MPI_Info_set fails, fatally, on a longer one).
      const auto bad = [&](const std::string& why) {
        return Report(Status::Error(PERSEUS_INVALID_ARGUMENT, "perseus_grow: " + why));
      };
      const auto split = [](const char* list) {
        std::vector<std::pair<std::string, std::string>> entries;
        std::stringstream in(list == nullptr ? "" : list);
        for (std::string entry; std::getline(in, entry, ',');) {
          const size_t colon = entry.rfind(':');
          entries.emplace_back(entry.substr(0, std::min(colon, entry.size())),
                               colon == std::string::npos ? "" : entry.substr(colon + 1));
        }
        return entries;
      };
      int placed = 0;
      for (const auto& [host, n] : split(hosts)) {
        const int here = std::atoi(n.c_str());
        if (host.empty() || here <= 0 || host.size() + 8 >= MPI_MAX_INFO_VAL)
          return bad("hosts is host:count,... with counts of 1 or more and hosts of under " +
                     std::to_string(MPI_MAX_INFO_VAL - 8) + " characters, not '" + hosts + "'");
        request.hosts.push_back({host, here, ""});
        placed += here;
      }
      if (placed != count)
        return bad("hosts '" + std::string(hosts) + "' place " + std::to_string(placed) +
                   " process(es), not " + std::to_string(count));
      for (const auto& [host, slots] : split(add_hosts)) {
        auto place = std::find_if(request.hosts.begin(), request.hosts.end(),
                                  [&](const GrowRequest::Place& p) { return p.host == host; });
        if (place == request.hosts.end() || std::atoi(slots.c_str()) <= 0)
          return bad("add_hosts is host:slots,... of hosts in hosts, not '" +
                     std::string(add_hosts) + "'");
        place->add = host + ":" + slots;
      }
    }
  }
  g_grow = std::move(request);
  return PERSEUS_SUCCESS;
}

const char* perseus_fault_tolerance(int32_t* built_out, int32_t* enabled_out) {
  static thread_local std::string reason;
  reason = perseus::FaultToleranceReason();
  // Once MPI started: how a frozen rank is told from a slow one.
  if (perseus::FaultTolerant() && !perseus::FailureDetectorSummary().empty())
    reason += "; " + perseus::FailureDetectorSummary();
  if (built_out) *built_out = perseus::BuiltWithUlfm() ? 1 : 0;
  if (enabled_out) *enabled_out = perseus::FaultTolerant() ? 1 : 0;
  return reason.c_str();
}
const char* perseus_last_error(void) { return g_last_error.c_str(); }

const char* perseus_status_string(perseus_status_t status) {
  switch (status) {
    case PERSEUS_SUCCESS: return "success";
    case PERSEUS_INVALID_ARGUMENT: return "invalid argument";
    case PERSEUS_NOT_INITIALIZED: return "not initialized";
    case PERSEUS_MISMATCH: return "ranks disagree";
    case PERSEUS_SHUT_DOWN: return "shut down";
    case PERSEUS_MPI_ERROR: return "MPI error";
    case PERSEUS_CONFIG_ERROR: return "configuration error";
    case PERSEUS_UNSUPPORTED: return "not supported";
    case PERSEUS_TIMEOUT: return "timed out";
    case PERSEUS_INTERNAL_ERROR: return "internal error";
    case PERSEUS_NON_FINITE: return "NaN or Inf in input";
    case PERSEUS_WITHDRAWN: return "withdrawn";
    case PERSEUS_RANK_FAILED: return "a rank failed";
  }
  return "unknown status";
}

perseus_status_t perseus_counters(int64_t* out, int32_t n) {
  if (out == nullptr || n < 0 || n > PERSEUS_NUM_COUNTERS)
    return Report(Status::Error(PERSEUS_INVALID_ARGUMENT, "perseus_counters: bad arguments"));
  for (int32_t i = 0; i < n; ++i) out[i] = perseus::CounterValue(static_cast<perseus::Counter>(i));
  return PERSEUS_SUCCESS;
}

perseus_status_t perseus_rank(int32_t* out) {
  return GetInt(out, [](Engine& e) { return e.topology().rank; });
}
perseus_status_t perseus_size(int32_t* out) {
  return GetInt(out, [](Engine& e) { return e.topology().size; });
}
perseus_status_t perseus_local_rank(int32_t* out) {
  return GetInt(out, [](Engine& e) { return e.topology().local_rank; });
}
perseus_status_t perseus_local_size(int32_t* out) {
  return GetInt(out, [](Engine& e) { return e.topology().local_size; });
}
perseus_status_t perseus_cross_rank(int32_t* out) {
  return GetInt(out, [](Engine& e) { return e.topology().cross_rank; });
}
perseus_status_t perseus_cross_size(int32_t* out) {
  return GetInt(out, [](Engine& e) { return e.topology().cross_size; });
}
perseus_status_t perseus_rank_nodes(int32_t* out, int32_t n) {
  auto engine = Current();
  if (!engine) return Report(NotInitialized());
  const std::vector<int>& nodes = engine->topology().nodes.node_of_rank;
  if (out == nullptr || n != static_cast<int32_t>(nodes.size()))
    return Report(Status::Error(PERSEUS_INVALID_ARGUMENT,
                                "perseus_rank_nodes: room for size() ranks expected"));
  std::copy(nodes.begin(), nodes.end(), out);
  return PERSEUS_SUCCESS;
}
perseus_status_t perseus_is_homogeneous(int32_t* out) {
  return GetInt(out, [](Engine& e) { return e.topology().nodes.homogeneous ? 1 : 0; });
}
perseus_status_t perseus_mpi_threads_supported(int32_t* out) {
  return GetInt(out, [](Engine& e) { return e.thread_multiple() ? 1 : 0; });
}
perseus_status_t perseus_lane_count(int32_t* out) {
  return GetInt(out, [](Engine& e) { return e.lanes(); });
}
perseus_status_t perseus_meeting_seconds(double* out) {
  auto engine = Current();
  if (!engine) return Report(NotInitialized());
  *out = engine->config().MeetingSeconds();
  return PERSEUS_SUCCESS;
}

const char* perseus_config_string(void) {
  static thread_local std::string text;
  auto engine = Current();
  if (engine) {
    text = DescribeConfig(engine->config());
    // Not a variable: where the autotuner is (tuning, or what it settled on).
    std::string tuned = engine->autotune_state();
    if (!tuned.empty()) text += "PERSEUS_AUTOTUNE_STATE=" + tuned + "\n";
  } else {
    Config config;
    Status status = LoadConfig(&config);
    text = status.ok() ? DescribeConfig(config) : "error: " + status.message + "\n";
  }
  return text.c_str();
}

perseus_status_t perseus_add_process_set(const int32_t* ranks, int32_t nranks, int32_t* id_out) {
  auto engine = Current();
  if (!engine) return Report(NotInitialized());
  Status status = engine->AddProcessSet(ranks, nranks, id_out);
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

perseus_status_t perseus_remove_process_set(int32_t id) {
  auto engine = Current();
  if (!engine) return Report(NotInitialized());
  Status status = engine->RemoveProcessSet(id);
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

static perseus_status_t Describe(int32_t id, std::vector<int>* ranks, int* rank) {
  auto engine = Current();
  if (!engine) return Report(NotInitialized());
  Status status = engine->DescribeProcessSet(id, ranks, rank);
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

perseus_status_t perseus_process_set_rank(int32_t id, int32_t* rank_out) {
  std::vector<int> ranks;
  int rank;
  perseus_status_t s = Describe(id, &ranks, &rank);
  if (s == PERSEUS_SUCCESS) *rank_out = rank;
  return s;
}

perseus_status_t perseus_process_set_size(int32_t id, int32_t* size_out) {
  std::vector<int> ranks;
  int rank;
  perseus_status_t s = Describe(id, &ranks, &rank);
  if (s == PERSEUS_SUCCESS) *size_out = static_cast<int32_t>(ranks.size());
  return s;
}

perseus_status_t perseus_process_set_hold(int32_t id, int32_t gpu, int64_t* bytes_out,
                                          double* ms_out) {
  auto engine = Current();
  if (!engine) return Report(NotInitialized());
  perseus::Hold hold;
  Status status = engine->ProcessSetHold(id, gpu != 0, &hold);
  if (!status.ok()) return Report(status);
  *bytes_out = hold.bytes;
  *ms_out = hold.ms;
  return PERSEUS_SUCCESS;
}

perseus_status_t perseus_process_set_ranks(int32_t id, int32_t* out, int32_t capacity,
                                           int32_t* size_out) {
  std::vector<int> ranks;
  int rank;
  perseus_status_t s = Describe(id, &ranks, &rank);
  if (s != PERSEUS_SUCCESS) return s;
  *size_out = static_cast<int32_t>(ranks.size());
  for (int32_t i = 0; i < capacity && i < *size_out; ++i) out[i] = ranks[i];
  return PERSEUS_SUCCESS;
}

perseus_status_t perseus_check_reduction(int32_t op_type, int32_t reduce_op, int32_t dtype) {
  Status status = CheckReduction(op_type, reduce_op, dtype);
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

perseus_status_t perseus_check_rows(int32_t op_type, int32_t process_set, int32_t ndim,
                                    int64_t rows, const int64_t* splits, int32_t nsplits,
                                    int64_t* rows_out) {
  if (rows_out != nullptr) *rows_out = -1;
  std::vector<int> ranks;
  int set_rank;
  int32_t rank = 0;
  perseus_status_t s = Describe(process_set, &ranks, &set_rank);
  if (s == PERSEUS_SUCCESS) s = perseus_rank(&rank);
  if (s != PERSEUS_SUCCESS) return s;
  int size = static_cast<int>(ranks.size());
  // In perseus_enqueue's order: membership, then the request's own rules.
  Status status = CheckMember(rank, set_rank, process_set);
  if (status.ok()) status = CheckDims(op_type, ndim);
  if (status.ok() && op_type == PERSEUS_ALLTOALL)
    status = AlltoallSplits(rows, splits, nsplits, size, nullptr);
  if (status.ok() && op_type == PERSEUS_REDUCESCATTER && rows_out != nullptr)
    *rows_out = ScatterRows(rows, set_rank, size);
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

perseus_status_t perseus_enqueue(const perseus_request_t* requests, int32_t n,
                                 int64_t* handles_out) {
  auto engine = Current();
  if (!engine) return Report(NotInitialized());
  if (n < 0 || (n > 0 && (requests == nullptr || handles_out == nullptr)))
    return Report(Status::Error(PERSEUS_INVALID_ARGUMENT, "perseus_enqueue: bad arguments"));
  Status status = engine->Enqueue(requests, n, handles_out);
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

perseus_status_t perseus_enqueue_deferred(const perseus_request_t* requests, int32_t n,
                                          int64_t* handles_out) {
  auto engine = Current();
  if (!engine) return Report(NotInitialized());
  if (n < 0 || (n > 0 && (requests == nullptr || handles_out == nullptr)))
    return Report(Status::Error(PERSEUS_INVALID_ARGUMENT, "perseus_enqueue_deferred: bad arguments"));
  Status status = engine->Enqueue(requests, n, handles_out, /*wake_engine=*/false);
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

perseus_status_t perseus_enqueue_and_drive(const perseus_request_t* requests, int32_t n,
                                           int64_t* handles_out, double max_drive_s) {
  auto engine = Current();
  if (!engine) return Report(NotInitialized());
  if (n < 0 || (n > 0 && (requests == nullptr || handles_out == nullptr)))
    return Report(Status::Error(PERSEUS_INVALID_ARGUMENT, "perseus_enqueue_and_drive: bad arguments"));
  Status status = engine->EnqueueAndDrive(requests, n, handles_out, max_drive_s);
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

perseus_status_t perseus_run(const perseus_request_t* requests, int32_t n, int64_t* handles_out,
                             double timeout_s) {
  auto engine = Current();
  if (!engine) return Report(NotInitialized());
  if (n <= 0 || requests == nullptr || handles_out == nullptr)
    return Report(Status::Error(PERSEUS_INVALID_ARGUMENT, "perseus_run: bad arguments"));
  const auto start = Clock::now();
  Status status = engine->EnqueueAndDrive(requests, n, handles_out,
                                          timeout_s < 0 ? kWaitDriveS : std::min(timeout_s, kWaitDriveS));
  if (!status.ok()) return Report(status);
  if (timeout_s >= 0)
    timeout_s = std::max(0.0, timeout_s - std::chrono::duration<double>(Clock::now() - start).count());
  int32_t failed = -1;
  perseus_status_t waited = perseus_wait_all(handles_out, n, timeout_s, &failed);
  if (waited == PERSEUS_TIMEOUT) return waited;
  // The first failure in list order is the one to report: wait for the rest too, so
  // that every handle is complete before it is released.
  std::string message = waited == PERSEUS_SUCCESS ? std::string() : g_last_error;
  for (int32_t i = failed + 1; failed >= 0 && i < n; ++i) g_handles.Wait(handles_out[i], -1);
  for (int32_t i = 0; i < n; ++i) g_handles.Release(handles_out[i]);
  if (waited == PERSEUS_SUCCESS) return PERSEUS_SUCCESS;
  g_last_error = message;
  return waited;
}

perseus_status_t perseus_poll(int64_t handle, int32_t* done_out) {
  if (g_forked_from) return Report(ForkedChild());
  bool done = false;
  Status status = g_handles.Poll(handle, &done);
  if (!status.ok()) return Report(status);
  if (!done)
    if (auto engine = Current()) engine->EndHold();
  *done_out = done ? 1 : 0;
  return PERSEUS_SUCCESS;
}

perseus_status_t perseus_wait(int64_t handle, double timeout_s) {
  if (g_forked_from) return Report(ForkedChild());
  WaiterScope waiting;
  bool done = false;
  Status status = g_handles.Poll(handle, &done);
  if (!status.ok()) return Report(status);
  if (!done) {
    // A waiting thread has nothing else to do: it runs the engine for a while
    // (bounded by the timeout), then sleeps on the handle.
    if (auto engine = Current()) {
      const auto start = Clock::now();
      engine->Drive(&handle, 1, timeout_s < 0 ? kWaitDriveS : std::min(timeout_s, kWaitDriveS));
      if (timeout_s >= 0)
        timeout_s = std::max(0.0, timeout_s - std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
  status = g_handles.Wait(handle, timeout_s);
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

perseus_status_t perseus_wait_all(const int64_t* handles, int32_t n, double timeout_s,
                                  int32_t* index_out) {
  if (n < 0 || (n > 0 && handles == nullptr) || index_out == nullptr)
    return Report(Status::Error(PERSEUS_INVALID_ARGUMENT, "perseus_wait_all: bad arguments"));
  *index_out = -1;
  if (g_forked_from) return Report(ForkedChild());
  WaiterScope waiting;
  bool all_done = true;
  for (int32_t i = 0; i < n; ++i) {
    bool done = false;
    Status status = g_handles.Poll(handles[i], &done);
    if (!status.ok()) {
      *index_out = i;
      return Report(status);
    }
    all_done = all_done && done;
  }
  const auto start = Clock::now();
  auto left = [&] {
    if (timeout_s < 0) return -1.0;
    return std::max(0.0, timeout_s - std::chrono::duration<double>(Clock::now() - start).count());
  };
  // One drive for the whole set, as perseus_wait does for one handle.
  if (!all_done)
    if (auto engine = Current())
      engine->Drive(handles, n, timeout_s < 0 ? kWaitDriveS : std::min(timeout_s, kWaitDriveS));
  for (int32_t i = 0; i < n; ++i) {
    Status status = g_handles.Wait(handles[i], left());
    if (!status.ok()) {
      *index_out = i;
      return Report(status);
    }
  }
  return PERSEUS_SUCCESS;
}

perseus_status_t perseus_on_complete(const int64_t* handles, int32_t n, perseus_callback_t cb,
                                     void* arg) {
  if (n < 0 || (n > 0 && handles == nullptr) || cb == nullptr)
    return Report(Status::Error(PERSEUS_INVALID_ARGUMENT, "perseus_on_complete: bad arguments"));
  if (g_forked_from) return Report(ForkedChild());
  // A pending callback counts as a waiter (MPI waits spin, requests are not held),
  // as the thread blocked in perseus_wait it replaces would.
  AddWaiter();
  bool pending = false;
  Status status = g_handles.OnComplete(
      handles, n,
      [cb, arg](const Status& s) {
        RemoveWaiter();
        cb(arg, s.code, s.message.c_str());
      },
      &pending);
  if (!status.ok()) {
    RemoveWaiter();
    return Report(status);
  }
  if (pending)
    if (auto engine = Current()) engine->EndHold();
  return PERSEUS_SUCCESS;
}

perseus_status_t perseus_handle_output(int64_t handle, void** data, int64_t* shape, int32_t* ndim,
                                       const int64_t** recv_splits, int32_t* nsplits) {
  if (g_forked_from) return Report(ForkedChild());
  Result* result = nullptr;
  Status status = g_handles.TakeResult(handle, &result);
  if (!status.ok()) return Report(status);
  if (data) {
    *data = result->data;
    result->data = nullptr;  // the caller owns it now
  }
  if (ndim) *ndim = static_cast<int32_t>(result->shape.size());
  if (shape)
    for (size_t i = 0; i < result->shape.size() && i < PERSEUS_MAX_DIMS; ++i)
      shape[i] = result->shape[i];
  if (recv_splits) *recv_splits = result->recv_splits.data();
  if (nsplits) *nsplits = static_cast<int32_t>(result->recv_splits.size());
  return PERSEUS_SUCCESS;
}

perseus_status_t perseus_point_to_point(const perseus_p2p_t* message, int64_t* handle_out) {
  if (g_forked_from) return Report(ForkedChild());
  auto engine = Current();
  if (!engine) return Report(NotInitialized());
  if (message == nullptr || handle_out == nullptr || message->bytes < 0 ||
      (message->data == nullptr && message->bytes > 0))
    return Report(Status::Error(PERSEUS_INVALID_ARGUMENT, "perseus_point_to_point: bad arguments"));
  PointToPointOp op;
  op.recv = message->recv != 0;
  op.data = message->data;
  op.bytes = message->bytes;
  op.peer = op.recv && message->peer == -1 ? MPI_ANY_SOURCE : message->peer;
  op.tag = message->tag;
  op.set_id = message->process_set;
  op.device = message->device < 0 ? -1 : message->device;
  op.stream = message->stream;
  Status status = engine->PostPointToPoint(op, handle_out);
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

perseus_status_t perseus_withdraw(int64_t handle, const char* reason) {
  if (g_forked_from) return Report(ForkedChild());
  auto engine = Current();
  if (!engine) return Report(NotInitialized());
  const int rank = engine->topology().rank;
  std::string why = reason ? reason : "";
  if (engine->WithdrawPointToPoint(handle, why)) return PERSEUS_SUCCESS;
  engine->Withdraw(handle, [rank, why](const std::string& name, const std::vector<int>& missing) {
    return Status::Error(PERSEUS_WITHDRAWN, "'" + name + "' was withdrawn on rank " +
                                                std::to_string(rank) + ": rank(s) " +
                                                perseus::ListString(missing) +
                                                " had not submitted it " + why);
  });
  return PERSEUS_SUCCESS;
}

perseus_status_t perseus_process_set_probe(int32_t id, double interval_s) {
  auto engine = Current();
  if (!engine) return Report(NotInitialized());
  if (!(interval_s > 0))
    return Report(Status::Error(PERSEUS_INVALID_ARGUMENT,
                                "perseus_process_set_probe: the interval must be positive"));
  Status status = engine->SetProbeInterval(id, interval_s);
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

perseus_status_t perseus_release(int64_t handle) {
  if (g_forked_from) return Report(ForkedChild());
  Status status = g_handles.Release(handle);
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

void perseus_free_buffer(void* data) { std::free(data); }

perseus_status_t perseus_set_gpu_library_dirs(const char* dirs) {
  Status status = SetGpuLibraryDirs(dirs ? dirs : "");
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

perseus_status_t perseus_gpu_load(int32_t* cuda_ok, int32_t* nccl_ok) {
  GpuSettings settings;
  Status status = CurrentGpuSettings(&settings);
  bool cuda = false, nccl = false;
  if (status.ok()) status = LoadGpu(settings, &cuda, &nccl);
  if (cuda_ok) *cuda_ok = cuda ? 1 : 0;
  if (nccl_ok) *nccl_ok = nccl ? 1 : 0;
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

const char* perseus_gpu_describe(void) {
  static thread_local std::string text;
  GpuSettings settings;
  Status status = CurrentGpuSettings(&settings);
  text = status.ok() ? DescribeGpu(settings) : "error: " + status.message + "\n";
  return text.c_str();
}

perseus_status_t perseus_stream_wait(int64_t handle, void* stream) {
  if (g_forked_from) return Report(ForkedChild());
  std::shared_ptr<void> event;  // held: a concurrent release cannot recycle it meanwhile
  Status status = g_handles.DoneEvent(handle, &event);
  if (status.ok()) status = StreamWaitEvent(stream, event);
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

perseus_status_t perseus_stream_wait_all(const int64_t* handles, int32_t n, void* stream) {
  if (g_forked_from) return Report(ForkedChild());
  Status first;
  std::vector<std::shared_ptr<void>> events;  // held: a concurrent release cannot recycle them
  for (int32_t i = 0; i < n; ++i) {
    std::shared_ptr<void> event;
    Status status = g_handles.DoneEvent(handles[i], &event);
    if (!status.ok()) {
      if (first.ok()) first = status;
      continue;
    }
    if (event && std::find(events.begin(), events.end(), event) == events.end())
      events.push_back(std::move(event));
  }
  for (const auto& event : events) {
    Status status = StreamWaitEvent(stream, event);
    if (!status.ok() && first.ok()) first = status;
  }
  return first.ok() ? PERSEUS_SUCCESS : Report(first);
}

perseus_status_t perseus_free_device_buffer(void* data, void* stream) {
  Status status = FreeDeviceBuffer(data, stream);
  return status.ok() ? PERSEUS_SUCCESS : Report(status);
}

}  // extern "C"
