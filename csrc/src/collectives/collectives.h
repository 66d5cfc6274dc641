// The MPI implementations of each operation, run by a lane on its own communicator.
#ifndef PERSEUS_COLLECTIVES_H_
#define PERSEUS_COLLECTIVES_H_

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "common/batch.h"
#include "common/result.h"
#include "common/status.h"
#include "mpi/mpi_status.h"
#include "mpi/node_comms.h"

namespace perseus {

struct ExecContext {
  MPI_Comm comm;
  int rank;                    // within the process set
  int size;
  int64_t chunk_bytes;         // largest piece handed to one MPI call
  std::vector<char>* scratch;  // the lane's reusable fusion buffer
  const std::vector<int>* global_ranks;  // set rank -> global rank, for messages
  bool nan_check;              // PERSEUS_ALLREDUCE_NANCHECK
  int wire_dtype = -1;         // PERSEUS_ALLREDUCE_DTYPE as a dtype; -1 = none
  NodeComms* nodes = nullptr;  // hierarchical allreduce's communicators; null = flat
};

// Each returns the status for the whole batch; `results` gets one Result per item
// for the operations whose output the core allocates.
Status RunAllreduce(const Batch& batch, ExecContext& ctx);
// Allreduce batches whose reduce op is Adasum (adasum.cc).
Status RunAdasum(const Batch& batch, ExecContext& ctx);
Status RunBroadcast(const Batch& batch, ExecContext& ctx);
Status RunAllgather(const BatchItem& item, ExecContext& ctx, Result* result);
Status RunAlltoall(const BatchItem& item, ExecContext& ctx, Result* result);
Status RunReducescatter(const BatchItem& item, ExecContext& ctx);
Status RunBarrier(ExecContext& ctx);

// Runs `batch` with the algorithm of its operation; `results` and `statuses` hold one
// entry per item. The returned status is the batch's: when it is not OK, every item
// failed with it. Otherwise an item may still fail alone: with the NaN check on, an
// allreduce input holding NaN/Inf on some rank (the other items are reduced without
// it). The caller holds the MPI lock (mpi/mpi_lock.h).
Status RunMpiBatch(const Batch& batch, ExecContext& ctx, std::vector<Result>* results,
                   std::vector<Status>* statuses);

}  // namespace perseus

#endif  // PERSEUS_COLLECTIVES_H_
