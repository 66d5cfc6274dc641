#include "mpi/node_comms.h"

#include "common/logging.h"
#include "mpi/mpi_status.h"

namespace perseus {

NodeComms::~NodeComms() {
  if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
  if (cross != MPI_COMM_NULL) MPI_Comm_free(&cross);
}

Status OpenNodeComms(MPI_Comm lane_comm, int global_rank, int64_t ranks_per_node, bool explain,
                     std::unique_ptr<NodeComms>* out) {
  int rank, size;
  MPI_Comm_rank(lane_comm, &rank);
  MPI_Comm_size(lane_comm, &size);
  auto nodes = std::make_unique<NodeComms>();
  Status status =
      ranks_per_node > 0
          ? MpiStatus(MPI_Comm_split(lane_comm, static_cast<int>(global_rank / ranks_per_node),
                                     rank, &nodes->node),
                      "MPI_Comm_split")
          : MpiStatus(MPI_Comm_split_type(lane_comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL,
                                          &nodes->node),
                      "MPI_Comm_split_type");
  if (!status.ok()) return status;
  MPI_Comm_rank(nodes->node, &nodes->local_rank);
  MPI_Comm_size(nodes->node, &nodes->local_size);
  // Every rank must see the same node sizes: the local ranks pair up across nodes.
  int extremes[2] = {nodes->local_size, -nodes->local_size}, agreed[2];
  status = MpiStatus(MPI_Allreduce(extremes, agreed, 2, MPI_INT, MPI_MIN, lane_comm),
                     "MPI_Allreduce");
  if (!status.ok()) return status;
  const int smallest = agreed[0], largest = -agreed[1];
  if (smallest != largest || largest == 1) {
    if (explain && rank == 0) {
      PERSEUS_LOG(kDebug) << "hierarchical allreduce: this process set has "
                          << (smallest != largest ? "nodes of different sizes ("
                                                  : "one rank per node (")
                          << smallest << ".." << largest << " of " << size
                          << " ranks); it uses flat allreduce";
    }
    return Status::OK();
  }
  status = MpiStatus(MPI_Comm_split(lane_comm, nodes->local_rank, rank, &nodes->cross),
                     "MPI_Comm_split");
  if (!status.ok()) return status;
  MPI_Comm_size(nodes->cross, &nodes->cross_size);
  if (explain && rank == 0) {
    PERSEUS_LOG(kDebug) << "hierarchical allreduce: " << nodes->cross_size << " node(s) of "
                        << nodes->local_size << " ranks";
  }
  *out = std::move(nodes);
  return Status::OK();
}

}  // namespace perseus
