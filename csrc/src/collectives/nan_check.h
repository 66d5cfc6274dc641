// PERSEUS_ALLREDUCE_NANCHECK: before an allreduce, every rank looks for NaN/Inf in its
// float inputs, and the ranks share what they found (one small allgather per batch,
// only when the check is on), so that every rank fails the batch with the same error
// naming the tensors and the ranks where they went bad, instead of spreading the
// NaN to every replica.
#ifndef PERSEUS_NAN_CHECK_H_
#define PERSEUS_NAN_CHECK_H_

#include <cstdint>

#include "collectives/collectives.h"

namespace perseus {

// True when `data` (count elements of a float dtype) holds a NaN or an infinity.
// Always false for integer dtypes.
bool HasNonFinite(int dtype, const void* data, int64_t count);

// Collective over ctx.comm: OK when no rank's inputs in `batch` are non-finite, else
// a PERSEUS_NON_FINITE error, identical on every rank.
Status CheckFinite(const Batch& batch, ExecContext& ctx);

}  // namespace perseus

#endif  // PERSEUS_NAN_CHECK_H_
