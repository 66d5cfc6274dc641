// Gathers and all-to-alls move whole rows (one index of the first dimension), whose
// counts differ per rank; a contiguous MPI type of one row keeps counts in rows.
#ifndef PERSEUS_ROW_TYPE_H_
#define PERSEUS_ROW_TYPE_H_

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace perseus {

class RowType {
 public:
  explicit RowType(int64_t row_bytes) {
    if (row_bytes > 0 && row_bytes <= INT_MAX) {
      MPI_Type_contiguous(static_cast<int>(row_bytes), MPI_BYTE, &type_);
      MPI_Type_commit(&type_);
    }
  }
  ~RowType() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  RowType(const RowType&) = delete;
  RowType& operator=(const RowType&) = delete;
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

// Row counts and displacements as MPI's int arrays; fails past INT_MAX rows.
inline Status RowCounts(const std::vector<int64_t>& rows, std::vector<int>* counts,
                        std::vector<int>* displs) {
  int64_t offset = 0;
  for (int64_t r : rows) {
    if (r > INT_MAX || offset > INT_MAX)
      return Status::Error(PERSEUS_UNSUPPORTED, "more than INT_MAX rows in one collective");
    counts->push_back(static_cast<int>(r));
    displs->push_back(static_cast<int>(offset));
    offset += r;
  }
  return Status::OK();
}

}  // namespace perseus

#endif  // PERSEUS_ROW_TYPE_H_
