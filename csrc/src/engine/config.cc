#include "engine/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>
#include <vector>

#include "common/logging.h"

extern char** environ;  // the process environment (POSIX)

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

// The table's short names for Agreement (config.h). kAgreed: a different value on
// another rank would change what goes on the wire (or when). kRank0: only rank 0 uses
// the value, but a rank that sets it expects its effect, so it must be set on every
// rank or none (a path per rank is fine).
constexpr Agreement kLocal = Agreement::kNone, kAgreed = Agreement::kValue,
                    kRank0 = Agreement::kPresence;

struct Variable {
  const char* name;
  const char* horovod_name;  // nullptr where Horovod has no such variable
  const char* meaning;
  Agreement agreement;
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

// 1/true/on/yes or 0/false/off/no/empty, in any case; false if neither.
bool ParseSwitch(const std::string& text, bool* on) {
  std::string lower = Lower(text);
  if (lower == "1" || lower == "true" || lower == "on" || lower == "yes") {
    *on = true;
  } else if (lower.empty() || lower == "0" || lower == "false" || lower == "off" ||
             lower == "no") {
    *on = false;
  } else {
    return false;
  }
  return true;
}

Field Flag(bool Config::*field) {
  return {[=](const std::string& text, Config* c) -> std::string {
            if (!ParseSwitch(text, &(c->*field))) return "1/true/on or 0/false/off";
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

// flat or hierarchical; Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE spells them 0 and 1.
Field AllreduceModeField() {
  return {[](const std::string& text, Config* c) -> std::string {
            std::string lower = Lower(text);
            bool on;
            if (lower == "flat" || lower == "hierarchical") {
              c->allreduce_mode = lower;
            } else if (ParseSwitch(text, &on)) {
              c->allreduce_mode = on ? "hierarchical" : "flat";
            } else {
              return "flat or hierarchical (or 1/0, as HOROVOD_HIERARCHICAL_ALLREDUCE)";
            }
            return "";
          },
          [](const Config& c) { return c.allreduce_mode; }};
}

// Bytes, or auto (kHoldAuto).
Field HoldBytesField() {
  Field bytes = IntIn(&Config::hold_bytes, 0, 1ll << 40);
  return {[=](const std::string& text, Config* c) -> std::string {
            if (Lower(text) == "auto") {
              c->hold_bytes = kHoldAuto;
              return "";
            }
            std::string problem = bytes.parse(text, c);
            return problem.empty() ? "" : problem + ", or auto";
          },
          [=](const Config& c) { return HoldBytesText(c.hold_bytes); }};
}

// A lane count, or auto: the autotuner picks how many of the lanes made at init to use.
Field LanesField() {
  Field count = IntIn(&Config::lanes, 1, 64);
  return {[=](const std::string& text, Config* c) -> std::string {
            if (Lower(text) == "auto") {
              c->lanes_auto = true;
              return "";
            }
            std::string problem = count.parse(text, c);
            return problem.empty() ? "" : problem + ", or auto";
          },
          [=](const Config& c) { return c.lanes_auto ? std::string("auto") : count.print(c); }};
}

// A switch of Horovod's that this build accepts only off: on is a clear error rather
// than silently different behaviour.
Field NotImplementedFlag(const char* what) {
  return {[=](const std::string& text, Config*) -> std::string {
            bool on;
            if (!ParseSwitch(text, &on)) return "0/false/off";
            if (on)
              return std::string("0/false/off (") + what + " is not implemented in this build)";
            return "";
          },
          [](const Config&) { return std::string("0"); }};
}

const std::vector<Variable>& Table() {
  static const std::vector<Variable> table = {
      {"PERSEUS_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", "bytes per fused buffer", kAgreed,
       IntIn(&Config::fusion_threshold, 0, 1ll << 40)},
      {"PERSEUS_CYCLE_TIME", "HOROVOD_CYCLE_TIME", "extra batching window, ms", kAgreed,
       NumberIn(&Config::cycle_time_ms, 0, 10000)},
      {"PERSEUS_HOLD_BYTES", nullptr,
       "while no thread waits, start a round only once this many bytes are pending (0 = at once; "
       "auto = the fusion threshold for CPU requests, 1 MiB while a GPU request is pending)",
       kAgreed, HoldBytesField()},
      {"PERSEUS_HOLD_TIME", nullptr,
       "while no thread waits, start a round at the latest when the oldest pending request is "
       "this old, ms (0 = at once)",
       kAgreed, NumberIn(&Config::hold_time_ms, 0, 3.6e6)},
      {"PERSEUS_ALLREDUCE_STREAMS", nullptr, "the number of lanes, for every collective (auto: autotuned)",
       kAgreed, LanesField()},
      {"PERSEUS_CHUNK_SIZE", nullptr, "bytes per MPI call on large buffers", kAgreed,
       IntIn(&Config::chunk_bytes, 4096, 1ll << 30)},
      {"PERSEUS_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY", "names agreed by bit vector", kAgreed,
       IntIn(&Config::cache_capacity, 0, 1 << 16)},
      {"PERSEUS_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_CHECK_TIME_SECONDS",
       "warn about requests waiting this long (0 = off)", kAgreed,
       NumberIn(&Config::stall_check_seconds, 0, 1e6)},
      {"PERSEUS_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
       "fail requests waiting this long on every rank (0 = off)", kAgreed,
       NumberIn(&Config::stall_shutdown_seconds, 0, 1e6)},
      {"PERSEUS_PEER_TIMEOUT_SECONDS", nullptr,
       "fail requests that waited this long on a member that answers no ping (stopped, hung, "
       "its host unreachable), and end the job at exit (0 = off)",
       kAgreed, NumberIn(&Config::peer_timeout_seconds, 0, 1e6)},
      {"PERSEUS_ALLREDUCE_NANCHECK", nullptr, "NaN/Inf check of allreduce inputs", kAgreed,
       Flag(&Config::nan_check)},
      {"PERSEUS_GRADIENT_AS_BUCKET_VIEW", nullptr,
       "DistributedOptimizer: gradients are views into per-bucket buffers reduced in place "
       "(no packing or unpacking in steady state)",
       kAgreed, Flag(&Config::gradient_as_bucket_view)},
      {"PERSEUS_ALLREDUCE_DTYPE", nullptr, "the dtype float32/float64 allreduce buffers travel and are summed in", kAgreed,
       OneOf(&Config::allreduce_dtype, {"none", "fp16", "bf16"}, {})},
      {"PERSEUS_ALLREDUCE_MODE", "HOROVOD_HIERARCHICAL_ALLREDUCE", "flat or hierarchical allreduce",
       kAgreed, AllreduceModeField()},
      {"PERSEUS_HIERARCHICAL_ALLGATHER", "HOROVOD_HIERARCHICAL_ALLGATHER",
       "hierarchical allgather", kAgreed, NotImplementedFlag("hierarchical allgather")},
      {"PERSEUS_RANKS_PER_NODE", nullptr,
       "simulated nodes of this many consecutive ranks for node-scoped features (empty = the "
       "real nodes)",
       kAgreed, OptionalIntIn(&Config::ranks_per_node, 1, 1 << 20)},
      {"PERSEUS_AUTOTUNE", "HOROVOD_AUTOTUNE",
       "try lanes, fusion, hold and chunk settings during the first steps and keep the best",
       kAgreed, Flag(&Config::autotune)},
      {"PERSEUS_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_LOG",
       "CSV file of the autotuner's samples and its choice, written by rank 0", kRank0,
       Text(&Config::autotune_log)},
      {"PERSEUS_AUTOTUNE_WARMUP_SAMPLES", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
       "autotuner samples discarded before scoring", kAgreed,
       IntIn(&Config::autotune_warmup_samples, 0, 1000)},
      {"PERSEUS_AUTOTUNE_STEPS_PER_SAMPLE", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE",
       "training steps per autotuner sample", kAgreed,
       IntIn(&Config::autotune_steps_per_sample, 1, 10000)},
      {"PERSEUS_ELASTIC_PERSIST_INTERVAL", nullptr,
       "perseusrun --elastic without ULFM: hvd.elastic.run persists every N-th commit, "
       "which a restarted job resumes from",
       kAgreed, IntIn(&Config::elastic_persist_interval, 1, 1000000000)},
      {"PERSEUS_ELASTIC_PERSIST_DIR", nullptr,
       "the private folder rank 0 persists commits to (empty = ~/.cache/perseus/elastic)",
       kRank0, Text(&Config::elastic_persist_dir)},
      {"PERSEUS_TIMELINE", "HOROVOD_TIMELINE", "Chrome-trace timeline file written by rank 0",
       kRank0, Text(&Config::timeline_path)},
      {"PERSEUS_TIMELINE_MARK_CYCLES", "HOROVOD_TIMELINE_MARK_CYCLES",
       "mark negotiation rounds in the timeline", kAgreed, Flag(&Config::timeline_mark_cycles)},
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

// Horovod's own variables that Perseus does not implement: its runtime knobs, those
// horovodrun sets in every process, and its build's. Setting one is no typo, so the
// check of unknown names below only notes them at debug level.
const char* const kHorovodOnly[] = {
    "HOROVOD_MPI_THREADS_DISABLE", "HOROVOD_STALL_CHECK_DISABLE",
    "HOROVOD_BATCH_D2D_MEMCOPIES", "HOROVOD_NUM_NCCL_STREAMS",
    "HOROVOD_CPU_OPERATIONS", "HOROVOD_CONTROLLER", "HOROVOD_CCL_CACHE",
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE", "HOROVOD_THREAD_AFFINITY", "HOROVOD_DISABLE_GROUP_FUSION",
    "HOROVOD_DISABLE_NVTX_RANGES", "HOROVOD_ENABLE_ASYNC_COMPLETION",
    "HOROVOD_DYNAMIC_PROCESS_SETS", "HOROVOD_ENABLE_XLA_OPS", "HOROVOD_ELASTIC",
    "HOROVOD_LOG_HIDE_TIME", "HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE",
    "HOROVOD_GPU", "HOROVOD_GPU_ALLREDUCE", "HOROVOD_GPU_ALLGATHER", "HOROVOD_GPU_BROADCAST",
    "HOROVOD_GPU_ALLTOALL", "HOROVOD_GPU_REDUCESCATTER", "HOROVOD_CUDA_HOME",
    "HOROVOD_ROCM_HOME", "HOROVOD_NCCL_HOME", "HOROVOD_NCCL_INCLUDE", "HOROVOD_NCCL_LIB",
    "HOROVOD_NCCL_LINK", "HOROVOD_BUILD_ARCH_FLAGS", "HOROVOD_BUILD_CUDA_CC_LIST",
    "HOROVOD_CMAKE", "HOROVOD_DEBUG", "HOROVOD_MIXED_INSTALL", "HOROVOD_SECRET_KEY",
};
// ... and whole families of them (autotuning's Bayesian-optimisation knobs, Gloo's
// rendezvous, build switches).
const char* const kHorovodOnlyPrefixes[] = {"HOROVOD_AUTOTUNE", "HOROVOD_GLOO_",
                                            "HOROVOD_WITH_", "HOROVOD_WITHOUT_",
                                            "HOROVOD_SPARK_", "HOROVOD_RAY_"};

// An unknown name this close to a known one (edits of one character) is taken for a
// misspelling of it; farther ones are more likely some other tool's variable (the
// build and test scripts read PERSEUS_* names of their own).
constexpr size_t kMaxTypoEdits = 3;

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string Upper(const std::string& text) {
  std::string upper;
  for (char ch : text) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return upper;
}

bool StartsWith(const std::string& text, const char* prefix) {
  return text.compare(0, std::strlen(prefix), prefix) == 0;
}

// The spelling under which `var` is set (its own name wins over the Horovod alias),
// or nullptr when neither is.
const char* SetSpelling(const Variable& var) {
  if (std::getenv(var.name) != nullptr) return var.name;
  if (var.horovod_name != nullptr && std::getenv(var.horovod_name) != nullptr)
    return var.horovod_name;
  return nullptr;
}

}  // namespace

const char* ConfigSpelling(const char* name) {
  for (const Variable& var : Table()) {
    if (std::strcmp(var.name, name) != 0) continue;
    const char* used = SetSpelling(var);
    return used != nullptr ? used : var.name;
  }
  return name;
}

void WarnUnknownVariables() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (char** entry = environ; *entry != nullptr; ++entry) {
      const char* eq = std::strchr(*entry, '=');
      const std::string name(*entry, eq ? eq - *entry : std::strlen(*entry));
      const std::string upper = Upper(name);  // perseus_cycle_time is a misspelling too
      if (!StartsWith(upper, "PERSEUS_") && !StartsWith(upper, "HOROVOD_")) continue;
      bool in_table = false;
      const char* closest = nullptr;  // the nearest name of the table, in any case
      size_t distance = SIZE_MAX;
      for (const Variable& var : Table()) {
        for (const char* known : {var.name, var.horovod_name}) {
          if (known == nullptr) continue;
          in_table |= name == known;
          size_t d = EditDistance(upper, known);
          if (d < distance) distance = d, closest = known;
        }
      }
      if (in_table) continue;
      bool horovod_only = false;
      for (const char* known : kHorovodOnly) horovod_only |= name == known;
      for (const char* prefix : kHorovodOnlyPrefixes) horovod_only |= StartsWith(name, prefix);
      if (horovod_only) {
        PERSEUS_LOG(kDebug) << name << " is a Horovod setting that Perseus does not implement; "
                            << "ignored";
      } else if (distance <= kMaxTypoEdits) {
        PERSEUS_LOG(kWarning) << name << " is not a Perseus setting and is ignored; did you mean "
                              << closest << "?";
      } else {
        PERSEUS_LOG(kDebug) << name << " is not a setting of the Perseus core; ignored";
      }
    }
  });
}

Status LoadConfig(Config* config) {
  *config = Config();
  for (const Variable& var : Table()) {
    const char* used = SetSpelling(var);
    if (used == nullptr) continue;
    const char* raw = std::getenv(used);
    config->set_explicitly.push_back(var.name);
    std::string problem = var.field.parse(raw, config);
    if (!problem.empty()) {
      return Status::Error(PERSEUS_CONFIG_ERROR, std::string(used) + "='" + raw +
                                                     "' is invalid (" + var.meaning +
                                                     "): expected " + problem);
    }
  }
  return Status::OK();
}

bool Config::IsSet(const char* name) const {
  return std::find(set_explicitly.begin(), set_explicitly.end(), name) != set_explicitly.end();
}

std::vector<Setting> Settings(const Config& config) {
  std::vector<Setting> settings;
  for (const Variable& var : Table())
    settings.push_back({var.name, var.field.print(config), var.agreement});
  return settings;
}

std::string DescribeConfig(const Config& config) {
  std::string out;
  for (const Setting& s : Settings(config)) out += std::string(s.name) + "=" + s.value + "\n";
  return out;
}

std::string HoldBytesText(int64_t hold_bytes) {
  return hold_bytes == kHoldAuto ? std::string("auto") : std::to_string(hold_bytes);
}

}  // namespace perseus
