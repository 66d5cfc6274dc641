#include "timeline.h"

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

#include "perseus/perseus.h"

namespace perseus {

namespace timeline_detail {
std::atomic<bool> g_on{false};
}

namespace {

// The writer wakes this often, so the file trails the run by at most this much;
// a long queue wakes it sooner.
constexpr auto kFlushEvery = std::chrono::milliseconds(100);
constexpr size_t kFlushRecords = 4096;

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

// Writes all of `text`, retrying short writes. Errors are dropped: a full disk
// must not stop training.
void WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// The writer formats every event, so it appends numbers without temporaries: at
// tens of thousands of events a second its CPU time is taken from training.
void AppendInt(int64_t value, std::string* out) {
  char text[24];
  auto end = std::to_chars(text, text + sizeof text, value).ptr;
  out->append(text, end);
}

// The trace format counts in microseconds; three decimals keep nanoseconds.
void AppendMicros(int64_t nanos, std::string* out) {
  AppendInt(nanos / 1000, out);
  const int rest = static_cast<int>(nanos % 1000);
  const char digits[4] = {'.', static_cast<char>('0' + rest / 100),
                          static_cast<char>('0' + rest / 10 % 10), static_cast<char>('0' + rest % 10)};
  out->append(digits, 4);
}

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

Timeline& Timeline::Get() {
  static Timeline* timeline = new Timeline();  // never destroyed: lanes may outlive statics
  return *timeline;
}

Status Timeline::Start(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> control(control_mu_);
  if (path.empty()) return Status::Error(PERSEUS_INVALID_ARGUMENT, "timeline path is empty");
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return Status::Error(PERSEUS_INVALID_ARGUMENT,
                         "cannot open timeline file '" + path + "': " + std::strerror(errno));
  if (writer_.joinable()) StopWriter();  // a second start replaces the running timeline
  fd_ = fd;
  origin_ = Clock::now();
  tracks_.clear();
  next_tid_.clear();
  WriteAll(fd_, "[\n");
  mark_cycles_ = mark_cycles;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.clear();
    open_ = true;
    stopping_ = false;
  }
  writer_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "perseus-timeline");
    // Lowest priority: the writer only needs the cycles training leaves over (its
    // queue absorbs the wait); at full priority it took them from the ranks.
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
    open_ = false;
    stopping_ = true;
  }
  cv_.notify_all();
  writer_.join();
}

void Timeline::Span(int set, const std::string& tensor, const char* activity,
                    Clock::time_point begin, Clock::time_point end, int lane, int64_t bytes,
                    int fused) {
  Push(Record{'X', activity, set, tensor, begin, end, lane, bytes, fused});
}

void Timeline::Cycle(int set, Clock::time_point at) {
  Push(Record{'i', kCycleActivity, set, std::string(), at, at, -1, -1, 0});
}

void Timeline::Push(Record record) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!open_) return;  // stopped between the caller's TimelineOn() and here
    queue_.push_back(std::move(record));
    wake = queue_.size() == kFlushRecords;
  }
  if (wake) cv_.notify_one();
}

int64_t Timeline::Nanos(Clock::time_point t) const {
  // Requests submitted before the timeline started begin at its start.
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::max(t, origin_) - origin_)
      .count();
}

void Timeline::Format(const Record& r, std::string* out) {
  int tid = 0;
  if (!next_tid_.count(r.set)) {  // first event of this set: name the process and its rounds
    next_tid_[r.set] = 1;
    *out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(r.set) +
            ",\"args\":{\"name\":\"process set " + std::to_string(r.set) + "\"}},\n";
    *out += TrackName(r.set, 0, "negotiation rounds");
  }
  if (!r.tensor.empty()) {
    auto key = std::make_pair(r.set, r.tensor);
    auto it = tracks_.find(key);
    if (it == tracks_.end()) {
      it = tracks_.emplace(key, next_tid_[r.set]++).first;
      *out += TrackName(r.set, it->second, r.tensor);
    }
    tid = it->second;
  }
  *out += "{\"name\":\"";
  *out += r.activity;
  *out += "\",\"ph\":\"";
  out->push_back(r.phase);
  *out += "\",\"pid\":";
  AppendInt(r.set, out);
  *out += ",\"tid\":";
  AppendInt(tid, out);
  *out += ",\"ts\":";
  AppendMicros(Nanos(r.begin), out);
  if (r.phase == 'X') {
    *out += ",\"dur\":";
    AppendMicros(std::max<int64_t>(0, Nanos(r.end) - Nanos(r.begin)), out);
  } else {
    *out += ",\"s\":\"t\"";
  }
  bool any_args = false;
  auto arg = [&](const char* key, int64_t value) {
    *out += any_args ? "," : ",\"args\":{";
    *out += key;
    AppendInt(value, out);
    any_args = true;
  };
  if (r.lane >= 0) arg("\"lane\":", r.lane);
  if (r.bytes >= 0) arg("\"bytes\":", r.bytes);
  if (r.fused > 0) arg("\"fused\":", r.fused);
  if (any_args) out->push_back('}');
  *out += "},\n";
}

void Timeline::WriterLoop() {
  std::vector<Record> batch;
  std::string text;
  bool last = false;
  while (!last) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, kFlushEvery,
                   [&] { return stopping_ || queue_.size() >= kFlushRecords; });
      batch.swap(queue_);
      last = stopping_;
    }
    text.clear();
    for (const Record& r : batch) Format(r, &text);
    batch.clear();
    if (last) {
      // A closing event, so that the array ends without a dangling comma.
      text += "{\"name\":\"TIMELINE_STOP\",\"ph\":\"i\",\"s\":\"g\",\"pid\":0,\"tid\":0,\"ts\":";
      AppendMicros(Nanos(Clock::now()), &text);
      text += "}\n]\n";
    }
    if (!text.empty()) WriteAll(fd_, text);  // one write per flush: whole lines only
  }
  ::close(fd_);
  fd_ = -1;
}

}  // namespace perseus
