// Handles: what a framework thread holds while its request is in flight.
#ifndef PERSEUS_HANDLE_TABLE_H_
#define PERSEUS_HANDLE_TABLE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/result.h"
#include "common/status.h"

namespace perseus {

class HandleTable {
 public:
  // Gets the first failure among a group's handles (in list order), else OK.
  using GroupDone = std::function<void(const Status&)>;

  ~HandleTable();
  int64_t Create();
  // Fires the groups this completion finishes, on the calling thread, after the
  // table's lock is released (so a callback may call back into the table).
  void Complete(int64_t handle, Status status, Result result = Result());
  // PERSEUS_INVALID_ARGUMENT for an unknown handle.
  Status Poll(int64_t handle, bool* done);
  // Waits without holding any engine lock; timeout_s < 0 waits forever.
  Status Wait(int64_t handle, double timeout_s);
  // Calls done once, when all n handles have completed: on the thread that
  // completes the last one, or here, before returning, if all have already.
  // *pending says which. Unknown handle: an error, and done is never called.
  Status OnComplete(const int64_t* handles, int n, GroupDone done, bool* pending);
  Status TakeResult(int64_t handle, Result** result);
  // A completed handle's completion event (null for CPU requests and failures);
  // PERSEUS_INVALID_ARGUMENT while pending or unknown.
  Status DoneEvent(int64_t handle, std::shared_ptr<void>* event);
  Status Release(int64_t handle);
  // Completes every handle still open with `status` (used by shutdown).
  void FailAll(const Status& status);

 private:
  struct Group;
  // A group waiting on a handle, and the handle's position in the group's list.
  using Watcher = std::pair<std::shared_ptr<Group>, int>;
  struct State {
    bool done = false;
    Status status;
    Result result;
    std::vector<Watcher> watchers;  // empty unless OnComplete was called on it
  };
  std::shared_ptr<State> Find(int64_t handle);
  // Marks s done (under mu_); appends the groups it finishes to *ready.
  static void MarkDone(State* s, Status status, std::vector<std::shared_ptr<Group>>* ready);
  static void Fire(std::vector<std::shared_ptr<Group>>& ready);

  std::mutex mu_;
  std::condition_variable cv_;
  int64_t next_ = 1;
  std::unordered_map<int64_t, std::shared_ptr<State>> states_;
};

}  // namespace perseus

#endif  // PERSEUS_HANDLE_TABLE_H_
