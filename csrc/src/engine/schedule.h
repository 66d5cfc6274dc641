// When the engine runs a round, and where a batch runs: every scheduling rule of the
// engine in one place. Pure: the engine gathers the facts (clock, pending load, who
// waits) and acts on the answers; nothing here reads a clock, locks or allocates, so
// each rule is tested alone (tests/cpp/schedule_policy_test.cc).
//
// The rules, each a function below:
// 1. Hold (MayHold, HoldUntil). While nobody waits for a result, pending requests
//    are held, so that one round and one fused collective carry many: every round
//    is a meeting of all ranks' engine threads, which costs context switches on
//    cores busy training. A waiter (a driving caller, a thread blocked on a handle,
//    a poll that found a request unfinished), enough bytes or enough time ends it.
//    Front ends that gather before they enqueue (DistributedOptimizer's _gather)
//    read the Hold through perseus_process_set_hold and apply the same rule;
//    tests/unit/test_schedule.py fails if the two disagree.
// 2. Backoff (AfterRound). After a round that agreed nothing, a set whose ranks'
//    pending requests did not match retries after a growing pause; a local
//    submission starts a round at once regardless.
// 3. Cycle time (NextRound). With PERSEUS_CYCLE_TIME the background thread starts a
//    set's rounds at least that far apart; a driving caller does not wait for it.
// 4. Quiet enqueues (QuietBytes, EnqueueWakes). While a set holds, an enqueue that
//    keeps the pending bytes under the hold's does not wake the engine thread (it
//    would only hold them too: a context switch per gradient on a busy core).
// 5. Inline batches (MayRunInline). A batch runs on the thread that runs the round,
//    saving a hop to its lane, when the lane is idle (the lane decides) and the
//    batch is small, or the thread is a driver (which waits for it anyway) and
//    running it there takes no concurrency away.
// 6. Launch rounds (AfterLaunchRound, NextLaunchRound). The rounds that order GPU
//    launches across process sets (engine/launch_order.h) back off as a set's rounds
//    do, alike on every rank; until some set has had GPU work they run only every
//    kRoundsBeforeGpuWork (20 ms). A rank whose GPU batches wait for a grant, that
//    agreed more of them or that is leaving starts the next round at once.
// Rules 4 and 5 apply only while this rank is in a single process set: a request
// for another set must not wait out this set's hold, and blocking in one set's
// collective could wait on a peer that is itself blocked in another set.
#ifndef PERSEUS_ENGINE_SCHEDULE_H_
#define PERSEUS_ENGINE_SCHEDULE_H_

#include <cstdint>

#include "common/batch.h"
#include "common/clock.h"
#include "engine/config.h"

namespace perseus {

// The settings a process set plans and schedules its rounds with (the autotuner
// changes them, engine/autotune.h).
struct Knobs {
  int lanes = 1;                 // lanes in use, of those made at init
  int64_t fusion_threshold = 0;  // bytes per fused buffer
  int64_t hold_bytes = 0;        // while nobody waits, hold until this many bytes are pending
  double hold_time_ms = 0;       // ... or the oldest is this old
  int64_t chunk_bytes = 0;       // bytes per MPI call on large buffers
};

// The configured settings, with `lanes_made` lanes available.
Knobs InitialKnobs(const Config& config, int lanes_made);

// The bytes up to which requests are held while nobody waits (0: not held), for a
// set with GPU requests pending or not: PERSEUS_HOLD_BYTES with auto resolved. By
// default (auto) CPU requests are held up to a whole fused buffer: when training
// takes every core, reducing during backward() only takes cores from it, so a
// backward pass's gradients go best as one round when step() waits for them.
int64_t HoldLimit(const Knobs& knobs, bool gpu);

// How CPU or GPU requests are held: up to `bytes` (0: not held) for at most `ms`.
struct Hold {
  int64_t bytes = 0;
  double ms = 0;
  Hold() = default;
  Hold(const Knobs& knobs, bool gpu)
      : bytes(HoldLimit(knobs, gpu)), ms(bytes ? knobs.hold_time_ms : 0) {}
};

// A set's requests waiting for a round (Negotiator::PendingLoad()).
struct PendingLoad {
  int64_t bytes = 0;
  Clock::time_point oldest = Clock::time_point::max();  // max(): none
  bool gpu = false;  // some pending request is on a GPU
};

// What the engine knows of a set that wants a round, at one step.
struct RoundFacts {
  Clock::time_point now;
  bool stopping = false;       // shutdown was requested: the final round goes at once
  bool driving = false;        // a waiting caller runs this step, not the engine thread
  bool someone_waits = false;  // a thread waits on a handle, or a poll found one unfinished
  bool fresh = false;          // submissions since the set's last round began, or it progressed
  Clock::time_point retry_at;     // the backoff's end (rule 2)
  Clock::time_point round_start;  // when the set's last round began
  PendingLoad pending;  // read only where MayHold(): the engine gathers it only then
};

struct RoundDecision {
  bool due = false;  // start a round now
  // Otherwise: when to look again, and the bytes that may still arrive without
  // waking the engine (0: wake it for every request).
  Clock::time_point wake_at = Clock::time_point::max();
  int64_t headroom = 0;
};

// After a round: how long the set's pause is, and when it may retry.
struct Retry {
  Clock::duration backoff;
  Clock::time_point at;
};

// What the launch order knows at a step when no launch round is in flight (rule 6).
struct LaunchRoundFacts {
  Clock::time_point now;
  bool leaving = false;      // this rank ends the rounds with the next one
  bool waiting = false;      // some GPU batch of this rank waits for a grant
  bool agreed_more = false;  // this rank agreed GPU batches since its last round began
  Clock::time_point retry_at;  // AfterLaunchRound's, for the last round
};

// Rule 6: how often the launch rounds run while no set has had GPU work.
constexpr auto kRoundsBeforeGpuWork = std::chrono::milliseconds(20);

class SchedulePolicy {
 public:
  explicit SchedulePolicy(double cycle_time_ms);

  // Rule 1: whether this step may hold requests at all.
  static bool MayHold(const RoundFacts& facts) {
    return !facts.stopping && !facts.driving && !facts.someone_waits;
  }
  // Rule 1: until when `pending` is held by `hold` (min(): not held), and in
  // *headroom the bytes that may still come before the hold's bytes end it.
  static Clock::time_point HoldUntil(const Hold& hold, const PendingLoad& pending,
                                     int64_t* headroom);
  // Rules 1-3 for a set that wants a round.
  RoundDecision NextRound(const Knobs& knobs, const RoundFacts& facts) const;

  // Rule 2: after a round that `progressed` (agreed or failed something) or not.
  static Retry AfterRound(bool progressed, Clock::duration backoff, Clock::time_point now);

  // Rule 4: after a step, the bytes that may be enqueued without waking the engine
  // thread. `set_headroom`: NextRound's, for the set that ended the step holding (0:
  // none). `news`: requests or a poll arrived during the step (it must look again).
  static int64_t QuietBytes(int64_t set_headroom, bool single_set, bool news, bool stopping);
  // Rule 4: an enqueue of `bytes` spends them from *quiet_bytes; whether it must
  // wake the engine thread.
  static bool EnqueueWakes(int64_t bytes, int64_t* quiet_bytes);

  // Rule 6: after a launch round that `changed` what the sets agreed (the same on every
  // rank) or not, and that showed GPU work in some set or not: the next pause, and
  // when the next round may start (AfterRound's, but not sooner than
  // kRoundsBeforeGpuWork while no set has had GPU work).
  static Retry AfterLaunchRound(bool changed, bool gpu_work_yet, Clock::duration backoff,
                                Clock::time_point now);
  // Rule 6: whether to start the next launch round now; else (due false) when to look
  // again.
  static RoundDecision NextLaunchRound(const LaunchRoundFacts& facts);

  // Rule 5: whether `batch` (`only_batch`: the round's only one) may run on the
  // thread that ran the round, if its lane is idle.
  static bool MayRunInline(const Knobs& knobs, const Batch& batch, bool only_batch, bool driving,
                           bool single_set);

 private:
  const bool cycles_;
  const Clock::duration cycle_;
};

}  // namespace perseus

#endif  // PERSEUS_ENGINE_SCHEDULE_H_
