#include "mpi/launcher_world.h"

#include <cstdlib>
#include <sstream>

namespace perseus {
namespace {

// A launcher sets both in every process it starts.
struct LauncherVariables {
  const char* size;  // how many processes it started
  const char* rank;  // which one this is
  const char* who;
  const char* fix;
};

// Innermost launcher first: a nested launch (Hydra's proxies or Open MPI's daemons
// started by srun) leaves the outer launcher's variables in the ranks as well.
constexpr LauncherVariables kLaunchers[] = {
    {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "Open MPI's mpirun",
     "launch with the mpirun of the MPI this Perseus was built with (perseusrun "
     "--check-build names it), or rebuild Perseus with that mpirun's MPI "
     "(PERSEUS_MPICXX=/path/to/its/mpicxx pip install .)"},
    {"PMIX_SIZE", "PMIX_RANK", "a PMIx process manager",
     "launch with the mpirun of the MPI this Perseus was built with (perseusrun "
     "--check-build names it), or use an MPI built with PMIx support"},
    {"PMI_SIZE", "PMI_RANK", "a PMI process manager (MPICH's mpiexec, srun --mpi=pmi2)",
     "launch with the mpirun of the MPI this Perseus was built with (perseusrun "
     "--check-build names it); under Slurm, srun --mpi=pmi2 serves MPICH, Intel MPI and "
     "MVAPICH, srun --mpi=pmix serves Open MPI"},
    {"MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK", "MVAPICH2's mpirun_rsh",
     "launch with the mpirun of the MPI this Perseus was built with (perseusrun "
     "--check-build names it)"},
    {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "srun",
     "let MPI reach Slurm's process manager: srun --mpi=pmi2 for MPICH, Intel MPI or "
     "MVAPICH, srun --mpi=pmix for Open MPI (`srun --mpi=list` shows what this Slurm "
     "offers; MpiDefault in slurm.conf sets it for every srun), or start the ranks with "
     "mpirun or perseusrun inside the allocation"},
};

// A positive count, or 0 when unset or not a number.
long Count(const char* text) {
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  return *end == '\0' && value > 0 ? value : 0;
}

}  // namespace

Status CheckLauncherWorld(int mpi_world_size, const std::string& mpi,
                          const EnvLookup& getenv_fn) {
  if (mpi_world_size != 1) return Status::OK();
  for (const LauncherVariables& launcher : kLaunchers) {
    const long count = Count(getenv_fn(launcher.size));
    const char* rank = getenv_fn(launcher.rank);
    if (count == 0 || rank == nullptr) continue;
    if (count == 1) return Status::OK();  // the innermost launcher started this one alone
    std::ostringstream msg;
    msg << "init(): " << launcher.who << " started " << count << " processes ("
        << launcher.size << "=" << count << ", " << launcher.rank << "=" << rank
        << "), but MPI says the world has 1 rank (MPI_COMM_WORLD of " << mpi
        << "): MPI did not join them, so each would train alone as rank 0 of 1. Fix: "
        << launcher.fix << ".";
    return Status::Error(PERSEUS_MPI_ERROR, msg.str());
  }
  return Status::OK();
}

}  // namespace perseus
