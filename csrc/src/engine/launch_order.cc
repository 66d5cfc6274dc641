#include "engine/launch_order.h"

#include <algorithm>

#include "common/logging.h"
#include "engine/launch_rounds.h"
#include "engine/schedule.h"
#include "mpi/mpi_lock.h"
#include "mpi/mpi_status.h"
#include "mpi/wait_policy.h"

namespace perseus {

LaunchOrder::LaunchOrder(std::unique_ptr<LaunchPort> port, bool may_order)
    : port_(std::move(port)), may_order_(may_order) {}

LaunchOrder::~LaunchOrder() = default;

void LaunchOrder::Number(int set_id, bool begins, std::vector<Batch>* batches) {
  if (begins && may_order_ && !gated_) {
    gated_ = true;
    Turns& global = turns_[set_id];
    global.granted = global.numbered;  // those launch ungated, first
    port_->Begin(global.numbered);
  }
  Turns* turns = nullptr;
  for (Batch& batch : *batches) {
    if (batch.items.front().meta.device == PERSEUS_CPU_DEVICE) continue;
    if (turns == nullptr) turns = &turns_[set_id];
    // The same place on every member: device lanes launch in this order.
    batch.launch_turn = turns->numbered++;
    batch.launch_gated = gated_;
  }
}

void LaunchOrder::MakeRounds(MPI_Comm world) {
  if (made_.load(std::memory_order_relaxed)) return;  // only this thread stores it
  std::unique_ptr<LaunchRounds> rounds;
  if (may_order_) {
    // Rounds poll while they run: only where some rank could have GPU work.
    int mine = port_->MayUseGpu() ? 1 : 0, anyone = 0;
    MPI_Comm comm = MPI_COMM_NULL;
    auto mpi = LockMpi();
    Status status = MpiStatus(MPI_Allreduce(&mine, &anyone, 1, MPI_INT, MPI_MAX, world), "MPI_Allreduce");
    if (status.ok() && anyone) status = MpiStatus(MPI_Comm_dup(world, &comm), "MPI_Comm_dup");
    if (!status.ok())
      PERSEUS_LOG(kWarning) << "GPU launches of different process sets are not ordered: " << status.message;
    else if (anyone)
      rounds = std::make_unique<LaunchRounds>(comm);
  }
  made_rounds_ = std::move(rounds);
  made_.store(true, std::memory_order_release);  // the stepping thread takes them from here
}

LaunchStep LaunchOrder::Step(const std::vector<int>& sets, bool leaving, bool driving,
                             Clock::time_point now) {
  LaunchStep step;
  if (!taken_ && made_.load(std::memory_order_acquire)) {
    taken_ = true;
    rounds_ = std::move(made_rounds_);
    if (!rounds_) port_->End();  // no rank can use a GPU
  }
  if (rounds_ && !lost_ && (PeerLost() || given_up_.load())) {
    lost_ = true;
    End(/*abandon=*/true);  // its rounds would wait for the lost rank
  } else if (rounds_ && !rounds_->ended()) {
    if (!rounds_->in_flight() || Finish(sets, driving, now, &step)) StartNext(sets, leaving, now, &step);
  }
  step.over = !gated_ || (taken_ && (!rounds_ || rounds_->ended()));
  return step;
}

bool LaunchOrder::Finish(const std::vector<int>& sets, bool driving, Clock::time_point now,
                         LaunchStep* step) {
  NoteWaiting(sets, now);
  std::vector<uint64_t> agreed;
  bool changed = false;
  Status error;
  if (!rounds_->Test(&agreed, &changed, &error)) {
    step->busy = true;
    step->wake_at = now + PollGap(now - round_start_, driving ? WaiterSpin() : kBackgroundSpin);
    return false;
  }
  if (!error.ok()) {
    PERSEUS_LOG(kWarning) << "GPU launches of different process sets are no longer ordered: "
                          << error.message;
    End(/*abandon=*/true);
    return false;
  }
  Grant(sets, agreed);
  // `changed` is the same on every rank, and so is whether any set has had GPU work
  // yet: every rank backs off alike.
  const bool gpu_work_yet = std::any_of(agreed.begin(), agreed.end(), [](uint64_t n) {
    return n != 0 && n != LaunchRounds::kAny;
  });
  const Retry retry = SchedulePolicy::AfterLaunchRound(changed, gpu_work_yet, backoff_, now);
  backoff_ = retry.backoff;
  retry_at_ = retry.at;
  if (rounds_->ended()) {
    End(/*abandon=*/false);  // someone shut down: no round will come
    return false;
  }
  return true;
}

void LaunchOrder::StartNext(const std::vector<int>& sets, bool leaving, Clock::time_point now,
                            LaunchStep* step) {
  std::vector<uint64_t> counts;
  int64_t total = 0;
  for (int id : sets) {
    if (static_cast<size_t>(id) >= counts.size()) counts.resize(id + 1, LaunchRounds::kAny);
    const int64_t numbered = turns_[id].numbered;
    counts[id] = static_cast<uint64_t>(numbered);
    total += numbered;
  }
  LaunchRoundFacts facts;
  facts.now = now;
  facts.waiting = NoteWaiting(sets, now);
  // A rank shutting down leaves once its own batches may launch.
  facts.leaving = leaving && !facts.waiting;
  facts.agreed_more = total != counted_;
  facts.retry_at = retry_at_;
  const RoundDecision next = SchedulePolicy::NextLaunchRound(facts);
  if (!next.due) {
    step->wake_at = std::min(step->wake_at, next.wake_at);
    return;
  }
  Status status = rounds_->Start(counts, facts.leaving);
  if (!status.ok()) {
    PERSEUS_LOG(kWarning) << "GPU launches of different process sets are no longer ordered: "
                          << status.message;
    End(/*abandon=*/true);
    return;
  }
  counted_ = total;
  round_start_ = now;
  step->busy = true;
  step->wake_at = now;  // test it straight away
}

void LaunchOrder::Grant(const std::vector<int>& sets, const std::vector<uint64_t>& agreed) {
  std::vector<LaunchGrant> grants;
  for (int id : sets) {
    if (static_cast<size_t>(id) >= agreed.size() || agreed[id] == LaunchRounds::kAny) continue;
    Turns& turns = turns_[id];
    const int64_t to = std::min<int64_t>(static_cast<int64_t>(agreed[id]), turns.numbered);
    if (to <= turns.granted) continue;
    grants.push_back(LaunchGrant{id, turns.granted, to});
    turns.granted = to;
  }
  port_->Grant(grants);
}

bool LaunchOrder::NoteWaiting(const std::vector<int>& sets, Clock::time_point now) {
  bool waiting = false;
  for (int id : sets) {
    auto it = turns_.find(id);
    waiting = waiting || (it != turns_.end() && it->second.granted < it->second.numbered);
  }
  if (!waiting) waiting_since_.store(0, std::memory_order_relaxed);
  else if (waiting_since_.load(std::memory_order_relaxed) == 0)
    waiting_since_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  return waiting;
}

void LaunchOrder::End(bool abandon) {
  if (abandon) rounds_->Abandon();
  port_->End();  // what waits launches in its own set's order
  waiting_since_.store(0, std::memory_order_relaxed);
}

}  // namespace perseus
