// The processes of this MPI job on this host, seen from /proc: what a grow in place
// (c_api.cc) watches so that it leaves at once when one of them ends during the spawn
// or the merge, which otherwise wait for it until the peer timeout (Open MPI 5.0.11: the
// merge spins; ULFM's MPIX_Comm_get_failed on the grow's intercommunicator named no
// failed process there, tried).
#ifndef PERSEUS_MPI_JOB_PROCESSES_HERE_H_
#define PERSEUS_MPI_JOB_PROCESSES_HERE_H_

#include <mutex>
#include <string>
#include <vector>

namespace perseus {

// One process, as /proc showed it: its id and its start time (field 22 of
// /proc/<pid>/stat), so that a process id reused since is not taken for it.
struct HostProcess {
  int pid = 0;
  unsigned long long start = 0;
};

// The other processes that the launcher's daemon on this host started for this job or a
// job it spawned (this process's siblings: the same parent, and the same PMIx server,
// PMIX_SERVER_URI* in their environment) and that still run. Empty where this process
// has no PMIx server (a singleton) or /proc cannot tell.
std::vector<HostProcess> JobProcessesHere();

// Follows the job's processes on this host while a grow waits for them. Thread-safe.
class JobProcessesWatch {
 public:
  JobProcessesWatch() = default;
  // Follows `pids` too (other processes known to be the job's here, perhaps ended
  // before this looked: the first call names those).
  explicit JobProcessesWatch(const std::vector<int>& pids);

  // "" while every process of the job seen here by a call so far still runs, else which
  // ended ("process 123, 124"). Each call first looks for those started since the last
  // (the new processes of a spawn appear during it), so one that ends a moment after it
  // started is still seen to end.
  std::string Ended();
  // How many processes the calls after the first found (a spawn's new ones), and
  // ending those that still run (SIGKILL).
  size_t Appeared();
  void EndAppeared();

 private:
  std::mutex mu_;
  std::vector<HostProcess> seen_;
  size_t first_look_ = 0;  // seen_.size() after the first call
  bool looked_ = false;
};

}  // namespace perseus

#endif  // PERSEUS_MPI_JOB_PROCESSES_HERE_H_
