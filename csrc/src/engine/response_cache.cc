#include "engine/response_cache.h"

namespace perseus {

TensorMeta CacheKey(const TensorMeta& meta) {
  TensorMeta key = meta;
  if (key.FirstDimMayDiffer() && !key.shape.empty()) key.shape[0] = -1;
  return key;
}

ResponseCache::ResponseCache(int capacity) : slots_(capacity) {}

int ResponseCache::Lookup(const TensorMeta& meta) const {
  auto it = by_name_.find(meta.name);
  if (it == by_name_.end()) return -1;
  TensorMeta key = CacheKey(meta);
  return slots_[it->second].meta.Difference(key).empty() ? it->second : -1;
}

void ResponseCache::Touch(int bit, uint64_t round) { slots_[bit].last_round = round; }

void ResponseCache::Put(const TensorMeta& meta, uint64_t round) {
  if (meta.anonymous || slots_.empty()) return;
  auto it = by_name_.find(meta.name);
  int bit;
  if (it != by_name_.end()) {
    bit = it->second;
  } else {
    // A free slot, else the least recently used (lowest bit on ties): the same
    // choice on every rank because rounds are numbered identically everywhere.
    bit = 0;
    for (int i = 0; i < capacity(); ++i) {
      if (!slots_[i].in_use) {
        bit = i;
        break;
      }
      if (slots_[i].last_round < slots_[bit].last_round) bit = i;
    }
    if (slots_[bit].in_use) by_name_.erase(slots_[bit].meta.name);
    by_name_[meta.name] = bit;
  }
  slots_[bit].in_use = true;
  slots_[bit].last_round = round;
  slots_[bit].meta = CacheKey(meta);
}

void ResponseCache::Clear() {
  for (auto& s : slots_) s = Slot();
  by_name_.clear();
}

}  // namespace perseus
