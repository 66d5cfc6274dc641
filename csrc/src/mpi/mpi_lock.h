// With MPI_THREAD_MULTIPLE every thread calls MPI freely; with only
// MPI_THREAD_SERIALIZED the engine and its one lane take turns through this lock.
#ifndef PERSEUS_MPI_LOCK_H_
#define PERSEUS_MPI_LOCK_H_

#include <mutex>

namespace perseus {

void SetMpiSerialized(bool serialized);
// Holds the lock only in serialized mode.
std::unique_lock<std::mutex> LockMpi();

}  // namespace perseus

#endif  // PERSEUS_MPI_LOCK_H_
