// CUDA events that only order work between streams (cudaEventDisableTiming), pooled
// per device because creating one costs far more than recording it. An event is
// handed out as a shared_ptr<void> (opaque outside cuda/) whose deleter returns it to
// the pool, so requests, results and handles can carry it without CUDA types.
#ifndef PERSEUS_CUDA_EVENT_POOL_H_
#define PERSEUS_CUDA_EVENT_POOL_H_

#include <memory>

#include "cuda/runtime/cuda_api.h"

namespace perseus {
namespace gpu {

// An event of `device`, which must be the current device of the calling thread.
Status AcquireEvent(int device, std::shared_ptr<void>* out);

inline cudaEvent_t AsEvent(const std::shared_ptr<void>& event) {
  return static_cast<cudaEvent_t>(event.get());
}

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_EVENT_POOL_H_
