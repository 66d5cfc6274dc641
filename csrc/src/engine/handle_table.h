// Handles: what a framework thread holds while its request is in flight.
#ifndef PERSEUS_HANDLE_TABLE_H_
#define PERSEUS_HANDLE_TABLE_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "common/status.h"

namespace perseus {

class HandleTable {
 public:
  ~HandleTable();
  int64_t Create();
  void Complete(int64_t handle, Status status, Result result = Result());
  // PERSEUS_INVALID_ARGUMENT for an unknown handle.
  Status Poll(int64_t handle, bool* done);
  // Waits without holding any engine lock; timeout_s < 0 waits forever.
  Status Wait(int64_t handle, double timeout_s);
  Status TakeResult(int64_t handle, Result** result);
  // A completed handle's completion event (null for CPU requests and failures);
  // PERSEUS_INVALID_ARGUMENT while pending or unknown.
  Status DoneEvent(int64_t handle, std::shared_ptr<void>* event);
  Status Release(int64_t handle);
  // Completes every handle still open with `status` (used by shutdown).
  void FailAll(const Status& status);

 private:
  struct State {
    bool done = false;
    Status status;
    Result result;
  };
  std::shared_ptr<State> Find(int64_t handle);

  std::mutex mu_;
  std::condition_variable cv_;
  int64_t next_ = 1;
  std::unordered_map<int64_t, std::shared_ptr<State>> states_;
};

}  // namespace perseus

#endif  // PERSEUS_HANDLE_TABLE_H_
