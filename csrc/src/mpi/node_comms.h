// PERSEUS_ALLREDUCE_MODE=hierarchical: a lane's communicator split by node. Each lane
// gets its own pair (lanes run concurrently and never share a communicator).
#ifndef PERSEUS_MPI_NODE_COMMS_H_
#define PERSEUS_MPI_NODE_COMMS_H_

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"

namespace perseus {

struct NodeComms {
  MPI_Comm node = MPI_COMM_NULL;   // the set's ranks on this node
  MPI_Comm cross = MPI_COMM_NULL;  // the set's ranks with this local rank, one per node
  int local_rank = 0, local_size = 1, cross_size = 1;
  std::vector<char> slice;  // this rank's slice of a window, between the three steps
  ~NodeComms();
};

// Splits `lane_comm` into nodes: runs of `ranks_per_node` consecutive global ranks
// (PERSEUS_RANKS_PER_NODE; 0 = MPI's shared-memory split). Collective over
// `lane_comm`. *out stays null, on every rank alike, where hierarchical cannot help or
// cannot run: nodes holding different numbers of the set's ranks, or one rank per
// node; `explain` logs that once (at debug level, from the set's rank 0).
Status OpenNodeComms(MPI_Comm lane_comm, int global_rank, int64_t ranks_per_node, bool explain,
                     std::unique_ptr<NodeComms>* out);

}  // namespace perseus

#endif  // PERSEUS_MPI_NODE_COMMS_H_
