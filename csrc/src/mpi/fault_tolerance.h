// What Perseus asks of ULFM (User-Level Failure Mitigation: Open MPI 5's ftmpi
// extension, run with `mpirun --with-ft ulfm`): whether the job may outlive a rank,
// whether an MPI error means a process failed, and the calls that take the survivors
// on (revoke, shrink). The only file that includes <mpi-ext.h>; built against an MPI
// without the extension (MPICH, Open MPI 4), every function says there is no ULFM.
#ifndef PERSEUS_MPI_FAULT_TOLERANCE_H_
#define PERSEUS_MPI_FAULT_TOLERANCE_H_

#include <mpi.h>

#include <string>
#include <vector>

#include "common/status.h"
#include "mpi/runtime_processes.h"

namespace perseus {

// This core was built with ULFM's calls.
bool BuiltWithUlfm();
// ... and this run enabled them (mpirun --with-ft ulfm, i.e. OMPI_MCA_mpi_ft_enable):
// a rank's death then makes MPI calls fail instead of ending the job.
bool FaultTolerant();
// Why FaultTolerant() says what it says, for init()'s message and --check-build.
std::string FaultToleranceReason();

// Whether `mpi_rc` reports a failed process or a communicator revoked after one.
bool IsProcessFailure(int mpi_rc);
// Makes every pending and later operation on `comm` fail on every rank (no-op
// without ULFM), so that ranks blocked with a dead peer, or not yet aware, find out.
void Revoke(MPI_Comm comm);
// The ranks of `comm` known here to have failed (sorted; empty without ULFM).
std::vector<int> FailedRanks(MPI_Comm comm);
// A communicator of the survivors of `comm`, in their order (collective over them).
Status Shrink(MPI_Comm comm, MPI_Comm* out);
// The bitwise AND of `*flags` over the survivors of `comm` (MPIX_Comm_agree: it
// completes, with the same value everywhere, though a process failed before or during
// it), into `*flags`. An error without ULFM.
Status AgreeAmongSurvivors(MPI_Comm comm, int* flags);

// After Shrink(failed, survivors), collective over the survivors: the processes of
// `failed` on this host (`here`: its rank there, process id) that are not among the
// survivors but still run (declared failed while frozen, by Open MPI's heartbeat
// detector) are killed, so that one that wakes up cannot rejoin and the launcher sees
// it end. Says so for each. Those on other hosts (`runtime`: every process of `failed`
// as the runtime names it; may be empty) the first survivor asks Open MPI's runtime to
// end, for one alone on its host has no survivor there to end it.
void EndExcludedRanks(MPI_Comm failed, MPI_Comm survivors,
                      const std::vector<std::pair<int, int>>& here,
                      const std::vector<RuntimeProcess>& runtime);

// The stall inspector gave up on `lost` (world ranks that answered no ping for the
// stall shutdown time or the peer timeout) in a fault-tolerant run: those that run on
// this host (`here`) and still run are killed (SIGKILL), saying so, so that MPI sees
// them fail, the survivors can shrink past them, and one that wakes up cannot rejoin.
// Returns whether every rank of `lost` runs on this host: only then is its failure
// certain to reach MPI (a frozen rank alone on another host is seen only by Open
// MPI's heartbeat detector).
bool EndSilentRanksHere(const std::vector<int>& lost,
                        const std::vector<std::pair<int, int>>& here);

}  // namespace perseus

#endif  // PERSEUS_MPI_FAULT_TOLERANCE_H_
