// With MPI_THREAD_MULTIPLE every thread calls MPI freely; with only
// MPI_THREAD_SERIALIZED the engine and its one lane take turns through this lock.
#ifndef PERSEUS_MPI_LOCK_H_
#define PERSEUS_MPI_LOCK_H_

#include <mutex>

namespace perseus {

void SetMpiSerialized(bool serialized);
// Holds the lock only in serialized mode.
std::unique_lock<std::mutex> LockMpi();

// Marks the calling thread, for its lifetime, as one that makes Perseus's MPI calls
// (engine thread, lanes, a caller driving the engine). MPI may call exit() from
// inside a failed call; the exit handlers then must not wait for such threads.
class MpiCallerScope {
 public:
  MpiCallerScope();
  ~MpiCallerScope();
  MpiCallerScope(const MpiCallerScope&) = delete;
  MpiCallerScope& operator=(const MpiCallerScope&) = delete;
};
bool InMpiCaller();

}  // namespace perseus

#endif  // PERSEUS_MPI_LOCK_H_
