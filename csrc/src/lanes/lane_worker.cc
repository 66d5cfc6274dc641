#include "lanes/lane_worker.h"

#include <pthread.h>

#include <string>

#include "common/timeline.h"
#include "mpi/mpi_lock.h"

namespace perseus {

LaneWorker::LaneWorker(const char* thread_name, Execute execute) : execute_(std::move(execute)) {
  std::string name = thread_name;
  thread_ = std::thread([this, name] {
    pthread_setname_np(pthread_self(), name.c_str());
    MpiCallerScope mpi_caller;
    Run();
  });
}

LaneWorker::~LaneWorker() { Stop(); }

void LaneWorker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void LaneWorker::Push(Batch batch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(batch));
  }
  cv_.notify_one();
}

void LaneWorker::Run() {
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
    execute_(batch);
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
  }
}

bool LaneWorker::TryRunInline(const Batch& batch, const std::function<bool()>& allowed) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_ || !queue_.empty()) return false;
    busy_ = true;
  }
  // Asked while the lane is held: nothing else can change its state meanwhile.
  const bool run = !allowed || allowed();
  if (run) execute_(batch);
  std::lock_guard<std::mutex> lock(mu_);
  busy_ = false;
  return run;
}

void TraceLaneBatch(const Batch& batch, int lane_index, Clock::time_point start,
                    Clock::time_point end) {
  Timeline& timeline = Timeline::Get();
  const int fused = static_cast<int>(batch.items.size());
  for (const BatchItem& item : batch.items) {
    if (!item.entry) continue;  // a joined rank's zeros have no request of their own
    timeline.Span(item.entry->process_set, item.meta.name, kQueuedActivity, batch.agreed, start,
                  lane_index);
    timeline.Span(item.entry->process_set, item.meta.name, ExecuteActivity(item.meta.op_type),
                  start, end, lane_index, PayloadBytes(item.meta), fused);
  }
}

}  // namespace perseus
