// Each rank's process as Open MPI's runtime names it (its PMIx namespace and rank), so
// that a survivor can ask the runtime to end a rank declared failed on another host.
// Why: a frozen rank alone on its host is declared failed by ULFM's heartbeat detector
// and left behind, but nothing ends its process there, and mpirun waited for it at the
// end of the job for good (Open MPI 5.0.11). The runtime's job control ends it.
#ifndef PERSEUS_MPI_RUNTIME_PROCESSES_H_
#define PERSEUS_MPI_RUNTIME_PROCESSES_H_

#include <mpi.h>

#include <cstdint>
#include <vector>

namespace perseus {

// A process's name in the PMIx runtime (the layout of PMIx's pmix_proc_t, fixed by the
// PMIx standard's ABI: a 255-character namespace, nul-terminated, and a rank).
struct RuntimeProcess {
  char nspace[256];
  uint32_t rank;
};

// The runtime names of `world`'s ranks, in rank order (collective), from the variables
// the launcher gives each process (PMIX_NAMESPACE, PMIX_RANK); empty where a rank has
// none (not started by a PMIx launcher, or a singleton).
std::vector<RuntimeProcess> GatherRuntimeProcesses(MPI_Comm world);

// Asks the runtime to end `processes` (PMIx_Job_control_nb with PMIX_JOB_CTRL_KILL),
// without waiting. Harmless for a process already gone. Returns false, doing nothing,
// where this process's MPI runs no PMIx client (MPICH, a singleton) or the call failed.
bool AskRuntimeToEnd(const std::vector<RuntimeProcess>& processes);

}  // namespace perseus

#endif  // PERSEUS_MPI_RUNTIME_PROCESSES_H_
