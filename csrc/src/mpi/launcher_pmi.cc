#include "mpi/launcher_pmi.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <sstream>

#include "mpi/mpi_library.h"

namespace perseus {
namespace {

std::string Lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// The value of "Key: value" in MPICH's library version text, or "".
std::string Field(const std::string& version, const std::string& key) {
  std::istringstream lines(version);
  for (std::string line; std::getline(lines, line);)
    if (line.compare(0, key.size(), key) == 0) return line.substr(key.size());
  return "";
}

// MPICH names its configure options; PMIx is there only when asked for.
bool MpichHasPmix(const std::string& version) {
  const std::string configure = Lower(Field(version, "MPICH configure:"));
  return configure.find("pmix") != std::string::npos &&
         configure.find("--without-pmix") == std::string::npos &&
         configure.find("--with-pmix=no") == std::string::npos;
}

// Who set the PMIx variables, as the user would name it.
std::string PmixLauncher(const EnvLookup& getenv_fn) {
  if (const char* size = getenv_fn("OMPI_COMM_WORLD_SIZE"))
    return std::string("Open MPI's mpirun (OMPI_COMM_WORLD_SIZE=") + size + ")";
  if (getenv_fn("SLURM_STEP_ID") != nullptr) return "srun --mpi=pmix";
  return "a PMIx process manager (Open MPI's mpirun, PRRTE or srun --mpi=pmix)";
}

}  // namespace

Status CheckLauncherPmi(const CoreMpi& mpi, const EnvLookup& getenv_fn) {
  // Plain MPICH only: how Intel MPI, MVAPICH or Cray MPICH meet PMIx is not known here.
  if (mpi.version.compare(0, 14, "MPICH Version:") != 0 || MpichHasPmix(mpi.version))
    return Status::OK();
  const char* pmix = getenv_fn("PMIX_NAMESPACE");
  if (pmix == nullptr) pmix = getenv_fn("PMIX_RANK");
  // Hydra's ranks have PMI_*; with them MPICH does not look for PMIx.
  if (pmix == nullptr || getenv_fn("PMI_SIZE") != nullptr || getenv_fn("PMI_FD") != nullptr)
    return Status::OK();
  std::ostringstream msg;
  msg << "init(): " << PmixLauncher(getenv_fn) << " started this process, but Perseus was built "
      << "with " << mpi.name;
  if (!mpi.library.empty()) msg << " (" << mpi.library << ")";
  msg << ", an MPICH without PMIx, which cannot join the processes a PMIx launcher starts: its "
      << "MPI_Init would abort (\"unsupported PMI version PMIx\"). Fix: launch with "
      << mpi.name << "'s own mpirun";
  if (!mpi.mpirun.empty()) msg << " (" << mpi.mpirun << " -np N ...)";
  msg << " or with perseusrun -np N ..., which picks it";
  if (getenv_fn("SLURM_STEP_ID") != nullptr) msg << "; under Slurm, srun --mpi=pmi2";
  msg << "; or rebuild Perseus with the MPI of that launcher (PERSEUS_MPICXX=/path/to/its/mpicxx "
      << "pip install .).";
  return Status::Error(PERSEUS_MPI_ERROR, msg.str());
}

Status CheckLauncherPmiHere() {
  CoreMpi mpi{HeaderMpi(), LibraryVersion(), LibraryPath(), ""};
  // A venv's mpich wheel, or a prefix install: lib/libmpi.so.12 beside bin/mpirun.
  const std::string::size_type lib = mpi.library.rfind("/lib/");
  if (lib != std::string::npos) {
    const std::string mpirun = mpi.library.substr(0, lib) + "/bin/mpirun";
    if (access(mpirun.c_str(), X_OK) == 0) mpi.mpirun = mpirun;
  }
  return CheckLauncherPmi(mpi, std::getenv);
}

}  // namespace perseus
