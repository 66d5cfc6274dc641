#include "lanes/mpi_lane.h"

#include <csignal>
#include <cstdlib>

#include "collectives/collectives.h"
#include "common/dtype.h"
#include "common/timeline.h"
#include "mpi/mpi_lock.h"

namespace perseus {

namespace {

// Test hooks, read once, off unless set. PERSEUS_TEST_EXIT_IN_LANE=<wire name>
// (tests/rank_scripts/exit_in_mpi.py) makes the lane that runs that request call exit(70) while
// it holds the MPI lock, as MPI itself does when a call fails fatally.
// PERSEUS_TEST_STOP_IN_LANE=<wire name> (tests/rank_scripts/frozen_rank.py) stops the process
// there (SIGSTOP): its peers are left inside that collective with a frozen rank.
void FaultIfHooked(const Batch& batch) {
  static const char* exit_in = std::getenv("PERSEUS_TEST_EXIT_IN_LANE");
  static const char* stop_in = std::getenv("PERSEUS_TEST_STOP_IN_LANE");
  if (exit_in == nullptr && stop_in == nullptr) return;
  for (const BatchItem& item : batch.items) {
    if (exit_in != nullptr && item.meta.name == exit_in) std::exit(70);
    if (stop_in != nullptr && item.meta.name == stop_in) raise(SIGSTOP);
  }
}

}  // namespace

MpiLane::MpiLane(int index, MPI_Comm comm, int rank, int size, int64_t chunk_bytes, bool nan_check,
                 int wire_dtype, std::unique_ptr<NodeComms> nodes, const std::vector<int>* global_ranks, BatchDone done)
    : index_(index),
      comm_(comm),
      rank_(rank),
      size_(size),
      chunk_bytes_(chunk_bytes),
      nan_check_(nan_check),
      wire_dtype_(wire_dtype),
      nodes_(std::move(nodes)),
      global_ranks_(global_ranks),
      done_(std::move(done)),
      worker_("perseus-lane", [this](const Batch& batch) { Execute(batch); }) {}

MpiLane::~MpiLane() { worker_.Stop(); }

void MpiLane::Push(Batch batch) { worker_.Push(std::move(batch)); }

bool MpiLane::TryRunInline(const Batch& batch) { return worker_.TryRunInline(batch); }

void MpiLane::Execute(const Batch& batch) {
  const int64_t chunk = batch.chunk_bytes > 0 ? batch.chunk_bytes : chunk_bytes_;
  ExecContext ctx{comm_,         rank_,      size_,       chunk,
                  &scratch_,     global_ranks_, nan_check_, wire_dtype_,
                  nodes_.get()};
  std::vector<Result> results(batch.items.size());
  std::vector<Status> statuses;
  Status status;
  const bool traced = TimelineOn();
  const auto start = traced ? Clock::now() : Clock::time_point();
  {
    auto mpi = LockMpi();
    FaultIfHooked(batch);
    status = RunMpiBatch(batch, ctx, &results, &statuses);
  }
  if (traced) TraceLaneBatch(batch, index_, start, Clock::now());
  if (!status.ok()) {
    status.message = std::string(OpTypeName(batch.op_type())) + " of '" +
                     batch.items[0].meta.name + "'" +
                     (batch.items.size() > 1 ? " (and fused tensors)" : "") + ": " + status.message;
    statuses.assign(batch.items.size(), status);
  }
  done_(batch, statuses, results);
}

}  // namespace perseus
