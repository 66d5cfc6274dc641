#include "mpi/node_layout.h"

#include <algorithm>
#include <vector>

#include "mpi/mpi_status.h"

namespace perseus {

Status FindNodeLayout(MPI_Comm world, int lowest_rank_on_node, int ranks_on_node, NodeLayout* out) {
  int size = 1;
  MPI_Comm_size(world, &size);
  const int mine[2] = {lowest_rank_on_node, ranks_on_node};
  std::vector<int> all(2 * static_cast<size_t>(size));
  Status status = MpiStatus(MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, world),
                            "MPI_Allgather");
  if (!status.ok()) return status;
  std::vector<int> lowest;
  NodeLayout layout;
  for (int r = 0; r < size; ++r) {
    lowest.push_back(all[2 * r]);
    if (all[2 * r + 1] != ranks_on_node) layout.homogeneous = false;
  }
  std::vector<int> nodes = lowest;  // each node once, by its lowest rank
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  for (int node_lowest : lowest) {
    auto node = std::lower_bound(nodes.begin(), nodes.end(), node_lowest);
    layout.node_of_rank.push_back(static_cast<int>(node - nodes.begin()));
  }
  *out = std::move(layout);
  return Status::OK();
}

}  // namespace perseus
