#include "engine/config.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <vector>

namespace perseus {

namespace {

// A parser gets the raw text and writes the field; it returns an empty string on
// success or a description of what the variable accepts.
using Parser = std::function<std::string(const std::string&, Config*)>;

struct Variable {
  const char* name;
  const char* horovod_name;  // nullptr where Horovod has no such variable
  const char* meaning;
  Parser parse;
};

bool ParseInt(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

bool ParseDouble(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

Parser IntIn(int64_t lo, int64_t hi, std::function<void(Config*, int64_t)> set) {
  return [=](const std::string& text, Config* c) -> std::string {
    int64_t v;
    if (!ParseInt(text, &v) || v < lo || v > hi) {
      return "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    }
    set(c, v);
    return "";
  };
}

Parser NumberIn(double lo, double hi, std::function<void(Config*, double)> set) {
  return [=](const std::string& text, Config* c) -> std::string {
    double v;
    if (!ParseDouble(text, &v) || v < lo || v > hi) {
      std::ostringstream want;
      want << "a number in [" << lo << ", " << hi << "]";
      return want.str();
    }
    set(c, v);
    return "";
  };
}

// Accepts only the values this build implements; the others name the issue they wait for.
Parser OneOf(std::vector<std::string> supported, std::vector<std::string> not_yet) {
  return [=](const std::string& text, Config*) -> std::string {
    for (const auto& s : supported)
      if (text == s) return "";
    std::string accepted;
    for (const auto& s : supported) accepted += (accepted.empty() ? "" : ", ") + s;
    for (const auto& s : not_yet)
      if (text == s) return accepted + " ('" + text + "' is not implemented in this build yet)";
    return accepted;
  };
}

Parser Flag(std::function<void(Config*, bool)> set) {
  return [=](const std::string& text, Config* c) -> std::string {
    std::string lower;
    for (char ch : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (lower == "1" || lower == "true" || lower == "on" || lower == "yes") {
      set(c, true);
    } else if (lower.empty() || lower == "0" || lower == "false" || lower == "off" || lower == "no") {
      set(c, false);
    } else {
      return "1/true/on or 0/false/off";
    }
    return "";
  };
}

Parser Text(std::function<void(Config*, const std::string&)> set) {
  return [=](const std::string& text, Config* c) -> std::string {
    set(c, text);
    return "";
  };
}

const char* const kLogLevelNames[] = {"trace", "debug", "info", "warning", "error", "fatal"};

Parser LogLevelParser() {
  return [](const std::string& text, Config* c) -> std::string {
    const char* const* names = kLogLevelNames;
    std::string lower;
    for (char ch : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    for (int i = 0; i < 6; ++i) {
      if (lower == names[i]) {
        c->log_level = static_cast<LogLevel>(i);
        return "";
      }
    }
    return "one of trace, debug, info, warning, error, fatal";
  };
}

// nccl or mpi, in any case (Horovod's build-time spelling is upper case).
Parser GpuOperationsParser() {
  return [](const std::string& text, Config* c) -> std::string {
    std::string lower;
    for (char ch : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (lower == "nccl" || lower == "mpi") {
      c->gpu_use_nccl = lower == "nccl";
      return "";
    }
    if (lower == "ddl" || lower == "ccl" || lower == "gloo")
      return "nccl or mpi ('" + text + "' is not implemented by Perseus)";
    return "nccl or mpi";
  };
}

const std::vector<Variable>& Table() {
  static const std::vector<Variable> table = {
      {"PERSEUS_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", "bytes per fused buffer",
       IntIn(0, 1ll << 40, [](Config* c, int64_t v) { c->fusion_threshold = v; })},
      {"PERSEUS_CYCLE_TIME", "HOROVOD_CYCLE_TIME", "extra batching window, ms",
       NumberIn(0, 10000, [](Config* c, double v) { c->cycle_time_ms = v; })},
      {"PERSEUS_HOLD_BYTES", nullptr,
       "while no thread waits, start a round only once this many bytes are pending (0 = at once)",
       IntIn(0, 1ll << 40, [](Config* c, int64_t v) { c->hold_bytes = v; })},
      {"PERSEUS_HOLD_TIME", nullptr,
       "while no thread waits, start a round at the latest when the oldest pending request is "
       "this old, ms (0 = at once)",
       NumberIn(0, 3.6e6, [](Config* c, double v) { c->hold_time_ms = v; })},
      {"PERSEUS_ALLREDUCE_STREAMS", nullptr, "concurrent execution lanes",
       IntIn(1, 64, [](Config* c, int64_t v) { c->lanes = static_cast<int>(v); })},
      {"PERSEUS_CHUNK_SIZE", nullptr, "bytes per MPI call on large buffers",
       IntIn(4096, 1ll << 30, [](Config* c, int64_t v) { c->chunk_bytes = v; })},
      {"PERSEUS_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY", "names agreed by bit vector",
       IntIn(0, 1 << 16, [](Config* c, int64_t v) { c->cache_capacity = static_cast<int>(v); })},
      {"PERSEUS_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_CHECK_TIME_SECONDS",
       "warn about requests waiting this long (0 = off)",
       NumberIn(0, 1e6, [](Config* c, double v) { c->stall_check_seconds = v; })},
      {"PERSEUS_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
       "fail requests waiting this long on every rank (0 = off)",
       NumberIn(0, 1e6, [](Config* c, double v) { c->stall_shutdown_seconds = v; })},
      {"PERSEUS_LOG_LEVEL", "HOROVOD_LOG_LEVEL", "logging threshold", LogLevelParser()},
      {"PERSEUS_ALLREDUCE_DTYPE", nullptr, "on-the-wire compression of float gradients",
       OneOf({"none"}, {"fp16", "bf16"})},
      {"PERSEUS_ALLREDUCE_MODE", nullptr, "flat or hierarchical allreduce",
       OneOf({"flat"}, {"hierarchical"})},
      {"PERSEUS_ALLREDUCE_NANCHECK", nullptr, "NaN/Inf check of allreduce inputs",
       Flag([](Config* c, bool v) { c->nan_check = v; })},
      {"PERSEUS_TIMELINE", "HOROVOD_TIMELINE", "Chrome-trace timeline file written by rank 0",
       Text([](Config* c, const std::string& v) { c->timeline_path = v; })},
      {"PERSEUS_TIMELINE_MARK_CYCLES", "HOROVOD_TIMELINE_MARK_CYCLES",
       "mark negotiation rounds in the timeline",
       Flag([](Config* c, bool v) { c->timeline_mark_cycles = v; })},
      {"PERSEUS_GPU_OPERATIONS", "HOROVOD_GPU_OPERATIONS",
       "how GPU tensors are reduced: nccl, or mpi (host-staged through pinned memory)",
       GpuOperationsParser()},
      {"PERSEUS_CUDA_LIB", nullptr, "the CUDA runtime to load: a file, or a folder holding it",
       Text([](Config* c, const std::string& v) { c->cuda_lib = v; })},
      {"PERSEUS_NCCL_LIB", nullptr, "the NCCL library to load: a file, or a folder holding it",
       Text([](Config* c, const std::string& v) { c->nccl_lib = v; })},
  };
  return table;
}

}  // namespace

Status LoadConfig(Config* config) {
  *config = Config();
  for (const Variable& var : Table()) {
    const char* used = var.name;
    const char* raw = std::getenv(var.name);
    if (raw == nullptr && var.horovod_name != nullptr) {
      raw = std::getenv(var.horovod_name);
      used = var.horovod_name;
    }
    if (raw == nullptr) continue;
    std::string problem = var.parse(raw, config);
    if (!problem.empty()) {
      return Status::Error(PERSEUS_CONFIG_ERROR, std::string(used) + "='" + raw +
                                                     "' is invalid (" + var.meaning +
                                                     "): expected " + problem);
    }
  }
  return Status::OK();
}

std::string DescribeConfig(const Config& c) {
  std::ostringstream out;
  out << "PERSEUS_FUSION_THRESHOLD=" << c.fusion_threshold << "\n"
      << "PERSEUS_CYCLE_TIME=" << c.cycle_time_ms << "\n"
      << "PERSEUS_HOLD_BYTES=" << c.hold_bytes << "\n"
      << "PERSEUS_HOLD_TIME=" << c.hold_time_ms << "\n"
      << "PERSEUS_ALLREDUCE_STREAMS=" << c.lanes << "\n"
      << "PERSEUS_CHUNK_SIZE=" << c.chunk_bytes << "\n"
      << "PERSEUS_CACHE_CAPACITY=" << c.cache_capacity << "\n"
      << "PERSEUS_STALL_CHECK_TIME_SECONDS=" << c.stall_check_seconds << "\n"
      << "PERSEUS_STALL_SHUTDOWN_TIME_SECONDS=" << c.stall_shutdown_seconds << "\n"
      << "PERSEUS_ALLREDUCE_NANCHECK=" << (c.nan_check ? 1 : 0) << "\n"
      << "PERSEUS_TIMELINE=" << c.timeline_path << "\n"
      << "PERSEUS_TIMELINE_MARK_CYCLES=" << (c.timeline_mark_cycles ? 1 : 0) << "\n"
      << "PERSEUS_LOG_LEVEL=" << kLogLevelNames[static_cast<int>(c.log_level)] << "\n"
      << "PERSEUS_GPU_OPERATIONS=" << (c.gpu_use_nccl ? "nccl" : "mpi") << "\n"
      << "PERSEUS_CUDA_LIB=" << c.cuda_lib << "\n"
      << "PERSEUS_NCCL_LIB=" << c.nccl_lib << "\n";
  return out.str();
}

}  // namespace perseus
