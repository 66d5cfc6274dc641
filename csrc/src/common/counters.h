// Process-wide counts of what the core asked of MPI, for tests that hold the cost of a
// call to a budget (tests/mpi/test_call_budget.py) independently of timing: perseus_counters.
#ifndef PERSEUS_COUNTERS_H_
#define PERSEUS_COUNTERS_H_

#include <cstdint>

namespace perseus {

// The order is perseus_counters' (perseus.h).
enum Counter {
  kNegotiationRounds = 0,  // a round's MPI_Iallreduce of bits
  kNegotiationGathers,     // a round's metadata gather (MPI_Iallgather, then Iallgatherv)
  kPayloadRounds,          // rounds that carried a request's data (engine/round_payload.h)
  kRiddenRequests,         // requests whose result such a round gave
  kDataCollectives,        // collectives of the lanes (each through CompleteRequest)
  kCounterCount
};

void Count(Counter counter, int64_t n = 1);
int64_t CounterValue(Counter counter);

}  // namespace perseus

#endif  // PERSEUS_COUNTERS_H_
