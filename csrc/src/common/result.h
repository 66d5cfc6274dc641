// What a completed request hands back besides its status.
#ifndef PERSEUS_COMMON_RESULT_H_
#define PERSEUS_COMMON_RESULT_H_

#include <cstdint>
#include <vector>

namespace perseus {

struct Result {
  void* data = nullptr;  // core-allocated output (allgather, alltoall), malloc'd
  std::vector<int64_t> shape;
  std::vector<int64_t> recv_splits;
};

}  // namespace perseus

#endif  // PERSEUS_COMMON_RESULT_H_
