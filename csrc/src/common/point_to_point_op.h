// One point-to-point message (perseus_point_to_point) as the core passes it on: to the
// engine's MPI messages for host memory (engine/point_to_point.h), through the lanes'
// side to NCCL for device memory (lane_api/device_messages.h).
#ifndef PERSEUS_COMMON_POINT_TO_POINT_OP_H_
#define PERSEUS_COMMON_POINT_TO_POINT_OP_H_

#include <cstdint>

namespace perseus {

struct PointToPointOp {
  bool recv = false;
  void* data = nullptr;  // valid until the handle completes
  int64_t bytes = 0;
  int peer = 0;          // rank in the set; a host recv: MPI_ANY_SOURCE for any
  int tag = 0;
  int set_id = 0;
  int device = -1;           // -1: host memory; else the CUDA device of `data`
  void* stream = nullptr;    // device memory: the framework's stream it is ready on
};

}  // namespace perseus

#endif  // PERSEUS_COMMON_POINT_TO_POINT_OP_H_
