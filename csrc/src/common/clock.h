// The one clock of the core: monotonic, for timeouts, holds, stalls and the timeline.
#ifndef PERSEUS_COMMON_CLOCK_H_
#define PERSEUS_COMMON_CLOCK_H_

#include <chrono>

namespace perseus {

using Clock = std::chrono::steady_clock;

}  // namespace perseus

#endif  // PERSEUS_COMMON_CLOCK_H_
