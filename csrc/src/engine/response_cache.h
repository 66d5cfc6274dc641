// Names every rank has agreed on before, each given the same bit on every rank, so
// that a repeat request is agreed by one bitwise AND instead of a metadata gather.
// Every mutation is driven by negotiation results that all ranks share, which keeps
// the caches identical without any extra communication.
#ifndef PERSEUS_RESPONSE_CACHE_H_
#define PERSEUS_RESPONSE_CACHE_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/request.h"

namespace perseus {

class ResponseCache {
 public:
  explicit ResponseCache(int capacity);

  int capacity() const { return static_cast<int>(slots_.size()); }
  // The bit of `meta` when its name is cached with the same metadata, else -1.
  int Lookup(const TensorMeta& meta) const;
  const TensorMeta& MetaAt(int bit) const { return slots_[bit].meta; }
  bool InUse(int bit) const { return slots_[bit].in_use; }
  // Marks a bit as used in the round numbered `round` (for eviction order).
  void Touch(int bit, uint64_t round);
  // Caches an agreed request (or updates its metadata); evicts the least recently
  // used name when full. No-op for anonymous requests or a zero capacity.
  void Put(const TensorMeta& meta, uint64_t round);
  void Clear();

 private:
  struct Slot {
    bool in_use = false;
    uint64_t last_round = 0;
    TensorMeta meta;
  };
  std::vector<Slot> slots_;
  std::unordered_map<std::string, int> by_name_;
};

// The metadata as cached: the first dimension is dropped where it may differ by rank.
TensorMeta CacheKey(const TensorMeta& meta);

}  // namespace perseus

#endif  // PERSEUS_RESPONSE_CACHE_H_
