// What a completed request hands back besides its status.
#ifndef PERSEUS_COMMON_RESULT_H_
#define PERSEUS_COMMON_RESULT_H_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

namespace perseus {

struct Result {
  // Core-allocated output (allgather, alltoall): malloc'd for CPU requests, device
  // memory for GPU requests.
  void* data = nullptr;
  // Frees `data` when the caller never took it; null means std::free.
  void (*free_data)(void*) = nullptr;
  std::vector<int64_t> shape;
  std::vector<int64_t> recv_splits;
  // GPU requests: the event the lane recorded after queueing the request's device work
  // (opaque here; cuda/ knows it). Null for CPU requests.
  std::shared_ptr<void> done_event;

  void FreeData() {
    if (data != nullptr) free_data ? free_data(data) : std::free(data);
    data = nullptr;
  }
};

}  // namespace perseus

#endif  // PERSEUS_COMMON_RESULT_H_
