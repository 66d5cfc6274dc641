// Which node each rank of a job is on, the same answer on every rank: a rank's own
// local and cross communicators cannot tell it (the cross communicator groups ranks by
// local rank, so on nodes of different sizes its rank is not the node's number).
#ifndef PERSEUS_MPI_NODE_LAYOUT_H_
#define PERSEUS_MPI_NODE_LAYOUT_H_

#include <mpi.h>

#include <vector>

#include "common/status.h"

namespace perseus {

struct NodeLayout {
  std::vector<int> node_of_rank;  // by rank: its node, the nodes numbered by their lowest rank
  bool homogeneous = true;        // every node holds as many ranks (Horovod's is_homogeneous)
};

// Collective over `world`: each rank gives the lowest rank on its node and its node's
// number of ranks.
Status FindNodeLayout(MPI_Comm world, int lowest_rank_on_node, int ranks_on_node, NodeLayout* out);

}  // namespace perseus

#endif  // PERSEUS_MPI_NODE_LAYOUT_H_
