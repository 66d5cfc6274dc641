// The autotuner (PERSEUS_AUTOTUNE): during the first training steps the members of
// the global process set try settings of the lanes, fusion threshold, hold and chunk
// size, score each by bytes allreduced per second over whole steps, and keep the best.
//
// No rank leads. Steps are counted from the agreed requests (a name agreed again
// starts a new step), so every member ends a sample in the same round; the members
// then reduce their step times (MAX) in one small allreduce, so every member computes
// the same score and the same next setting from the same numbers, and switches in
// that round. The search is coordinate descent over a small grid, not Horovod's
// Bayesian optimisation: one knob at a time, each of its values for two samples, in
// the order a..z then z..a (so a steady drift in the machine's speed, common on
// shared machines, weighs on every value alike), the best mean kept before the next
// knob, if it beats the value in use by kMinGain (noise alone should not move it).
// Settings the user set explicitly are not tuned.
#ifndef PERSEUS_ENGINE_AUTOTUNE_H_
#define PERSEUS_ENGINE_AUTOTUNE_H_

#include <mpi.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/batch.h"
#include "common/clock.h"
#include "common/status.h"
#include "engine/config.h"
#include "engine/schedule.h"

namespace perseus {

// Whether PERSEUS_AUTOTUNE tunes the knob of `variable` (a name of the table): only
// where the user left it unset, as Horovod's autotuner leaves a knob set explicitly
// alone. So whether such a variable is set, not only its value, must be the same on
// every rank (engine/config_agreement.cc).
bool AutotuneTunes(const Config& config, const char* variable);
// Whether the lane count is tuned (PERSEUS_ALLREDUCE_STREAMS=auto, or autotuning
// with no lane count set); then this many lanes are made, and the tuner picks k.
bool TunesLanes(const Config& config);
constexpr int kAutoMaxLanes = 4;
constexpr double kMinGain = 0.05;

class AutoTuner {
 public:
  // Collective over `comm` (every member of the tuned set): duplicates it for the
  // score exchange. Null *out when there is nothing to tune.
  static Status Open(const Config& config, MPI_Comm comm, int lanes_made,
                     std::unique_ptr<AutoTuner>* out);
  ~AutoTuner();

  bool tuning() const { return tuning_; }
  const Knobs& knobs() const { return current_; }
  // "tuning", or "settled: " and the knobs kept (NAME=value words).
  std::string State() const;

  // Every round's agreed requests, before they are planned; the same round on every
  // member. At the end of a sample: one allreduce with the other members, then
  // knobs() is the next setting to try, or the best one once tuning is over.
  Status OnRound(const std::vector<BatchItem>& agreed, Clock::time_point now);

 private:
  struct Dimension {
    const char* name;
    std::vector<int64_t> values;  // tried in this order
    void (*apply)(Knobs*, int64_t);
    int64_t (*get)(const Knobs&);
  };

  AutoTuner(const Config& config, MPI_Comm comm, int rank, Knobs initial,
            std::vector<Dimension> dimensions);
  // The score of the sample just ended: bytes per second, from every member's
  // slowest time of each step (the median step, so one hiccup does not decide).
  Status AgreeOnScore(double* score);
  void Advance(double score);
  // The value of the current dimension that visit `visit` tries: a..z, then z..a.
  size_t ValueAt(size_t visit) const;
  void Log(const Knobs& knobs, double score);
  void Settle();

  MPI_Comm comm_;
  int rank_;
  std::vector<Dimension> dimensions_;
  int warmup_left_;
  const int steps_per_sample_;
  bool tuning_ = true;
  Knobs current_, best_;  // best_: the values chosen so far (the tuned dimensions')
  size_t dim_ = 0, visit_ = 0;  // the dimension being tuned, and its sample
  std::vector<double> sums_;    // the current dimension's scores, summed per value
  double best_score_ = 0;
  std::ofstream csv_;

  // Step counting, from the agreed allreduces.
  std::unordered_set<std::string> step_names_;  // agreed since the current step began
  bool step_started_ = false;
  Clock::time_point step_start_;
  int64_t step_bytes_ = 0;
  std::vector<double> step_seconds_, step_bytes_done_;  // completed steps of this sample
};

}  // namespace perseus

#endif  // PERSEUS_ENGINE_AUTOTUNE_H_
