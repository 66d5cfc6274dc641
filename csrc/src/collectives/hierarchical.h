// Hierarchical allreduce of one window: reduce-scatter inside the node, allreduce of
// each slice with the same local rank on the other nodes, allgather inside the node.
// Each slice is reduced by one rank of the node and then copied, so with operators
// that are commutative to the bit (common/dtype.h) every rank gets the same bits.
#ifndef PERSEUS_HIERARCHICAL_H_
#define PERSEUS_HIERARCHICAL_H_

#include <mpi.h>

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "mpi/node_comms.h"

namespace perseus {

// Reduces `count` elements at `data` in place over every node of `nodes`.
Status HierarchicalAllreduce(char* data, int64_t count, MPI_Datatype type, size_t esize,
                             MPI_Op op, NodeComms& nodes);

}  // namespace perseus

#endif  // PERSEUS_HIERARCHICAL_H_
