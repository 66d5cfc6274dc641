// The timeline: a Chrome-trace JSON file (chrome://tracing, Perfetto) of what each
// named request went through on this rank: negotiation, waiting for its lane,
// packing into the fusion buffer, the collective itself, unpacking. Only rank 0
// writes one (PERSEUS_TIMELINE, or perseus_start_timeline).
//
// Cost: with the timeline off, every hook is one relaxed atomic load and a branch
// (TimelineOn()). With it on, a hook appends a small record under a mutex; a
// writer thread formats the records and writes them to the file.
//
// The file is a JSON array whose closing bracket comes only at Stop(): "[\n",
// then every event followed by ",\n". The trace viewers accept that unterminated
// form, so the file is usable while training runs and after a crash. Records are
// written in whole lines, one write(2) per flush, so a killed process leaves no
// half event behind.
#ifndef PERSEUS_TIMELINE_H_
#define PERSEUS_TIMELINE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "status.h"

namespace perseus {

namespace timeline_detail {
extern std::atomic<bool> g_on;
}

// The hot-path test every hook starts with.
inline bool TimelineOn() { return timeline_detail::g_on.load(std::memory_order_relaxed); }

// Activity names, as they appear in the file. Per op type: NEGOTIATE_<OP> and <OP>.
const char* NegotiateActivity(int op_type);
const char* ExecuteActivity(int op_type);
extern const char* const kQueuedActivity;     // agreed, waiting for its lane
extern const char* const kMemcpyInActivity;   // packing into the fusion buffer
extern const char* const kMemcpyOutActivity;  // unpacking from it
extern const char* const kCycleActivity;      // a negotiation round started

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  static Timeline& Get();  // the one timeline of the process

  // Opens `path` (truncating it) and starts the writer; a running timeline is
  // stopped first. INVALID_ARGUMENT when the file cannot be opened.
  Status Start(const std::string& path, bool mark_cycles);
  // Writes what is queued, closes the JSON array and the file. No-op when off.
  void Stop();
  bool mark_cycles() const { return mark_cycles_.load(std::memory_order_relaxed); }

  // A span of `activity` on the track of `tensor` in process set `set`.
  // lane < 0, bytes < 0, fused <= 0: not shown.
  void Span(int set, const std::string& tensor, const char* activity, Clock::time_point begin,
            Clock::time_point end, int lane = -1, int64_t bytes = -1, int fused = 0);
  // An instant marker on the set's negotiation track (mark_cycles).
  void Cycle(int set, Clock::time_point at);

 private:
  struct Record {
    char phase;  // 'X' span, 'i' instant
    const char* activity;
    int set;
    std::string tensor;  // empty: the set's negotiation track
    Clock::time_point begin, end;
    int lane;
    int64_t bytes;
    int fused;
  };

  Timeline() = default;
  void Push(Record record);
  void WriterLoop();
  // Tells the writer thread to finish the file and joins it; caller holds control_mu_.
  void StopWriter();
  // Appends the record's JSON line(s) to *out, naming new tracks first.
  void Format(const Record& record, std::string* out);
  int64_t Nanos(Clock::time_point t) const;  // since origin_

  std::mutex control_mu_;  // serialises Start and Stop
  std::atomic<bool> mark_cycles_{false};

  std::mutex mu_;  // guards the queue and the flags below
  std::condition_variable cv_;
  std::vector<Record> queue_;
  bool open_ = false;      // records are accepted
  bool stopping_ = false;  // the writer drains and exits
  std::thread writer_;

  // Writer-thread state (and Start/Stop while the writer is not running).
  int fd_ = -1;
  Clock::time_point origin_;
  std::map<std::pair<int, std::string>, int> tracks_;  // (set, tensor) -> tid
  std::map<int, int> next_tid_;                        // per set; tid 0 is the set's rounds
};

}  // namespace perseus

#endif  // PERSEUS_TIMELINE_H_
