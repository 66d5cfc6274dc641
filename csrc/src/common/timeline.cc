#include "common/timeline.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/logging.h"
#include "perseus/perseus.h"

namespace perseus {

namespace timeline_detail {
std::atomic<bool> g_on{false};
}

namespace {

// The writer wakes this often, so the file trails the run by at most this much;
// a half-full ring wakes it sooner.
constexpr auto kFlushEvery = std::chrono::milliseconds(100);

const char* const kNegotiate[] = {"NEGOTIATE_ALLREDUCE", "NEGOTIATE_ALLGATHER",
                                  "NEGOTIATE_BROADCAST", "NEGOTIATE_ALLTOALL",
                                  "NEGOTIATE_REDUCESCATTER", "NEGOTIATE_BARRIER",
                                  "NEGOTIATE_JOIN"};
const char* const kExecute[] = {"ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL",
                                "REDUCESCATTER", "BARRIER", "JOIN"};

void AppendJsonString(const std::string& text, std::string* out) {
  out->push_back('"');
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out->append(escaped);
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
  out->push_back('"');
}

// Writes all of `text`, retrying short writes; 0, or the errno of the write that failed.
int WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    done += static_cast<size_t>(n);
  }
  return 0;
}

// One event's JSON line, built in a fixed buffer and appended to the output once:
// the writer formats every event, and a string append per field cost it more
// than the event's hook. Every field is bounded (activity names are ours, numbers
// at most 20 digits), so 256 bytes hold a line.
class EventLine {
 public:
  template <size_t N>
  EventLine& Text(const char (&literal)[N]) {
    return Bytes(literal, N - 1);
  }
  EventLine& Name(const char* activity) { return Bytes(activity, std::strlen(activity)); }
  EventLine& Char(char c) {
    *end_++ = c;
    return *this;
  }
  EventLine& Int(int64_t value) {
    end_ = std::to_chars(end_, buffer_ + sizeof buffer_, value).ptr;
    return *this;
  }
  EventLine& Micros(int64_t nanos) {
    Int(nanos / 1000);
    const int rest = static_cast<int>(nanos % 1000);
    end_[0] = '.';
    end_[1] = static_cast<char>('0' + rest / 100);
    end_[2] = static_cast<char>('0' + rest / 10 % 10);
    end_[3] = static_cast<char>('0' + rest % 10);
    end_ += 4;
    return *this;
  }
  void AppendTo(std::string* out) const {
    out->append(buffer_, static_cast<size_t>(end_ - buffer_));
  }

 private:
  EventLine& Bytes(const char* text, size_t n) {
    std::memcpy(end_, text, n);
    end_ += n;
    return *this;
  }
  char buffer_[256];
  char* end_ = buffer_;
};

std::string TrackName(int set, int tid, const std::string& name) {
  std::string line = "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(set) +
                     ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"name\":";
  AppendJsonString(name, &line);
  return line + "}},\n";
}

}  // namespace

const char* const kQueuedActivity = "QUEUED";
const char* const kMemcpyInActivity = "MEMCPY_IN_FUSION_BUFFER";
const char* const kMemcpyOutActivity = "MEMCPY_OUT_FUSION_BUFFER";
const char* const kCycleActivity = "CYCLE_START";

const char* NegotiateActivity(int op_type) {
  return (op_type >= 0 && op_type <= PERSEUS_JOIN) ? kNegotiate[op_type] : "NEGOTIATE";
}

const char* ExecuteActivity(int op_type) {
  return (op_type >= 0 && op_type <= PERSEUS_JOIN) ? kExecute[op_type] : "EXECUTE";
}

// One thread's records. Only its thread writes slots and head; only the writer
// reads slots and moves tail, so neither side takes a lock.
struct Timeline::Ring {
  static constexpr uint64_t kSlots = 32768;  // ~0.15 s of the busiest thread's events
  std::unique_ptr<Record[]> slots{new Record[kSlots]};
  alignas(64) std::atomic<uint64_t> head{0};  // next slot the thread fills
  alignas(64) std::atomic<uint64_t> tail{0};  // next slot the writer reads
  std::atomic<uint64_t> dropped{0};           // events lost to a full ring
};

// Hands a thread's ring back when the thread exits (lanes end at shutdown and
// new ones start at the next init), so rings are reused rather than multiplied.
struct RingOwner {
  Timeline::Ring* ring = nullptr;
  ~RingOwner() {
    if (ring) Timeline::Get().Release(ring);
  }
};

namespace {
thread_local RingOwner t_ring_owner;
}  // namespace

Timeline& Timeline::Get() {
  static Timeline* timeline = new Timeline();  // never destroyed: lanes may outlive statics
  return *timeline;
}

Timeline::Ring* Timeline::ThreadRing() {
  if (t_ring_owner.ring) return t_ring_owner.ring;
  std::lock_guard<std::mutex> lock(rings_mu_);
  if (!free_rings_.empty()) {
    t_ring_owner.ring = free_rings_.back();
    free_rings_.pop_back();
  } else {
    t_ring_owner.ring = new Ring();
    rings_.push_back(t_ring_owner.ring);
  }
  return t_ring_owner.ring;
}

void Timeline::Release(Ring* ring) {
  std::lock_guard<std::mutex> lock(rings_mu_);
  free_rings_.push_back(ring);
}

Status Timeline::Start(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> control(control_mu_);
  if (path.empty()) return Status::Error(PERSEUS_INVALID_ARGUMENT, "timeline path is empty");
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return Status::Error(PERSEUS_INVALID_ARGUMENT,
                         "cannot open timeline file '" + path + "': " + std::strerror(errno));
  // A file that takes nothing (a full disk, /dev/full) fails here, like one that
  // cannot be opened; a later write error stops the writer with a warning.
  if (int error = WriteAll(fd, "[\n")) {
    ::close(fd);
    return Status::Error(PERSEUS_INVALID_ARGUMENT,
                         "cannot write timeline file '" + path + "': " + std::strerror(error));
  }
  if (writer_.joinable()) StopWriter();  // a second start replaces the running timeline
  fd_ = fd;
  path_ = path;
  origin_ = Clock::now();
  tracks_.clear();
  writing_epoch_ = epoch_.fetch_add(1) + 1;
  dropped_reported_ = DroppedSoFar();
  mark_cycles_ = mark_cycles;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = false;
  }
  writer_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "perseus-timeline");
    // Lowest priority: the writer only needs the cycles training leaves over (the
    // rings absorb the wait); at full priority it took them from the ranks.
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
    WriterLoop();
  });
  timeline_detail::g_on = true;
  return Status::OK();
}

void Timeline::Stop() {
  std::lock_guard<std::mutex> control(control_mu_);
  if (writer_.joinable()) StopWriter();
}

void Timeline::StopWriter() {
  timeline_detail::g_on = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  writer_.join();
}

void Timeline::Span(int set, const std::string& tensor, const char* activity,
                    Clock::time_point begin, Clock::time_point end, int lane, int64_t bytes,
                    int fused) {
  Push('X', activity, set, tensor, begin, end, lane, bytes, fused);
}

void Timeline::Cycle(int set, Clock::time_point at) {
  static const std::string kRoundsTrack;  // empty: the set's negotiation track
  Push('i', kCycleActivity, set, kRoundsTrack, at, at, -1, -1, 0);
}

void Timeline::Push(char phase, const char* activity, int set, const std::string& tensor,
                    Clock::time_point begin, Clock::time_point end, int lane, int64_t bytes,
                    int fused) {
  Ring* ring = ThreadRing();
  const uint64_t head = ring->head.load(std::memory_order_relaxed);
  const uint64_t used = head - ring->tail.load(std::memory_order_acquire);
  if (used >= Ring::kSlots) {
    ring->dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Record& r = ring->slots[head % Ring::kSlots];
  r.epoch = epoch_.load(std::memory_order_relaxed);
  r.phase = phase;
  r.activity = activity;
  r.set = set;
  r.tensor.assign(tensor);  // reuses the slot's buffer: no allocation once warm
  r.begin = begin;
  r.end = end;
  r.lane = lane;
  r.bytes = bytes;
  r.fused = fused;
  ring->head.store(head + 1, std::memory_order_release);
  if (used + 1 == Ring::kSlots / 2) {  // filling faster than the writer's period: wake it
    wake_early_.store(true, std::memory_order_relaxed);
    cv_.notify_one();
  }
}

uint64_t Timeline::DroppedSoFar() {
  std::lock_guard<std::mutex> lock(rings_mu_);
  uint64_t total = 0;
  for (Ring* ring : rings_) total += ring->dropped.load(std::memory_order_relaxed);
  return total;
}

int64_t Timeline::Nanos(Clock::time_point t) const {
  // Requests submitted before the timeline started begin at its start.
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::max(t, origin_) - origin_)
      .count();
}

void Timeline::Format(const Record& r, std::string* out) {
  auto found = tracks_.find(r.set);
  if (found == tracks_.end()) {  // first event of this set: name the process and its rounds
    found = tracks_.emplace(r.set, SetTracks()).first;
    *out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(r.set) +
            ",\"args\":{\"name\":\"process set " + std::to_string(r.set) + "\"}},\n";
    *out += TrackName(r.set, 0, "negotiation rounds");
  }
  SetTracks& set = found->second;
  int tid = 0;
  if (!r.tensor.empty()) {
    auto it = set.tids.find(r.tensor);
    if (it == set.tids.end()) {
      it = set.tids.emplace(r.tensor, set.next_tid++).first;
      *out += TrackName(r.set, it->second, r.tensor);
    }
    tid = it->second;
  }
  EventLine line;
  line.Text("{\"name\":\"").Name(r.activity).Text("\",\"ph\":\"").Char(r.phase);
  line.Text("\",\"pid\":").Int(r.set).Text(",\"tid\":").Int(tid);
  line.Text(",\"ts\":").Micros(Nanos(r.begin));
  if (r.phase == 'X')
    line.Text(",\"dur\":").Micros(std::max<int64_t>(0, Nanos(r.end) - Nanos(r.begin)));
  else
    line.Text(",\"s\":\"t\"");
  bool any_args = false;
  auto arg = [&](const char* key, int64_t value) {
    line.Name(any_args ? "," : ",\"args\":{").Name(key).Int(value);
    any_args = true;
  };
  if (r.lane >= 0) arg("\"lane\":", r.lane);
  if (r.bytes >= 0) arg("\"bytes\":", r.bytes);
  if (r.fused > 0) arg("\"fused\":", r.fused);
  if (any_args) line.Char('}');
  line.Text("},\n").AppendTo(out);
}

void Timeline::Drain(std::string* out) {
  std::vector<Ring*> rings;
  {
    std::lock_guard<std::mutex> lock(rings_mu_);
    rings = rings_;
  }
  for (Ring* ring : rings) {
    const uint64_t tail = ring->tail.load(std::memory_order_relaxed);
    const uint64_t head = ring->head.load(std::memory_order_acquire);
    for (uint64_t i = tail; i != head; ++i) {
      const Record& r = ring->slots[i % Ring::kSlots];
      if (r.epoch == writing_epoch_) Format(r, out);  // else a hook that raced a Stop()
    }
    ring->tail.store(head, std::memory_order_release);
  }
  const uint64_t dropped = DroppedSoFar();
  if (dropped != dropped_reported_) {
    // Said in the file, so a gap in the trace is not mistaken for idle time.
    EventLine line;
    line.Text("{\"name\":\"TIMELINE_DROPPED\",\"ph\":\"i\",\"s\":\"g\",\"pid\":0,\"tid\":0,\"ts\":")
        .Micros(Nanos(Clock::now()))
        .Text(",\"args\":{\"events\":")
        .Int(static_cast<int64_t>(dropped - dropped_reported_))
        .Text("}},\n")
        .AppendTo(out);
    dropped_reported_ = dropped;
  }
}

void Timeline::WriterLoop() {
  std::string text;
  bool last = false;
  while (!last) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, kFlushEvery, [&] {
        return stopping_ || wake_early_.exchange(false, std::memory_order_relaxed);
      });
      last = stopping_;
    }
    text.clear();
    Drain(&text);
    if (last) {
      // A closing event, so that the array ends without a dangling comma.
      EventLine line;
      line.Text("{\"name\":\"TIMELINE_STOP\",\"ph\":\"i\",\"s\":\"g\",\"pid\":0,\"tid\":0,\"ts\":")
          .Micros(Nanos(Clock::now()))
          .Text("}\n]\n")
          .AppendTo(&text);
    }
    if (text.empty()) continue;
    if (int error = WriteAll(fd_, text)) {  // one write per flush: whole lines only
      // Training goes on without the timeline: said once, and the hooks go quiet.
      timeline_detail::g_on = false;
      PERSEUS_LOG(kWarning) << "cannot write timeline file '" << path_
                            << "': " << std::strerror(error)
                            << "; the timeline stops here (the file ends with what was written)";
      break;
    }
  }
  ::close(fd_);
  fd_ = -1;
}

}  // namespace perseus
