// MPI return codes as Status, and agreeing on one outcome across a communicator.
#ifndef PERSEUS_MPI_MPI_STATUS_H_
#define PERSEUS_MPI_MPI_STATUS_H_

#include <mpi.h>

#include "common/status.h"

namespace perseus {

Status MpiStatus(int rc, const char* what);

// Collective over `comm`: OK when every rank's `local` is OK, else the same error on
// every rank, naming each failing rank and its message (no rank is left waiting).
Status AgreeOnStatus(MPI_Comm comm, const Status& local);

}  // namespace perseus

#endif  // PERSEUS_MPI_MPI_STATUS_H_
