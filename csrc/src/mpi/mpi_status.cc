#include "mpi/mpi_status.h"

#include <string>
#include <vector>

#include "mpi/fault_tolerance.h"

namespace perseus {

Status MpiStatus(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return Status::OK();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  // A process failure (ULFM) is no fault of the call: the world must be shrunk.
  return Status::Error(IsProcessFailure(rc) ? PERSEUS_RANK_FAILED : PERSEUS_MPI_ERROR,
                       std::string(what) + " failed: " + std::string(text, len));
}

Status AgreeOnStatus(MPI_Comm comm, const Status& local) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  std::vector<int> lengths(size);
  int mine = local.ok() ? 0 : static_cast<int>(local.message.size()) + 1;
  Status status = MpiStatus(MPI_Allgather(&mine, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm),
                            "MPI_Allgather");
  if (!status.ok()) return status;
  std::vector<int> displs(size, 0);
  int total = 0;
  for (int r = 0; r < size; ++r) {
    displs[r] = total;
    total += lengths[r];
  }
  if (total == 0) return Status::OK();
  // Each failing rank sends its code as one byte, then its message.
  std::string text = local.ok() ? "" : std::string(1, static_cast<char>(local.code)) + local.message;
  std::vector<char> all(total);
  status = MpiStatus(MPI_Allgatherv(text.data(), mine, MPI_CHAR, all.data(), lengths.data(),
                                    displs.data(), MPI_CHAR, comm),
                     "MPI_Allgatherv");
  if (!status.ok()) return status;
  std::string message;
  perseus_status_t code = PERSEUS_SUCCESS;
  for (int r = 0; r < size; ++r) {
    if (lengths[r] == 0) continue;
    if (code == PERSEUS_SUCCESS) code = static_cast<perseus_status_t>(all[displs[r]]);
    message += (message.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " +
               std::string(&all[displs[r] + 1], lengths[r] - 1);
  }
  return Status::Error(code, message);
}

}  // namespace perseus
