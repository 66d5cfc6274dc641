// The unit of execution: agreed requests fused into one collective call sequence.
#ifndef PERSEUS_BATCH_H_
#define PERSEUS_BATCH_H_

#include <vector>

#include "request.h"

namespace perseus {

struct BatchItem {
  TensorMeta meta;   // agreed metadata (identical on every rank but the first dim of gathers)
  EntryPtr entry;    // this rank's request; null when this rank has joined and adds zeros
};

struct Batch {
  std::vector<BatchItem> items;
  int op_type() const { return items.front().meta.op_type; }
};

}  // namespace perseus

#endif  // PERSEUS_BATCH_H_
