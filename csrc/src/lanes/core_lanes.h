// The core's lanes' side (lane_api/lane_backend.h): a LaneFactory of MPI lanes for CPU
// tensors and device lanes for GPU tensors, the GPU work of enqueue
// (cuda/device_backend.h), the port through which the engine orders GPU launches
// across process sets (the device lanes' gpu::CrossSetOrder), and point-to-point
// messages of GPU memory (lanes/device_messages.h). The C ABI makes one from the
// configuration and hands it to the engine.
#ifndef PERSEUS_LANES_CORE_LANES_H_
#define PERSEUS_LANES_CORE_LANES_H_

#include <cstdint>
#include <memory>

#include "cuda/device_backend.h"
#include "lane_api/lane_backend.h"

namespace perseus {

// The configuration the MPI lanes read (from the config table).
struct MpiLaneSettings {
  int64_t chunk_bytes = 4ll << 20;  // PERSEUS_CHUNK_SIZE
  bool nan_check = false;
  int wire_dtype = -1;              // PERSEUS_ALLREDUCE_DTYPE; -1 = none
  bool hierarchical = false;        // PERSEUS_ALLREDUCE_MODE=hierarchical
  int64_t ranks_per_node = 0;       // PERSEUS_RANKS_PER_NODE; 0 = MPI's shared-memory split
};

// `thread_multiple`: MPI provides MPI_THREAD_MULTIPLE (device lanes need it).
LaneBackend MakeCoreLanes(const MpiLaneSettings& mpi, const GpuSettings& gpu, bool thread_multiple);

}  // namespace perseus

#endif  // PERSEUS_LANES_CORE_LANES_H_
