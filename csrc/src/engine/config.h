// The one table of environment variables: parsed and validated once, at init().
// Each row of the table (config.cc) owns everything about its variable: name,
// Horovod alias, meaning, parser, how its value prints, and whether every rank
// must use the same value.
#ifndef PERSEUS_CONFIG_H_
#define PERSEUS_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/status.h"

namespace perseus {

// PERSEUS_HOLD_BYTES=auto: CPU requests are held up to the fusion threshold (a whole
// backward pass on busy cores), GPU ones up to kGpuHoldBytes (their reductions should
// overlap backward, on cores that are mostly idle).
constexpr int64_t kHoldAuto = -1;
constexpr int64_t kGpuHoldBytes = 1ll << 20;

struct Config {
  int64_t fusion_threshold = 64ll << 20;  // bytes per fused buffer; 0 disables fusion
  double cycle_time_ms = 0.0;             // extra batching window before a round
  int64_t hold_bytes = kHoldAuto;         // while nobody waits, gather this much before a round
  double hold_time_ms = 200.0;            // ... or until the oldest request is this old
  int lanes = 1;                          // concurrent execution lanes per process set
  bool lanes_auto = false;                // PERSEUS_ALLREDUCE_STREAMS=auto: autotune lanes only
  int64_t chunk_bytes = 4ll << 20;        // a large buffer is reduced in pieces of this size
  int cache_capacity = 1024;              // names agreed by bit vector instead of metadata
  double stall_check_seconds = 60.0;      // warn about requests waiting this long; 0 = off
  double stall_shutdown_seconds = 0.0;    // stop the process set after this long; 0 = off
  double peer_timeout_seconds = 45.0;     // ... or when a member answering no ping held it this long
  bool nan_check = false;                 // look for NaN/Inf in allreduce inputs
  bool gradient_as_bucket_view = true;    // DistributedOptimizer: gradients view bucket buffers
  std::string allreduce_dtype = "none";   // on-the-wire compression of float gradients
  std::string allreduce_mode = "flat";    // flat or hierarchical allreduce
  int64_t ranks_per_node = 0;             // simulated nodes of this many ranks; 0 = real nodes
  std::string timeline_path;              // Chrome-trace file rank 0 writes; empty = off
  bool timeline_mark_cycles = false;      // negotiation rounds as instant events
  bool gpu_use_nccl = true;               // GPU tensors: NCCL, else host-staged through MPI
  std::string cuda_lib;                   // the CUDA runtime (file or folder); empty = search
  std::string nccl_lib;                   // NCCL (file or folder); empty = search
  LogLevel log_level = LogLevel::kWarning;
  bool autotune = false;                  // try settings during the first steps, keep the best
  std::string autotune_log;               // CSV of the samples, written by rank 0; empty = off
  int autotune_warmup_samples = 3;        // samples discarded before scoring starts
  int autotune_steps_per_sample = 10;     // training steps in one scored sample
  int64_t elastic_persist_interval = 1;   // perseusrun --elastic's restart: persist every N-th commit
  std::string elastic_persist_dir;        // ... into this private folder; empty = the cache's
  std::vector<std::string> set_explicitly;  // PERSEUS_* names the environment set (either spelling)

  // Whether the user set the variable `name` (a PERSEUS_* name of the table): the
  // autotuner leaves such settings alone, as Horovod's does.
  bool IsSet(const char* name) const;

  // How long a collective control call (add_process_set, new_group) waits for every
  // rank before it fails naming the absent ones: the stall check time, or 60 s where
  // the check is off, so that such a call never waits forever.
  double MeetingSeconds() const { return stall_check_seconds > 0 ? stall_check_seconds : 60.0; }
};

// Reads every variable of the table from the environment. A bad value is a
// PERSEUS_CONFIG_ERROR naming the variable and what it accepts.
Status LoadConfig(Config* config);

// The spelling under which the variable `name` (a PERSEUS_* name of the table) is
// set: its Horovod alias where only that is set, so messages name what the user set.
const char* ConfigSpelling(const char* name);

// Once per process: a warning for each PERSEUS_*/HOROVOD_* variable in the
// environment that the table does not know but that is within a few edits of a
// name it does ("did you mean ..."); Horovod's own variables that Perseus does not
// implement, and names far from any known one, get a debug-level note only.
void WarnUnknownVariables();

// What init() requires of a variable across ranks (engine/config_agreement.h).
enum class Agreement {
  kNone,      // each rank may use its own value
  kValue,     // every rank must use the same value: it shapes what goes on the wire (or when)
  kPresence,  // every rank sets it or none does; only rank 0 uses its value (the timeline)
};

// A variable's effective value, as text that round-trips (equal text, equal value).
struct Setting {
  const char* name;
  std::string value;
  Agreement agreement;
};
// Every variable of the table, in table order.
std::vector<Setting> Settings(const Config& config);

// A hold_bytes value as the configuration prints it: bytes, or "auto".
std::string HoldBytesText(int64_t hold_bytes);

// "NAME=value" lines of the effective configuration.
std::string DescribeConfig(const Config& config);

}  // namespace perseus

#endif  // PERSEUS_CONFIG_H_
