// The fusion planner: turns the requests agreed in one round into batches, in an
// order every rank computes identically from the same agreed list.
#ifndef PERSEUS_FUSION_H_
#define PERSEUS_FUSION_H_

#include <cstdint>
#include <vector>

#include "common/batch.h"

namespace perseus {

// Allreduces (same dtype, reduce op, device) and broadcasts (same root, device) are
// fused up to `fusion_threshold` bytes; a tensor of at least `chunk_bytes` runs alone,
// in place, so it is never copied. Other operations run one request per batch.
std::vector<Batch> PlanBatches(std::vector<BatchItem> agreed, int64_t fusion_threshold,
                               int64_t chunk_bytes);

}  // namespace perseus

#endif  // PERSEUS_FUSION_H_
