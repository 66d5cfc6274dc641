#include "engine/autotune.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/logging.h"
#include "mpi/mpi_lock.h"
#include "mpi/mpi_status.h"

namespace perseus {

namespace {

constexpr int64_t kKiB = 1 << 10, kMiB = 1 << 20;

// The grid. Each list holds the default, so the default competes with the others.
const std::vector<int64_t> kLaneCounts = {1, 2, 4};
const std::vector<int64_t> kFusionThresholds = {4 * kMiB, 16 * kMiB, 64 * kMiB, 128 * kMiB};
const std::vector<int64_t> kChunkSizes = {1 * kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB};
const std::vector<int64_t> kHoldBytes = {0, 256 * kKiB, 1 * kMiB, 8 * kMiB, kHoldAuto};

std::string Describe(const Knobs& k) {
  return "lanes=" + std::to_string(k.lanes) + " fusion_threshold=" +
         std::to_string(k.fusion_threshold) + " hold_bytes=" + HoldBytesText(k.hold_bytes) +
         " hold_time_ms=" + std::to_string(k.hold_time_ms) +
         " chunk_bytes=" + std::to_string(k.chunk_bytes);
}

// The variables whose knobs the tuner tries (the hold is one knob of two variables).
const char* const kTunedVariables[] = {"PERSEUS_ALLREDUCE_STREAMS", "PERSEUS_FUSION_THRESHOLD",
                                       "PERSEUS_CHUNK_SIZE", "PERSEUS_HOLD_BYTES",
                                       "PERSEUS_HOLD_TIME"};

}  // namespace

bool AutotuneTunes(const Config& config, const char* variable) {
  if (!config.autotune || config.IsSet(variable)) return false;
  for (const char* tuned : kTunedVariables)
    if (std::strcmp(tuned, variable) == 0) return true;
  return false;
}

bool TunesLanes(const Config& config) {
  return config.lanes_auto || AutotuneTunes(config, "PERSEUS_ALLREDUCE_STREAMS");
}

Status AutoTuner::Open(const Config& config, MPI_Comm comm, int lanes_made,
                       std::unique_ptr<AutoTuner>* out) {
  out->reset();
  // Which knobs to tune depends only on agreed settings, so every member builds the
  // same dimensions (or none) and takes part in the same collectives.
  std::vector<Dimension> dims;
  if (TunesLanes(config) && lanes_made > 1) {
    std::vector<int64_t> counts;
    for (int64_t n : kLaneCounts)
      if (n <= lanes_made) counts.push_back(n);
    dims.push_back({"lanes", counts, [](Knobs* k, int64_t v) { k->lanes = static_cast<int>(v); },
                    [](const Knobs& k) { return static_cast<int64_t>(k.lanes); }});
  }
  if (AutotuneTunes(config, "PERSEUS_FUSION_THRESHOLD"))
    dims.push_back({"fusion_threshold", kFusionThresholds,
                    [](Knobs* k, int64_t v) { k->fusion_threshold = v; },
                    [](const Knobs& k) { return k.fusion_threshold; }});
  if (AutotuneTunes(config, "PERSEUS_CHUNK_SIZE"))
    dims.push_back({"chunk_bytes", kChunkSizes, [](Knobs* k, int64_t v) { k->chunk_bytes = v; },
                    [](const Knobs& k) { return k.chunk_bytes; }});
  // The hold is one knob of two variables: its bytes are tried, its time is kept.
  if (AutotuneTunes(config, "PERSEUS_HOLD_BYTES") && AutotuneTunes(config, "PERSEUS_HOLD_TIME") &&
      config.hold_time_ms > 0)
    dims.push_back({"hold_bytes", kHoldBytes, [](Knobs* k, int64_t v) { k->hold_bytes = v; },
                    [](const Knobs& k) { return k.hold_bytes; }});
  if (dims.empty()) return Status::OK();

  MPI_Comm own;
  Status status = MpiStatus(MPI_Comm_dup(comm, &own), "MPI_Comm_dup");
  if (!status.ok()) return status;
  int rank = 0;
  MPI_Comm_rank(own, &rank);
  out->reset(new AutoTuner(config, own, rank, InitialKnobs(config, lanes_made), std::move(dims)));
  return Status::OK();
}

AutoTuner::AutoTuner(const Config& config, MPI_Comm comm, int rank, Knobs initial,
                     std::vector<Dimension> dimensions)
    : comm_(comm),
      rank_(rank),
      dimensions_(std::move(dimensions)),
      warmup_left_(config.autotune_warmup_samples),
      steps_per_sample_(config.autotune_steps_per_sample),
      current_(initial),
      best_(initial) {
  if (rank_ == 0 && !config.autotune_log.empty()) {
    csv_.open(config.autotune_log, std::ios::out | std::ios::trunc);
    if (csv_.good()) {
      csv_ << "lanes,fusion_threshold,hold_bytes,hold_time_ms,chunk_bytes,score\n";
    } else {
      PERSEUS_LOG(kWarning) << "cannot write the autotune log " << config.autotune_log;
    }
  }
  if (warmup_left_ == 0) dimensions_[0].apply(&current_, dimensions_[0].values[ValueAt(0)]);
}

AutoTuner::~AutoTuner() { MPI_Comm_free(&comm_); }

Status AutoTuner::OnRound(const std::vector<BatchItem>& agreed, Clock::time_point now) {
  if (!tuning_) return Status::OK();
  // A name agreed again means the training loop came round: a new step begins.
  bool new_step = false;
  for (const BatchItem& item : agreed)
    if (item.meta.op_type == PERSEUS_ALLREDUCE && step_names_.count(item.meta.name)) new_step = true;
  if (new_step) {
    if (step_started_) {
      step_seconds_.push_back(std::chrono::duration<double>(now - step_start_).count());
      step_bytes_done_.push_back(static_cast<double>(step_bytes_));
    }
    step_started_ = true;
    step_start_ = now;
    step_bytes_ = 0;
    step_names_.clear();
  }
  for (const BatchItem& item : agreed) {
    if (item.meta.op_type != PERSEUS_ALLREDUCE) continue;
    step_names_.insert(item.meta.name);
    step_bytes_ += PayloadBytes(item.meta);
  }
  if (static_cast<int>(step_seconds_.size()) < steps_per_sample_) return Status::OK();
  double score = 0;
  Status status = AgreeOnScore(&score);
  step_seconds_.clear();
  step_bytes_done_.clear();
  if (!status.ok()) return status;
  Advance(score);
  return Status::OK();
}

Status AutoTuner::AgreeOnScore(double* score) {
  // Each step took as long as its slowest member.
  std::vector<double> slowest(step_seconds_.size());
  MPI_Request request;
  {
    auto mpi = LockMpi();
    Status status = MpiStatus(MPI_Iallreduce(step_seconds_.data(), slowest.data(),
                                             static_cast<int>(slowest.size()), MPI_DOUBLE,
                                             MPI_MAX, comm_, &request),
                              "autotune MPI_Iallreduce");
    if (!status.ok()) return status;
  }
  // The members end the sample in the same round, so the wait is short; the lock is
  // let go between tests for a lane of a serialized MPI.
  for (int done = 0; !done;) {
    {
      auto mpi = LockMpi();
      Status status = MpiStatus(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "autotune MPI_Test");
      if (!status.ok()) return status;
    }
    if (!done) std::this_thread::yield();
  }
  std::vector<double> rates(slowest.size());
  for (size_t i = 0; i < rates.size(); ++i)
    rates[i] = step_bytes_done_[i] / std::max(slowest[i], 1e-9);
  std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
  *score = rates[rates.size() / 2];
  return Status::OK();
}

size_t AutoTuner::ValueAt(size_t visit) const {
  const size_t n = dimensions_[dim_].values.size();
  return visit < n ? visit : 2 * n - 1 - visit;
}

void AutoTuner::Advance(double score) {
  const Dimension* dim = &dimensions_[dim_];
  if (warmup_left_ > 0) {
    // Discarded: the first steps pay for allocation and warm caches. Then the first try.
    if (--warmup_left_ == 0) dim->apply(&current_, dim->values[ValueAt(0)]);
    return;
  }
  Log(current_, score);
  PERSEUS_LOG(kDebug) << "autotune sample: " << Describe(current_) << " score=" << score;
  sums_.resize(dim->values.size(), 0.0);
  sums_[ValueAt(visit_)] += score;
  if (++visit_ == 2 * dim->values.size()) {
    // This knob keeps its best value, if clearly better than the one in use; the next
    // knob is tried around it.
    size_t best = std::max_element(sums_.begin(), sums_.end()) - sums_.begin();
    auto in_use = std::find(dim->values.begin(), dim->values.end(), dim->get(best_));
    if (in_use != dim->values.end() &&
        sums_[best] < sums_[in_use - dim->values.begin()] * (1 + kMinGain))
      best = in_use - dim->values.begin();
    dim->apply(&best_, dim->values[best]);
    best_score_ = sums_[best] / 2;
    sums_.clear();
    visit_ = 0;
    if (++dim_ == dimensions_.size()) {
      Settle();
      return;
    }
    dim = &dimensions_[dim_];
  }
  current_ = best_;
  dim->apply(&current_, dim->values[ValueAt(visit_)]);
}

std::string AutoTuner::State() const {
  return tuning_ ? "tuning" : "settled: " + Describe(best_);
}

void AutoTuner::Settle() {
  tuning_ = false;
  current_ = best_;
  Log(best_, best_score_);  // the last line of the log is the setting kept
  csv_.close();
  step_names_.clear();
  PERSEUS_LOG(kInfo) << "autotune settled: " << Describe(best_) << " score=" << best_score_;
}

void AutoTuner::Log(const Knobs& k, double score) {
  if (!csv_.is_open()) return;
  csv_ << k.lanes << ',' << k.fusion_threshold << ',' << HoldBytesText(k.hold_bytes) << ','
       << k.hold_time_ms << ',' << k.chunk_bytes << ',' << score << std::endl;
}

}  // namespace perseus
