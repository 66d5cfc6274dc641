// The unit of execution: agreed requests fused into one collective call sequence.
#ifndef PERSEUS_BATCH_H_
#define PERSEUS_BATCH_H_

#include <chrono>
#include <vector>

#include "common/dtype.h"
#include "common/request.h"

namespace perseus {

// Payload bytes of one request on this rank (barrier and join carry none).
inline int64_t PayloadBytes(const TensorMeta& meta) {
  if (meta.op_type == PERSEUS_BARRIER || meta.op_type == PERSEUS_JOIN) return 0;
  return meta.NumElements() * static_cast<int64_t>(DtypeSize(meta.dtype));
}

struct BatchItem {
  TensorMeta meta;   // agreed metadata (identical on every rank but the first dim of gathers)
  EntryPtr entry;    // this rank's request; null when this rank has joined and adds zeros
};

struct Batch {
  std::vector<BatchItem> items;
  std::chrono::steady_clock::time_point agreed;  // when negotiation ended (for the timeline)
  int64_t chunk_bytes = 0;  // bytes per MPI call, as planned (the autotuner may change it); 0 = the lane's
  // A GPU batch's place in its set's agreed sequence of GPU batches (LaunchOrder::Number,
  // from Engine::Apply), the order in which every rank's device lanes launch them (cuda/context/launch_order.h); -1 else.
  int64_t launch_turn = -1;
  // The batch launches only when the order across process sets reaches it (a grant,
  // below): set by the launch order once more than one set can have GPU work.
  bool launch_gated = false;
  int op_type() const { return items.front().meta.op_type; }
  int64_t Bytes() const {
    int64_t bytes = 0;
    for (const BatchItem& item : items) bytes += PayloadBytes(item.meta);
    return bytes;
  }
};

// Launch turns [from, to) of one process set's GPU batches, which the launch order
// across sets (engine/launch_order.h) lets this rank launch next, after every earlier
// grant.
struct LaunchGrant {
  int set_id;
  int64_t from, to;
};

}  // namespace perseus

#endif  // PERSEUS_BATCH_H_
