#include "collectives/hierarchical.h"

#include <algorithm>
#include <vector>

#include "mpi/wait_policy.h"

namespace perseus {

Status HierarchicalAllreduce(char* data, int64_t count, MPI_Datatype type, size_t esize,
                             MPI_Op op, NodeComms& nodes) {
  // Slices as even as can be: the first count % L local ranks take one more element.
  const int local = nodes.local_size;
  std::vector<int> counts(local), displs(local);
  for (int i = 0, at = 0; i < local; ++i) {
    counts[i] = static_cast<int>(count / local + (i < count % local));
    displs[i] = at;
    at += counts[i];
  }
  const int mine = counts[nodes.local_rank];
  nodes.slice.resize(std::max<size_t>({nodes.slice.size(), mine * esize, 1}));
  char* slice = nodes.slice.data();
  MPI_Request request;
  Status status = CompleteRequest(
      MPI_Ireduce_scatter(data, slice, counts.data(), type, op, nodes.node, &request), &request,
      "MPI_Ireduce_scatter");
  if (status.ok() && nodes.cross_size > 1)
    status = CompleteRequest(
        MPI_Iallreduce(MPI_IN_PLACE, slice, mine, type, op, nodes.cross, &request), &request,
        "MPI_Iallreduce");
  if (status.ok())
    status = CompleteRequest(MPI_Iallgatherv(slice, mine, type, data, counts.data(),
                                             displs.data(), type, nodes.node, &request),
                             &request, "MPI_Iallgatherv");
  return status;
}

}  // namespace perseus
