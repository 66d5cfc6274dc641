// Walks a batch's tensors (or some of them) as one logical buffer, end to end, in
// windows of at most `window` elements: pack the window into the scratch buffer,
// run one MPI call on it, unpack. Working window by window keeps the data in cache
// and needs a scratch buffer of one window only.
#ifndef PERSEUS_FUSED_WINDOWS_H_
#define PERSEUS_FUSED_WINDOWS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/batch.h"
#include "common/clock.h"
#include "common/timeline.h"

namespace perseus {

// Pack(item, item_offset, window_offset, count) copies `count` elements of `item`
// starting at `item_offset` to window position `window_offset`; Unpack does the
// reverse; Run(count) communicates the first `count` elements of the window.
template <typename Pack, typename RunFn, typename Unpack>
Status ForEachWindow(const std::vector<const BatchItem*>& items, int64_t window, Pack pack,
                     RunFn run, Unpack unpack) {
  std::vector<int64_t> starts;  // first element of each item in the logical buffer
  int64_t total = 0;
  for (const BatchItem* item : items) {
    starts.push_back(total);
    total += item->meta.NumElements();
  }
  size_t first = 0;  // first item that may overlap the current window
  for (int64_t begin = 0; begin < total; begin += window) {
    int64_t end = std::min(total, begin + window);
    while (starts[first] + items[first]->meta.NumElements() <= begin) ++first;
    auto overlaps = [&](auto fn) {
      for (size_t i = first; i < items.size() && starts[i] < end; ++i) {
        int64_t lo = std::max(begin, starts[i]);
        int64_t hi = std::min(end, starts[i] + items[i]->meta.NumElements());
        if (hi > lo) fn(*items[i], lo - starts[i], lo - begin, hi - lo);
      }
    };
    // Timeline: one span per tensor and window for each copy. Off: one branch each.
    const bool traced = TimelineOn();
    auto trace = [&](const char* activity, Clock::time_point from) {
      Clock::time_point to = Clock::now();
      overlaps([&](const BatchItem& item, int64_t, int64_t, int64_t) {
        if (item.entry)
          Timeline::Get().Span(item.entry->process_set, item.meta.name, activity, from, to);
      });
    };
    Clock::time_point packing = traced ? Clock::now() : Clock::time_point();
    overlaps(pack);
    if (traced) trace(kMemcpyInActivity, packing);
    Status status = run(end - begin);
    if (!status.ok()) return status;
    Clock::time_point unpacking = traced ? Clock::now() : Clock::time_point();
    overlaps(unpack);
    if (traced) trace(kMemcpyOutActivity, unpacking);
  }
  return Status::OK();
}

template <typename Pack, typename RunFn, typename Unpack>
Status ForEachWindow(const Batch& batch, int64_t window, Pack pack, RunFn run, Unpack unpack) {
  std::vector<const BatchItem*> items;
  for (const BatchItem& item : batch.items) items.push_back(&item);
  return ForEachWindow(items, window, pack, run, unpack);
}

}  // namespace perseus

#endif  // PERSEUS_FUSED_WINDOWS_H_
