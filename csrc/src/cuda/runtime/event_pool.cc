#include "cuda/runtime/event_pool.h"

#include <map>
#include <mutex>
#include <vector>

namespace perseus {
namespace gpu {

namespace {

struct Pool {
  std::mutex mu;
  std::map<int, std::vector<cudaEvent_t>> free_by_device;
};

// Never destroyed: a handle released during process exit may still return its event.
Pool& ThePool() {
  static Pool* pool = new Pool;
  return *pool;
}

}  // namespace

Status AcquireEvent(int device, std::shared_ptr<void>* out) {
  Pool& pool = ThePool();
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    std::vector<cudaEvent_t>& free = pool.free_by_device[device];
    if (!free.empty()) {
      event = free.back();
      free.pop_back();
    }
  }
  if (event == nullptr) {
    Status status = CudaStatus(Cuda()->EventCreateWithFlags(&event, kEventDisableTiming),
                               "cudaEventCreateWithFlags");
    if (!status.ok()) return status;
  }
  // Re-recording a pooled event later is safe: a stream that waited on it captured
  // the work it stood for when cudaStreamWaitEvent was called.
  *out = std::shared_ptr<void>(static_cast<void*>(event), [device](void* e) {
    Pool& p = ThePool();
    std::lock_guard<std::mutex> lock(p.mu);
    p.free_by_device[device].push_back(static_cast<cudaEvent_t>(e));
  });
  return Status::OK();
}

}  // namespace gpu
}  // namespace perseus
