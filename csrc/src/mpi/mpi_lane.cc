#include "mpi/mpi_lane.h"

#include <pthread.h>

#include "collectives/collectives.h"
#include "common/dtype.h"
#include "common/timeline.h"
#include "mpi/mpi_lock.h"

namespace perseus {

MpiLane::MpiLane(int index, MPI_Comm comm, int rank, int size, int64_t chunk_bytes, bool nan_check,
           const std::vector<int>* global_ranks, BatchDone done)
    : index_(index),
      comm_(comm),
      rank_(rank),
      size_(size),
      chunk_bytes_(chunk_bytes),
      nan_check_(nan_check),
      global_ranks_(global_ranks),
      done_(std::move(done)) {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "perseus-lane");
    Run();
  });
}

MpiLane::~MpiLane() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void MpiLane::Push(Batch batch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(batch));
  }
  cv_.notify_one();
}

void MpiLane::Run() {
  while (true) {
    Batch batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      batch = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    Execute(batch);
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
  }
}

bool MpiLane::TryRunInline(const Batch& batch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_ || !queue_.empty()) return false;
    busy_ = true;
  }
  Execute(batch);
  std::lock_guard<std::mutex> lock(mu_);
  busy_ = false;
  return true;
}

void MpiLane::Execute(const Batch& batch) {
  ExecContext ctx{comm_, rank_, size_, chunk_bytes_, &scratch_, global_ranks_, nan_check_};
  std::vector<Result> results(batch.items.size());
  Status status;
  const bool traced = TimelineOn();
  const auto start = traced ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  {
    auto mpi = LockMpi();
    switch (batch.op_type()) {
      case PERSEUS_ALLREDUCE:
        status = batch.items[0].meta.reduce_op == PERSEUS_ADASUM ? RunAdasum(batch, ctx)
                                                                 : RunAllreduce(batch, ctx);
        break;
      case PERSEUS_BROADCAST: status = RunBroadcast(batch, ctx); break;
      case PERSEUS_ALLGATHER: status = RunAllgather(batch.items[0], ctx, &results[0]); break;
      case PERSEUS_ALLTOALL: status = RunAlltoall(batch.items[0], ctx, &results[0]); break;
      case PERSEUS_REDUCESCATTER: status = RunReducescatter(batch.items[0], ctx); break;
      case PERSEUS_BARRIER: status = RunBarrier(ctx); break;
      default: status = Status::Error(PERSEUS_INTERNAL_ERROR, "lane got an unknown operation");
    }
  }
  if (traced) Trace(batch, start, std::chrono::steady_clock::now());
  if (!status.ok()) {
    status.message = std::string(OpTypeName(batch.op_type())) + " of '" +
                     batch.items[0].meta.name + "'" +
                     (batch.items.size() > 1 ? " (and fused tensors)" : "") + ": " + status.message;
  }
  std::vector<Status> statuses(batch.items.size(), status);
  done_(batch, statuses, results);
}

void MpiLane::Trace(const Batch& batch, std::chrono::steady_clock::time_point start,
                 std::chrono::steady_clock::time_point end) const {
  Timeline& timeline = Timeline::Get();
  const int fused = static_cast<int>(batch.items.size());
  for (const BatchItem& item : batch.items) {
    if (!item.entry) continue;  // a joined rank's zeros have no request of their own
    timeline.Span(item.entry->process_set, item.meta.name, kQueuedActivity, batch.agreed, start,
                  index_);
    timeline.Span(item.entry->process_set, item.meta.name, ExecuteActivity(item.meta.op_type),
                  start, end, index_, PayloadBytes(item.meta), fused);
  }
}

}  // namespace perseus
