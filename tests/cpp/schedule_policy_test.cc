// The engine's scheduling policy (csrc/src/engine/schedule.h), one case per rule,
// against values worked out by hand. Run by tests/unit/test_cpp.py; prints
// "ok" or what went wrong.
//
// With the argument "hold-table" it instead reads lines "limit ms bytes age_us" and
// prints, for each, 1 if the core holds `bytes` pending for age_us under Hold{limit,
// ms}, else 0: test_schedule.py compares that with DistributedOptimizer's gathering.
#include <cstdio>
#include <iostream>
#include <string>

#include "engine/schedule.h"
#include "expect.h"

using namespace perseus;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

const Clock::time_point kNow = Clock::time_point(std::chrono::seconds(1000));

Knobs HoldingKnobs(int64_t hold_bytes, double hold_time_ms) {
  Knobs k;
  k.lanes = 1;
  k.fusion_threshold = 64 << 20;
  k.hold_bytes = hold_bytes;
  k.hold_time_ms = hold_time_ms;
  k.chunk_bytes = 4 << 20;
  return k;
}

// A set that wants a round at kNow: new work, nobody waits, the engine thread runs it.
RoundFacts Fresh(int64_t pending_bytes, Clock::duration pending_age) {
  RoundFacts f;
  f.now = kNow;
  f.fresh = true;
  f.retry_at = kNow;
  f.round_start = kNow - milliseconds(100);
  f.pending.bytes = pending_bytes;
  f.pending.oldest = kNow - pending_age;
  return f;
}

Batch BatchOf(int device, int64_t float32s) {
  Batch b;
  BatchItem item;
  item.meta.name = "t";
  item.meta.op_type = PERSEUS_ALLREDUCE;
  item.meta.dtype = PERSEUS_FLOAT32;
  item.meta.device = device;
  item.meta.shape = {float32s};
  b.items.push_back(item);
  return b;
}

void HoldLimits() {
  // Explicit bytes for CPU and GPU alike; auto: the fusion buffer for CPU, 1 MiB for
  // GPU; no bytes or no time: nothing held.
  Expect(HoldLimit(HoldingKnobs(65536, 200), false) == 65536, "explicit hold bytes, CPU");
  Expect(HoldLimit(HoldingKnobs(65536, 200), true) == 65536, "explicit hold bytes, GPU");
  Expect(HoldLimit(HoldingKnobs(kHoldAuto, 200), false) == (64 << 20), "auto CPU: fusion buffer");
  Expect(HoldLimit(HoldingKnobs(kHoldAuto, 200), true) == (1 << 20), "auto GPU: 1 MiB");
  Expect(HoldLimit(HoldingKnobs(0, 200), false) == 0, "hold bytes 0: no hold");
  Expect(HoldLimit(HoldingKnobs(65536, 0), false) == 0, "hold time 0: no hold");
  const Hold none(HoldingKnobs(0, 200), false);
  Expect(none.bytes == 0 && none.ms == 0, "no hold reports 0 ms");
  const Hold cpu(HoldingKnobs(65536, 200), false);
  Expect(cpu.bytes == 65536 && cpu.ms == 200, "hold reports its bytes and ms");
}

void RuleHoldUntilBytesOrTime() {
  const SchedulePolicy policy(0);
  const Knobs knobs = HoldingKnobs(1000, 5);
  RoundDecision d = policy.NextRound(knobs, Fresh(400, milliseconds(2)));
  Expect(!d.due, "under the hold's bytes and time: held");
  Expect(d.wake_at == kNow + milliseconds(3), "held until the oldest is hold_time_ms old");
  Expect(d.headroom == 600, "headroom: the bytes left under the hold");
  Expect(policy.NextRound(knobs, Fresh(1000, milliseconds(2))).due, "the hold's bytes end it");
  Expect(policy.NextRound(knobs, Fresh(400, milliseconds(5))).due, "the hold's time ends it");
  Expect(policy.NextRound(HoldingKnobs(0, 5), Fresh(1, microseconds(1))).due,
         "hold bytes 0: nothing held");
  RoundFacts gpu = Fresh(2 << 20, milliseconds(1));
  gpu.pending.gpu = true;
  Expect(policy.NextRound(HoldingKnobs(kHoldAuto, 5), gpu).due, "auto: 2 MiB of GPU requests go");
  gpu.pending.gpu = false;
  Expect(!policy.NextRound(HoldingKnobs(kHoldAuto, 5), gpu).due, "auto: 2 MiB of CPU requests wait");
}

void RuleWaitersEndTheHold() {
  const SchedulePolicy policy(0);
  const Knobs knobs = HoldingKnobs(1000, 5);
  RoundFacts waits = Fresh(400, milliseconds(2));
  waits.someone_waits = true;
  Expect(!SchedulePolicy::MayHold(waits), "a waiter: no hold");
  Expect(policy.NextRound(knobs, waits).due, "a waiter starts the round");
  RoundFacts driving = Fresh(400, milliseconds(2));
  driving.driving = true;
  Expect(!SchedulePolicy::MayHold(driving), "a driver: no hold");
  Expect(policy.NextRound(knobs, driving).due, "a driver starts the round");
  RoundFacts stopping = Fresh(400, milliseconds(2));
  stopping.stopping = true;
  Expect(policy.NextRound(knobs, stopping).due, "shutdown: the final round at once");
  Expect(SchedulePolicy::MayHold(Fresh(400, milliseconds(2))), "nobody waits: may hold");
}

void RuleBackoff() {
  const SchedulePolicy policy(0);
  const Retry done = SchedulePolicy::AfterRound(true, microseconds(640), kNow);
  Expect(done.backoff == microseconds(20) && done.at == kNow, "progress: retry at once, 20 us");
  const Retry first = SchedulePolicy::AfterRound(false, Clock::duration::zero(), kNow);
  Expect(first.backoff == microseconds(20) && first.at == kNow + microseconds(20),
         "no progress: at least 20 us");
  Expect(SchedulePolicy::AfterRound(false, microseconds(40), kNow).backoff == microseconds(80),
         "no progress again: doubled");
  Expect(SchedulePolicy::AfterRound(false, microseconds(640), kNow).backoff == microseconds(1000),
         "at most 1 ms");
  // Waiting out the backoff, unless new work came.
  RoundFacts stale = Fresh(0, milliseconds(1));
  stale.fresh = false;
  stale.retry_at = kNow + microseconds(80);
  stale.driving = true;  // no hold either way
  RoundDecision d = policy.NextRound(HoldingKnobs(0, 0), stale);
  Expect(!d.due && d.wake_at == kNow + microseconds(80) && d.headroom == 0,
         "no progress, nothing new: wait for retry_at");
  stale.fresh = true;
  Expect(policy.NextRound(HoldingKnobs(0, 0), stale).due, "new work skips the backoff");
}

void RuleCycleTime() {
  const SchedulePolicy cycles(5), none(0);
  RoundFacts f = Fresh(0, milliseconds(1));
  f.round_start = kNow - milliseconds(2);
  const Knobs no_hold = HoldingKnobs(0, 0);
  RoundDecision d = cycles.NextRound(no_hold, f);
  Expect(!d.due && d.wake_at == kNow + milliseconds(3), "cycle time: 5 ms after the last round");
  Expect(none.NextRound(no_hold, f).due, "no cycle time: at once");
  f.driving = true;
  Expect(cycles.NextRound(no_hold, f).due, "a driver does not wait for the cycle");
  f.driving = false;
  f.round_start = kNow - milliseconds(5);
  Expect(cycles.NextRound(no_hold, f).due, "cycle over: at once");
}

void RuleQuietEnqueues() {
  Expect(SchedulePolicy::QuietBytes(600, true, false, false) == 600, "one set holding: quiet");
  Expect(SchedulePolicy::QuietBytes(600, false, false, false) == 0, "several sets: wake always");
  Expect(SchedulePolicy::QuietBytes(600, true, true, false) == 0, "news during the step: wake");
  Expect(SchedulePolicy::QuietBytes(600, true, false, true) == 0, "stopping: wake");
  int64_t quiet = 600;
  Expect(!SchedulePolicy::EnqueueWakes(400, &quiet) && quiet == 200, "under the headroom: no wake");
  Expect(SchedulePolicy::EnqueueWakes(200, &quiet) && quiet == 0, "reaching it: wake");
  quiet = 100;
  Expect(SchedulePolicy::EnqueueWakes(1000, &quiet) && quiet == 0, "beyond it: wake");
  Expect(SchedulePolicy::EnqueueWakes(0, &quiet) && quiet == 0, "nothing held: always wake");
}

void RuleInlineBatches() {
  const int cpu = PERSEUS_CPU_DEVICE, gpu = 0;
  Knobs one_lane = HoldingKnobs(0, 0), two_lanes = one_lane;
  two_lanes.lanes = 2;
  const Batch small = BatchOf(cpu, 64 << 10), large = BatchOf(cpu, (64 << 10) + 1);  // 256 KiB
  Expect(SchedulePolicy::MayRunInline(two_lanes, small, false, false, true), "256 KiB: inline");
  Expect(!SchedulePolicy::MayRunInline(two_lanes, large, false, false, true),
         "over 256 KiB, engine thread: to its lane");
  Expect(!SchedulePolicy::MayRunInline(one_lane, small, true, true, false),
         "several process sets: never inline");
  Expect(SchedulePolicy::MayRunInline(two_lanes, large, true, true, true),
         "a driver runs a round's only batch");
  Expect(SchedulePolicy::MayRunInline(one_lane, large, false, true, true),
         "a driver runs every batch of one CPU lane");
  Expect(!SchedulePolicy::MayRunInline(two_lanes, large, false, true, true),
         "with several lanes a driver leaves large batches to them");
  Expect(!SchedulePolicy::MayRunInline(one_lane, BatchOf(gpu, 1 << 20), false, true, true),
         "GPU batches of several in a round go to their lanes");
}

void RuleLaunchRounds() {
  // After a round: AfterRound's backoff, alike on every rank...
  const Retry changed = SchedulePolicy::AfterLaunchRound(true, true, microseconds(640), kNow);
  Expect(changed.backoff == microseconds(20) && changed.at == kNow, "changed: the next round at once");
  const Retry same = SchedulePolicy::AfterLaunchRound(false, true, microseconds(40), kNow);
  Expect(same.backoff == microseconds(80) && same.at == kNow + microseconds(80),
         "unchanged: the backoff doubles");
  Expect(SchedulePolicy::AfterLaunchRound(false, true, microseconds(640), kNow).backoff == microseconds(1000),
         "unchanged: at most 1 ms");
  // ... but every 20 ms until some set has had GPU work.
  Expect(kRoundsBeforeGpuWork == milliseconds(20), "rounds before GPU work: 20 ms apart");
  const Retry idle = SchedulePolicy::AfterLaunchRound(true, false, microseconds(640), kNow);
  Expect(idle.at == kNow + milliseconds(20) && idle.backoff == microseconds(20),
         "no GPU work yet: 20 ms even after a change");
  Expect(SchedulePolicy::AfterLaunchRound(false, false, microseconds(640), kNow).at == kNow + milliseconds(20),
         "no GPU work yet: 20 ms, not the backoff");

  // The next round: at once for a rank whose batches wait, that agreed more or leaves;
  // else when the pause is over.
  LaunchRoundFacts f;
  f.now = kNow;
  f.retry_at = kNow + microseconds(80);
  RoundDecision d = SchedulePolicy::NextLaunchRound(f);
  Expect(!d.due && d.wake_at == kNow + microseconds(80), "nothing new: wait out the pause");
  LaunchRoundFacts waiting = f;
  waiting.waiting = true;
  Expect(SchedulePolicy::NextLaunchRound(waiting).due, "batches waiting for a grant: at once");
  LaunchRoundFacts more = f;
  more.agreed_more = true;
  Expect(SchedulePolicy::NextLaunchRound(more).due, "more GPU batches agreed: at once");
  LaunchRoundFacts leaving = f;
  leaving.leaving = true;
  Expect(SchedulePolicy::NextLaunchRound(leaving).due, "leaving: at once");
  f.retry_at = kNow;
  Expect(SchedulePolicy::NextLaunchRound(f).due, "the pause is over: at once");
}

int HoldTable() {
  int64_t limit, bytes, age_us;
  double ms;
  while (std::cin >> limit >> ms >> bytes >> age_us) {
    Hold hold;
    hold.bytes = limit;
    hold.ms = ms;
    PendingLoad pending;
    pending.bytes = bytes;
    pending.oldest = kNow;
    int64_t headroom = 0;
    const bool held =
        SchedulePolicy::HoldUntil(hold, pending, &headroom) > kNow + microseconds(age_us);
    std::printf("%d\n", held ? 1 : 0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "hold-table") return HoldTable();
  HoldLimits();
  RuleHoldUntilBytesOrTime();
  RuleWaitersEndTheHold();
  RuleBackoff();
  RuleCycleTime();
  RuleQuietEnqueues();
  RuleInlineBatches();
  RuleLaunchRounds();
  return Verdict();
}
