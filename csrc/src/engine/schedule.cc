#include "engine/schedule.h"

#include <algorithm>

namespace perseus {

namespace {

// Rule 2's pause: doubled after each round that agreed nothing, within these bounds.
constexpr auto kMinBackoff = std::chrono::microseconds(20);
constexpr auto kMaxBackoff = std::chrono::microseconds(1000);
// Rule 5: a batch up to this size may run inline whoever runs the round.
constexpr int64_t kInlineBytes = 256 << 10;

Clock::duration Millis(double ms) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
}

}  // namespace

Knobs InitialKnobs(const Config& config, int lanes_made) {
  Knobs k;
  k.lanes = std::max(1, std::min(config.lanes, lanes_made));
  k.fusion_threshold = config.fusion_threshold;
  k.hold_bytes = config.hold_bytes;
  k.hold_time_ms = config.hold_time_ms;
  k.chunk_bytes = config.chunk_bytes;
  return k;
}

int64_t HoldLimit(const Knobs& knobs, bool gpu) {
  if (knobs.hold_bytes == 0 || knobs.hold_time_ms <= 0) return 0;
  if (knobs.hold_bytes != kHoldAuto) return knobs.hold_bytes;
  return gpu ? kGpuHoldBytes : knobs.fusion_threshold;
}

SchedulePolicy::SchedulePolicy(double cycle_time_ms)
    : cycles_(cycle_time_ms > 0), cycle_(Millis(cycle_time_ms)) {}

Clock::time_point SchedulePolicy::HoldUntil(const Hold& hold, const PendingLoad& pending,
                                            int64_t* headroom) {
  if (hold.bytes == 0) return Clock::time_point::min();
  if (pending.bytes >= hold.bytes || pending.oldest == Clock::time_point::max())
    return Clock::time_point::min();
  *headroom = hold.bytes - pending.bytes;
  return pending.oldest + Millis(hold.ms);
}

RoundDecision SchedulePolicy::NextRound(const Knobs& knobs, const RoundFacts& facts) const {
  RoundDecision decision;
  if (facts.stopping) {
    decision.due = true;
    return decision;
  }
  Clock::time_point ready = facts.fresh ? facts.now : facts.retry_at;
  int64_t headroom = 0;
  if (MayHold(facts))
    ready = std::max(ready, HoldUntil(Hold(knobs, facts.pending.gpu), facts.pending, &headroom));
  if (cycles_ && !facts.driving) ready = std::max(ready, facts.round_start + cycle_);
  if (ready <= facts.now) {
    decision.due = true;
    return decision;
  }
  decision.wake_at = ready;
  decision.headroom = headroom;
  return decision;
}

Retry SchedulePolicy::AfterRound(bool progressed, Clock::duration backoff, Clock::time_point now) {
  if (progressed) return {kMinBackoff, now};
  const Clock::duration next =
      std::min<Clock::duration>(kMaxBackoff, std::max<Clock::duration>(kMinBackoff, backoff * 2));
  return {next, now + next};
}

Retry SchedulePolicy::AfterLaunchRound(bool changed, bool gpu_work_yet, Clock::duration backoff,
                                       Clock::time_point now) {
  Retry retry = AfterRound(changed, backoff, now);
  // A CPU job with process sets on a GPU machine pays little; its first GPU batch waits
  // up to this once.
  if (!gpu_work_yet) retry.at = std::max(retry.at, now + kRoundsBeforeGpuWork);
  return retry;
}

RoundDecision SchedulePolicy::NextLaunchRound(const LaunchRoundFacts& facts) {
  RoundDecision decision;
  // The others join a round that one rank starts at once, after their own pause.
  if (facts.leaving || facts.waiting || facts.agreed_more || facts.now >= facts.retry_at) {
    decision.due = true;
    return decision;
  }
  decision.wake_at = facts.retry_at;
  return decision;
}

int64_t SchedulePolicy::QuietBytes(int64_t set_headroom, bool single_set, bool news,
                                   bool stopping) {
  return single_set && !news && !stopping ? set_headroom : 0;
}

bool SchedulePolicy::EnqueueWakes(int64_t bytes, int64_t* quiet_bytes) {
  *quiet_bytes = *quiet_bytes > bytes ? *quiet_bytes - bytes : 0;
  return *quiet_bytes == 0;
}

bool SchedulePolicy::MayRunInline(const Knobs& knobs, const Batch& batch, bool only_batch,
                                  bool driving, bool single_set) {
  if (!single_set) return false;
  // With one CPU lane its batches run one after another wherever they run, so a
  // driver runs them all; with several, only one, so that the others still run
  // concurrently on their lanes.
  const bool cpu = batch.items.front().meta.device == PERSEUS_CPU_DEVICE;
  const bool one_lane = only_batch || (cpu && knobs.lanes == 1);
  return (driving && one_lane) || batch.Bytes() <= kInlineBytes;
}

}  // namespace perseus
