#include "mpi/mpi_lock.h"

namespace perseus {

namespace {
std::mutex g_mpi_mutex;
bool g_serialized = false;
}  // namespace

void SetMpiSerialized(bool serialized) { g_serialized = serialized; }

std::unique_lock<std::mutex> LockMpi() {
  return g_serialized ? std::unique_lock<std::mutex>(g_mpi_mutex)
                      : std::unique_lock<std::mutex>();
}

}  // namespace perseus
