// Whether MPI joined the processes that the launcher started. A launcher whose
// process manager this MPI cannot reach (srun without --mpi=pmi2 or pmix, the mpirun
// of another MPI) starts N processes, and each one's MPI comes up alone as rank 0 of
// a world of 1: N independent trainings and no error (Open MPI 5 under a plain srun,
// MPICH without a matching PMI). The launcher's own variables say how many it started.
#ifndef PERSEUS_MPI_LAUNCHER_WORLD_H_
#define PERSEUS_MPI_LAUNCHER_WORLD_H_

#include <functional>
#include <string>

#include "common/status.h"

namespace perseus {

using EnvLookup = std::function<const char*(const char*)>;

// OK unless MPI's world has one rank while the launcher's variables say that this
// process is one of N > 1 it started; then PERSEUS_MPI_ERROR naming the variable read,
// its value, what MPI said (`mpi`: the library, e.g. LoadedMpi()) and the fix. Only a
// process started by a launcher has these variables (an sbatch script's own shell has
// SLURM_NTASKS, never SLURM_STEP_NUM_TASKS), so a plain `python` stays a world of 1.
Status CheckLauncherWorld(int mpi_world_size, const std::string& mpi,
                          const EnvLookup& getenv_fn);

}  // namespace perseus

#endif  // PERSEUS_MPI_LAUNCHER_WORLD_H_
