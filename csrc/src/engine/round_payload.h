// A negotiation round that carries one small allreduce's data as well.
//
// A loop of one repeated call (allreduce_ of one named tensor) costs a round, to
// agree that every rank holds it, and a batch, to reduce it: two collectives. When
// the last two rounds each agreed that same cached allreduce alone, the next round's
// bit vector is followed by its payload (each rank that holds it puts its input there,
// prescaled), and one user-defined operator reduces both in the round's one
// MPI_Iallreduce: AND over the bits, the request's own reduction over the data. If the
// round agrees the request, every rank held it, so the payload is its result: one
// collective instead of two. If not, the payload is dropped and the request goes on as
// usual. Whether a round carries a payload, and whose, follows from outcomes that every
// rank shares, so every member's round has the same layout.
//
// The result is the direct path's of RunAllreduce (collectives/allreduce.cc) to the
// bit: the same operators (ReduceLocal), prescale before, postscale and averaging
// after. Only where that path would not do something else: flat allreduce of host
// tensors, no wire dtype, no NaN check, no autotuning (CarriesPayloads).
#ifndef PERSEUS_ROUND_PAYLOAD_H_
#define PERSEUS_ROUND_PAYLOAD_H_

#include <mpi.h>

#include <cstdint>
#include <map>
#include <vector>

#include "common/batch.h"
#include "common/request.h"
#include "engine/config.h"

namespace perseus {

// Payloads up to this size ride in a round; above it the data collective dominates.
constexpr int64_t kMaxRoundPayloadBytes = 16 << 10;

// Whether rounds may carry payloads under `config`.
bool CarriesPayloads(const Config& config);
// Whether `meta`, agreed alone, may ride in the next round.
bool MayRideInRound(const TensorMeta& meta);

// The MPI side of rounds with a payload: the operator and a datatype per length.
// One per negotiator; after MPI is initialised.
class RoundPayloadOps {
 public:
  RoundPayloadOps();
  ~RoundPayloadOps();
  MPI_Op op() const { return op_; }
  // A contiguous type of `words` 64-bit words: a round is one element of it, so MPI
  // never splits the layout between calls of the operator.
  MPI_Datatype TypeOf(int words);

  // The round's buffer: [header: 2 words][bits: bit_words][payload, padded to words].
  static int Words(int bit_words, int64_t payload_bytes);
  static void WriteHeader(uint64_t* round, int bit_words, int64_t payload_bytes, int dtype, int op);
  static constexpr int kHeaderWords = 2;

 private:
  MPI_Op op_ = MPI_OP_NULL;
  std::map<int, MPI_Datatype> types_;
};

}  // namespace perseus

#endif  // PERSEUS_ROUND_PAYLOAD_H_
