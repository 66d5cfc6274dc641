#include "mpi/mpi_lock.h"

namespace perseus {

namespace {
std::mutex g_mpi_mutex;
bool g_serialized = false;
thread_local int t_mpi_caller = 0;  // nesting depth of MpiCallerScope
}  // namespace

void SetMpiSerialized(bool serialized) { g_serialized = serialized; }

std::unique_lock<std::mutex> LockMpi() {
  return g_serialized ? std::unique_lock<std::mutex>(g_mpi_mutex)
                      : std::unique_lock<std::mutex>();
}

MpiCallerScope::MpiCallerScope() { ++t_mpi_caller; }
MpiCallerScope::~MpiCallerScope() { --t_mpi_caller; }
bool InMpiCaller() { return t_mpi_caller > 0; }

}  // namespace perseus
