#include <climits>
#include <string>

#include "collectives.h"

namespace perseus {

Status MpiStatus(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return Status::OK();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return Status::Error(PERSEUS_MPI_ERROR, std::string(what) + " failed: " + std::string(text, len));
}

Status RunBarrier(ExecContext& ctx) { return MpiStatus(MPI_Barrier(ctx.comm), "MPI_Barrier"); }

}  // namespace perseus
