#include "engine/config.h"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <vector>

namespace perseus {

namespace {

// A parser gets the raw text and writes the field; it returns an empty string on
// success or a description of what the variable accepts. A printer gives the
// field's value as text that parses back to the same value.
using Parser = std::function<std::string(const std::string&, Config*)>;
using Printer = std::function<std::string(const Config&)>;
struct Field {
  Parser parse;
  Printer print;
};

// kAgreed: a different value on another rank would change what goes on the wire
// (or when), so init() compares it across ranks and refuses a difference.
enum Scope { kLocal, kAgreed };

struct Variable {
  const char* name;
  const char* horovod_name;  // nullptr where Horovod has no such variable
  const char* meaning;
  Scope scope;
  Field field;
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

// The shortest text that reads back as exactly v: equal text means equal values.
std::string PrintDouble(double v) {
  char buf[32];
  auto end = std::to_chars(buf, buf + sizeof(buf), v).ptr;
  return std::string(buf, end);
}

std::string Lower(const std::string& text) {
  std::string lower;
  for (char ch : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return lower;
}

template <typename T>
Field IntIn(T Config::*field, int64_t lo, int64_t hi) {
  return {[=](const std::string& text, Config* c) -> std::string {
            int64_t v;
            if (!ParseInt(text, &v) || v < lo || v > hi)
              return "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
            c->*field = static_cast<T>(v);
            return "";
          },
          [=](const Config& c) { return std::to_string(c.*field); }};
}

// IntIn, where empty text means "not set": the field stays 0 and prints empty.
Field OptionalIntIn(int64_t Config::*field, int64_t lo, int64_t hi) {
  Field set = IntIn(field, lo, hi);
  return {[=](const std::string& text, Config* c) -> std::string {
            if (text.empty()) return "";
            std::string problem = set.parse(text, c);
            return problem.empty() ? "" : problem + ", or empty";
          },
          [=](const Config& c) { return c.*field == 0 ? std::string() : set.print(c); }};
}

Field NumberIn(double Config::*field, double lo, double hi) {
  return {[=](const std::string& text, Config* c) -> std::string {
            double v;
            if (!ParseDouble(text, &v) || v < lo || v > hi) {
              std::ostringstream want;
              want << "a number in [" << lo << ", " << hi << "]";
              return want.str();
            }
            c->*field = v;
            return "";
          },
          [=](const Config& c) { return PrintDouble(c.*field); }};
}

// Accepts only the values this build implements; the others name the issue they wait for.
Field OneOf(std::string Config::*field, std::vector<std::string> supported,
            std::vector<std::string> not_yet) {
  return {[=](const std::string& text, Config* c) -> std::string {
            for (const auto& s : supported) {
              if (text == s) {
                c->*field = text;
                return "";
              }
            }
            std::string accepted;
            for (const auto& s : supported) accepted += (accepted.empty() ? "" : ", ") + s;
            for (const auto& s : not_yet)
              if (text == s) return accepted + " ('" + text + "' is not implemented in this build yet)";
            return accepted;
          },
          [=](const Config& c) { return c.*field; }};
}

Field Flag(bool Config::*field) {
  return {[=](const std::string& text, Config* c) -> std::string {
            std::string lower = Lower(text);
            if (lower == "1" || lower == "true" || lower == "on" || lower == "yes") {
              c->*field = true;
            } else if (lower.empty() || lower == "0" || lower == "false" || lower == "off" ||
                       lower == "no") {
              c->*field = false;
            } else {
              return "1/true/on or 0/false/off";
            }
            return "";
          },
          [=](const Config& c) { return std::string(c.*field ? "1" : "0"); }};
}

Field Text(std::string Config::*field) {
  return {[=](const std::string& text, Config* c) -> std::string {
            c->*field = text;
            return "";
          },
          [=](const Config& c) { return c.*field; }};
}

const char* const kLogLevelNames[] = {"trace", "debug", "info", "warning", "error", "fatal"};

Field LogLevelField() {
  return {[](const std::string& text, Config* c) -> std::string {
            std::string lower = Lower(text);
            for (int i = 0; i < 6; ++i) {
              if (lower == kLogLevelNames[i]) {
                c->log_level = static_cast<LogLevel>(i);
                return "";
              }
            }
            return "one of trace, debug, info, warning, error, fatal";
          },
          [](const Config& c) {
            return std::string(kLogLevelNames[static_cast<int>(c.log_level)]);
          }};
}

// nccl or mpi, in any case (Horovod's build-time spelling is upper case).
Field GpuOperationsField() {
  return {[](const std::string& text, Config* c) -> std::string {
            std::string lower = Lower(text);
            if (lower == "nccl" || lower == "mpi") {
              c->gpu_use_nccl = lower == "nccl";
              return "";
            }
            if (lower == "ddl" || lower == "ccl" || lower == "gloo")
              return "nccl or mpi ('" + text + "' is not implemented by Perseus)";
            return "nccl or mpi";
          },
          [](const Config& c) { return std::string(c.gpu_use_nccl ? "nccl" : "mpi"); }};
}

const std::vector<Variable>& Table() {
  static const std::vector<Variable> table = {
      {"PERSEUS_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", "bytes per fused buffer", kAgreed,
       IntIn(&Config::fusion_threshold, 0, 1ll << 40)},
      {"PERSEUS_CYCLE_TIME", "HOROVOD_CYCLE_TIME", "extra batching window, ms", kAgreed,
       NumberIn(&Config::cycle_time_ms, 0, 10000)},
      {"PERSEUS_HOLD_BYTES", nullptr,
       "while no thread waits, start a round only once this many bytes are pending (0 = at once)",
       kAgreed, IntIn(&Config::hold_bytes, 0, 1ll << 40)},
      {"PERSEUS_HOLD_TIME", nullptr,
       "while no thread waits, start a round at the latest when the oldest pending request is "
       "this old, ms (0 = at once)",
       kAgreed, NumberIn(&Config::hold_time_ms, 0, 3.6e6)},
      {"PERSEUS_ALLREDUCE_STREAMS", nullptr, "concurrent execution lanes", kAgreed,
       IntIn(&Config::lanes, 1, 64)},
      {"PERSEUS_CHUNK_SIZE", nullptr, "bytes per MPI call on large buffers", kAgreed,
       IntIn(&Config::chunk_bytes, 4096, 1ll << 30)},
      {"PERSEUS_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY", "names agreed by bit vector", kAgreed,
       IntIn(&Config::cache_capacity, 0, 1 << 16)},
      {"PERSEUS_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_CHECK_TIME_SECONDS",
       "warn about requests waiting this long (0 = off)", kLocal,
       NumberIn(&Config::stall_check_seconds, 0, 1e6)},
      {"PERSEUS_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
       "fail requests waiting this long on every rank (0 = off)", kLocal,
       NumberIn(&Config::stall_shutdown_seconds, 0, 1e6)},
      {"PERSEUS_ALLREDUCE_NANCHECK", nullptr, "NaN/Inf check of allreduce inputs", kAgreed,
       Flag(&Config::nan_check)},
      {"PERSEUS_ALLREDUCE_DTYPE", nullptr, "on-the-wire compression of float gradients", kAgreed,
       OneOf(&Config::allreduce_dtype, {"none"}, {"fp16", "bf16"})},
      {"PERSEUS_ALLREDUCE_MODE", nullptr, "flat or hierarchical allreduce", kAgreed,
       OneOf(&Config::allreduce_mode, {"flat"}, {"hierarchical"})},
      {"PERSEUS_RANKS_PER_NODE", nullptr,
       "simulated nodes of this many consecutive ranks for node-scoped features (empty = the "
       "real nodes)",
       kAgreed, OptionalIntIn(&Config::ranks_per_node, 1, 1 << 20)},
      {"PERSEUS_TIMELINE", "HOROVOD_TIMELINE", "Chrome-trace timeline file written by rank 0",
       kLocal, Text(&Config::timeline_path)},
      {"PERSEUS_TIMELINE_MARK_CYCLES", "HOROVOD_TIMELINE_MARK_CYCLES",
       "mark negotiation rounds in the timeline", kLocal, Flag(&Config::timeline_mark_cycles)},
      {"PERSEUS_LOG_LEVEL", "HOROVOD_LOG_LEVEL", "logging threshold", kLocal, LogLevelField()},
      {"PERSEUS_GPU_OPERATIONS", "HOROVOD_GPU_OPERATIONS",
       "how GPU tensors are reduced: nccl, or mpi (host-staged through pinned memory)", kAgreed,
       GpuOperationsField()},
      {"PERSEUS_CUDA_LIB", nullptr, "the CUDA runtime to load: a file, or a folder holding it",
       kLocal, Text(&Config::cuda_lib)},
      {"PERSEUS_NCCL_LIB", nullptr, "the NCCL library to load: a file, or a folder holding it",
       kLocal, Text(&Config::nccl_lib)},
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
    std::string problem = var.field.parse(raw, config);
    if (!problem.empty()) {
      return Status::Error(PERSEUS_CONFIG_ERROR, std::string(used) + "='" + raw +
                                                     "' is invalid (" + var.meaning +
                                                     "): expected " + problem);
    }
  }
  return Status::OK();
}

std::vector<Setting> Settings(const Config& config) {
  std::vector<Setting> settings;
  for (const Variable& var : Table())
    settings.push_back({var.name, var.field.print(config), var.scope == kAgreed});
  return settings;
}

std::string DescribeConfig(const Config& config) {
  std::string out;
  for (const Setting& s : Settings(config)) out += std::string(s.name) + "=" + s.value + "\n";
  return out;
}

}  // namespace perseus
