// What every lane kind shares: a worker thread running queued batches in order, the
// option to run a batch on the caller's thread when the lane is idle, and the
// timeline spans of a batch. A lane owns one LaneWorker as its LAST member, so that
// the thread stops before the rest of the lane is destroyed.
#ifndef PERSEUS_LANES_LANE_WORKER_H_
#define PERSEUS_LANES_LANE_WORKER_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "common/batch.h"
#include "common/clock.h"

namespace perseus {

class LaneWorker {
 public:
  using Execute = std::function<void(const Batch&)>;
  // `thread_name` (at most 15 characters) shows in top -H, perf and gdb.
  LaneWorker(const char* thread_name, Execute execute);
  ~LaneWorker();  // Stop()
  LaneWorker(const LaneWorker&) = delete;
  LaneWorker& operator=(const LaneWorker&) = delete;

  void Push(Batch batch);
  // Runs `batch` on the calling thread when nothing is queued or running (so the order
  // on the lane's communicators is unchanged) and `allowed` (if given) agrees, asked
  // while the lane is held; false when the batch did not run.
  bool TryRunInline(const Batch& batch, const std::function<bool()>& allowed = nullptr);
  // Runs what is queued, then joins the thread. Idempotent.
  void Stop();

 private:
  void Run();

  Execute execute_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  bool stop_ = false;
  bool busy_ = false;  // a batch is executing, on the lane thread or inline
  std::thread thread_;
};

// Records the batch's QUEUED span (agreed -> start) and its execution span on each
// tensor's timeline track. Call only while TimelineOn().
void TraceLaneBatch(const Batch& batch, int lane_index, Clock::time_point start,
                    Clock::time_point end);

}  // namespace perseus

#endif  // PERSEUS_LANES_LANE_WORKER_H_
