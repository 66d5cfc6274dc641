// PERSEUS_ALLREDUCE_NANCHECK: before an allreduce, every rank looks for NaN/Inf in its
// float inputs, and the ranks share what they found (one small allgather per batch,
// only when the check is on), so that every rank fails the bad tensors with the same
// error naming them and the ranks where they went bad, instead of spreading the NaN
// to every replica. Clean tensors fused with a bad one are reduced as usual: whether
// two requests share a batch depends on timing, their outcome must not.
#ifndef PERSEUS_NAN_CHECK_H_
#define PERSEUS_NAN_CHECK_H_

#include <cstdint>
#include <vector>

#include "collectives/collectives.h"

namespace perseus {

// True when `data` (count elements of a float dtype) holds a NaN or an infinity.
// Always false for integer dtypes.
bool HasNonFinite(int dtype, const void* data, int64_t count);

// Collective over ctx.comm: `verdicts` gets one status per item of `batch`, OK where
// no rank's input is non-finite, else a PERSEUS_NON_FINITE error naming the tensor
// and those ranks; identical on every rank. Returns the exchange's own status.
Status FindNonFinite(const Batch& batch, ExecContext& ctx, std::vector<Status>* verdicts);

// FindNonFinite for a batch that fails as a whole: one error naming every bad tensor.
Status CheckFinite(const Batch& batch, ExecContext& ctx);

}  // namespace perseus

#endif  // PERSEUS_NAN_CHECK_H_
