// Whether the launcher that started this process speaks a process-management interface
// the core's MPI can use. MPICH finds PMIx variables in the ranks of Open MPI's
// mpirun (or srun --mpi=pmix, PRRTE), and one built without PMIx aborts inside
// MPI_Init ("unsupported PMI version PMIx"), once per rank, before Perseus could say a
// word. This check reads the environment alone, so it runs before MPI_Init and can
// name the core's MPI and the launcher to use instead.
#ifndef PERSEUS_MPI_LAUNCHER_PMI_H_
#define PERSEUS_MPI_LAUNCHER_PMI_H_

#include <string>

#include "common/status.h"
#include "mpi/launcher_world.h"

namespace perseus {

// The core's MPI as this check needs it.
struct CoreMpi {
  std::string name;     // the header's MPI, e.g. "MPICH 5.0.2" (HeaderMpi())
  std::string version;  // all of MPI_Get_library_version()
  std::string library;  // the libmpi file, or ""
  std::string mpirun;   // the mpirun beside that library (its ../bin/mpirun), or ""
};

// OK unless the core's MPI is MPICH built without PMIx while a PMIx launcher started
// this process (PMIX_NAMESPACE or PMIX_RANK set, no PMI_* of Hydra); then
// PERSEUS_MPI_ERROR naming the launcher, the core's MPI and the launcher to use.
// Other MPIs, and an MPICH with PMIx, are left to MPI_Init and CheckLauncherWorld.
Status CheckLauncherPmi(const CoreMpi& mpi, const EnvLookup& getenv_fn);

// CheckLauncherPmi for the MPI loaded in this process and its environment. Never
// initialises MPI.
Status CheckLauncherPmiHere();

}  // namespace perseus

#endif  // PERSEUS_MPI_LAUNCHER_PMI_H_
