// The timeline: a Chrome-trace JSON file (chrome://tracing, Perfetto) of what each
// named request went through on this rank: negotiation, waiting for its lane,
// packing into the fusion buffer, the collective itself, unpacking. Only rank 0
// writes one (PERSEUS_TIMELINE, or perseus_start_timeline).
//
// Cost: with the timeline off, every hook is one relaxed atomic load and a branch
// (TimelineOn()). With it on, a hook fills a slot of its own thread's ring
// (no lock, and no allocation once the slot's name buffer has grown); a writer
// thread formats the rings' records and writes them to the file. A full ring
// drops the event and counts it, so the hot path never waits for the writer;
// the file then says how many were dropped. A write error (a full disk) ends the
// writer with one warning and turns the hooks off: training goes on without it.
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
#include <memory>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

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
  struct Ring;  // one thread's records: that thread produces, the writer consumes

  static Timeline& Get();  // the one timeline of the process

  // Opens `path` (truncating it) and starts the writer; a running timeline is
  // stopped first. INVALID_ARGUMENT when the file cannot be opened or written. A
  // later write error stops the timeline, with one warning.
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
    uint32_t epoch;  // the Start() it belongs to: a late hook must not leak into the next file
    char phase;      // 'X' span, 'i' instant
    const char* activity;
    int set;
    std::string tensor;  // empty: the set's negotiation track
    Clock::time_point begin, end;
    int lane;
    int64_t bytes;
    int fused;
  };
  friend struct RingOwner;

  Timeline() = default;
  // The calling thread's ring (made or reused on its first event); null when none can be had.
  Ring* ThreadRing();
  void Release(Ring* ring);  // the ring's thread exits: another thread may take it
  uint64_t DroppedSoFar();   // events lost to full rings since the process started
  // Fills the next slot of this thread's ring, or counts a drop when it is full.
  void Push(char phase, const char* activity, int set, const std::string& tensor,
            Clock::time_point begin, Clock::time_point end, int lane, int64_t bytes, int fused);
  void WriterLoop();
  // Formats and frees every committed record of every ring into *out.
  void Drain(std::string* out);
  // Tells the writer thread to finish the file and joins it; caller holds control_mu_.
  void StopWriter();
  // Appends the record's JSON line(s) to *out, naming new tracks first.
  void Format(const Record& record, std::string* out);
  int64_t Nanos(Clock::time_point t) const;  // since origin_

  std::mutex control_mu_;  // serialises Start and Stop
  std::atomic<bool> mark_cycles_{false};
  std::atomic<uint32_t> epoch_{0};

  std::mutex rings_mu_;  // guards the two lists (not the rings' contents)
  std::vector<Ring*> rings_;       // every ring ever made; never freed (threads may outlive Stop)
  std::vector<Ring*> free_rings_;  // of threads that exited

  std::mutex mu_;  // guards the flags below, for the writer's wait
  std::condition_variable cv_;
  bool stopping_ = false;  // the writer drains and exits
  std::atomic<bool> wake_early_{false};  // a ring is half full
  std::thread writer_;

  // Writer-thread state (and Start/Stop while the writer is not running).
  int fd_ = -1;
  std::string path_;  // for the warning about a write error
  Clock::time_point origin_;
  uint32_t writing_epoch_ = 0;
  uint64_t dropped_reported_ = 0;
  struct SetTracks {
    int next_tid = 1;  // tid 0 is the set's negotiation rounds
    std::unordered_map<std::string, int> tids;  // tensor -> tid
  };
  std::unordered_map<int, SetTracks> tracks_;  // per process set
};

}  // namespace perseus

#endif  // PERSEUS_TIMELINE_H_
