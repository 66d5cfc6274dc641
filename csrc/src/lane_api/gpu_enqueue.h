// The GPU work of Engine::Enqueue, on the framework's thread, behind an interface so
// that the engine includes no CUDA header (cuda/device_backend.h does the work; the
// C ABI hands the engine the core's, lanes/core_lanes.h).
#ifndef PERSEUS_LANE_API_GPU_ENQUEUE_H_
#define PERSEUS_LANE_API_GPU_ENQUEUE_H_

#include "common/request.h"
#include "common/status.h"

namespace perseus {

class GpuEnqueue {
 public:
  virtual ~GpuEnqueue() = default;

  // The first GPU request warms the GPU runtime (slow the first time: call outside
  // engine locks).
  virtual void WarmGpu() = 0;
  // Gives a GPU request the event its device lane waits for before reading the input,
  // sharing the one `call` recorded on the same stream (see ReadyEvents). An error
  // belongs to this request only.
  virtual Status PrepareGpuEntry(Entry* entry, ReadyEvents* call) = 0;
};

}  // namespace perseus

#endif  // PERSEUS_LANE_API_GPU_ENQUEUE_H_
