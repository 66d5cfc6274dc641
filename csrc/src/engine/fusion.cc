#include "engine/fusion.h"

#include <algorithm>
#include <tuple>

#include "common/dtype.h"

namespace perseus {

namespace {

bool Fusible(const TensorMeta& m) {
  return m.op_type == PERSEUS_ALLREDUCE || m.op_type == PERSEUS_BROADCAST;
}

// Requests with equal keys may share a buffer. The device enters as its kind (CPU or
// GPU), not its ordinal: ordinals may differ across ranks (rank 1 on cuda:1), and every
// rank must plan the same batches. GPU allreduces also key on their scale factors:
// NCCL scales a whole fused buffer with one factor.
using Key = std::tuple<int, int, int, int, int, double, double>;
Key FusionKey(const TensorMeta& m) {
  const int gpu = m.device == PERSEUS_CPU_DEVICE ? 0 : 1;
  if (m.op_type == PERSEUS_BROADCAST) return Key{m.op_type, 0, 0, m.root_rank, gpu, 1.0, 1.0};
  if (gpu) return Key{m.op_type, m.dtype, m.reduce_op, 0, gpu, m.prescale, m.postscale};
  return Key{m.op_type, m.dtype, m.reduce_op, 0, gpu, 1.0, 1.0};
}

int64_t Bytes(const TensorMeta& m) {
  return m.op_type == PERSEUS_BARRIER ? 0 : m.NumElements() * DtypeSize(m.dtype);
}

}  // namespace

std::vector<Batch> PlanBatches(std::vector<BatchItem> agreed, int64_t fusion_threshold,
                               int64_t chunk_bytes) {
  // Stable: within a key, the agreed order (identical on every rank) is kept.
  std::stable_sort(agreed.begin(), agreed.end(), [](const BatchItem& a, const BatchItem& b) {
    return FusionKey(a.meta) < FusionKey(b.meta);
  });
  std::vector<Batch> batches;
  int64_t open_bytes = 0;
  bool open = false;  // the last batch may take more requests
  for (BatchItem& item : agreed) {
    int64_t bytes = Bytes(item.meta);
    bool alone = !Fusible(item.meta) || bytes >= chunk_bytes || bytes > fusion_threshold;
    bool joins = open && !alone && FusionKey(batches.back().items.front().meta) ==
                                       FusionKey(item.meta) &&
                 open_bytes + bytes <= fusion_threshold;
    if (!joins) {
      batches.emplace_back();
      open_bytes = 0;
    }
    batches.back().items.push_back(std::move(item));
    open_bytes += bytes;
    open = !alone;
  }
  return batches;
}

}  // namespace perseus
