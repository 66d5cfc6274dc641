#include "common/counters.h"

#include <atomic>

namespace perseus {

namespace {
std::atomic<int64_t> g_counters[kCounterCount];
}  // namespace

void Count(Counter counter, int64_t n) { g_counters[counter].fetch_add(n, std::memory_order_relaxed); }

int64_t CounterValue(Counter counter) { return g_counters[counter].load(std::memory_order_relaxed); }

}  // namespace perseus
