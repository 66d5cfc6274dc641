#include "engine/engine.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "common/dtype.h"
#include "common/list_string.h"
#include "common/logging.h"
#include "common/request_rules.h"
#include "common/timeline.h"
#include "engine/fusion.h"
#include "mpi/fault_tolerance.h"
#include "mpi/mpi_lock.h"
#include "mpi/mpi_status.h"
#include "mpi/wait_policy.h"

namespace perseus {

namespace {

// How long a thread waiting for a control operation's meeting drives the engine
// before it sleeps on the handle (as perseus_wait does).
constexpr double kMeetDriveS = 0.5;

// How often PollFailures asks ULFM for failed processes while device lanes exist:
// often while GPU work was queued lately (a kernel may wait for a peer that died),
// rarely once the lanes have been idle a while, so that an idle job does not wake
// ten times a second and a kernel left waiting long after its launch is still found.
constexpr std::chrono::milliseconds kFailurePollBusy(100);
constexpr std::chrono::seconds kFailurePollBusyFor(10);  // after the last GPU batch queued
constexpr std::chrono::seconds kFailurePollIdle(5);

// add_process_set's meeting (Meet): where the global set agrees it, the order of GPU
// launches across sets begins (LaunchOrder::Number).
constexpr const char* kAddSetMeeting = "perseus.add_process_set";

bool AgreesToAddSet(const std::vector<BatchItem>& agreed) {
  for (const BatchItem& item : agreed)
    if (item.meta.anonymous && item.meta.op_type == PERSEUS_BARRIER && item.meta.name == kAddSetMeeting)
      return true;
  return false;
}

int WorldSize(MPI_Comm world) {
  int size = 1;
  MPI_Comm_size(world, &size);
  return size;
}

// Negotiation spans end when the round agrees on the requests.
void TraceAgreed(int set_id, const std::vector<BatchItem>& agreed, Clock::time_point now) {
  for (const BatchItem& item : agreed)
    if (item.entry)
      Timeline::Get().Span(set_id, item.meta.name, NegotiateActivity(item.meta.op_type),
                           item.entry->submitted, now);
}

}  // namespace

Engine::Engine(const Config& config, MPI_Comm world, bool thread_multiple, LaneBackend backend,
               HandleTable* handles)
    : config_(config),
      world_(world),
      thread_multiple_(thread_multiple),
      lanes_(!thread_multiple ? 1 : TunesLanes(config) ? kAutoMaxLanes : config.lanes),
      lane_factory_(std::move(backend.lanes)),
      gpu_(std::move(backend.gpu)),
      handles_(handles),
      p2p_(std::make_unique<PointToPoint>(handles)),
      device_messages_(std::move(backend.messages)),
      message_handles_{[handles] { return handles->Create(); },
                       [handles](int64_t h, const Status& s, Result r) { handles->Complete(h, s, std::move(r)); }},
      schedule_(config.cycle_time_ms),
      watch_interval_(StallInspector::ProbeInterval(config)),
      // One rank, or no MPI_THREAD_MULTIPLE (no GPU batches at all): nothing to order.
      launch_order_(std::make_unique<LaunchOrder>(std::move(backend.launches),
                                                  thread_multiple && WorldSize(world) > 1)),
      rank_failure_(FaultTolerant()) {}

Status Engine::Start(const Config& config, MPI_Comm world, bool thread_multiple,
                     LaneBackend backend, HandleTable* handles, std::unique_ptr<Engine>* out) {
  std::unique_ptr<Engine> engine(new Engine(config, world, thread_multiple, std::move(backend), handles));
  Status status = engine->Init();
  if (!status.ok()) return status;
  *out = std::move(engine);
  return Status::OK();
}

Status Engine::Init() {
  MPI_Comm_rank(world_, &topo_.rank);
  MPI_Comm_size(world_, &topo_.size);
  SetLogRank(topo_.rank);
  Status status = MpiStatus(MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, topo_.rank,
                                                MPI_INFO_NULL, &local_comm_),
                            "MPI_Comm_split_type");
  if (!status.ok()) return status;
  MPI_Comm_rank(local_comm_, &topo_.local_rank);
  MPI_Comm_size(local_comm_, &topo_.local_size);
  node_ranks_.resize(topo_.local_size);
  status = MpiStatus(MPI_Allgather(&topo_.rank, 1, MPI_INT, node_ranks_.data(), 1, MPI_INT,
                                   local_comm_),
                     "MPI_Allgather");
  if (!status.ok()) return status;
  std::sort(node_ranks_.begin(), node_ranks_.end());
  status = FindNodeLayout(world_, node_ranks_[0], topo_.local_size, &topo_.nodes);
  if (!status.ok()) return status;
  // Their processes, in local rank order: a rank declared failed while still alive (a
  // frozen process, ULFM) is ended by a survivor on its host (EndExcludedRanks).
  const int me[2] = {topo_.rank, static_cast<int>(getpid())};
  std::vector<int> pairs(2 * topo_.local_size);
  status = MpiStatus(MPI_Allgather(me, 2, MPI_INT, pairs.data(), 2, MPI_INT, local_comm_),
                     "MPI_Allgather");
  if (!status.ok()) return status;
  for (int i = 0; i < topo_.local_size; ++i) node_processes_.emplace_back(pairs[2 * i], pairs[2 * i + 1]);
  // One that is alone on its host is ended by Open MPI's runtime instead.
  if (rank_failure_.enabled()) runtime_processes_ = GatherRuntimeProcesses(world_);
  status = MpiStatus(MPI_Comm_split(world_, topo_.local_rank, topo_.rank, &cross_comm_),
                     "MPI_Comm_split");
  if (!status.ok()) return status;
  MPI_Comm_rank(cross_comm_, &topo_.cross_rank);
  MPI_Comm_size(cross_comm_, &topo_.cross_size);

  if (!thread_multiple_ && config_.lanes > 1 && topo_.rank == 0) {
    PERSEUS_LOG(kWarning) << "MPI does not provide MPI_THREAD_MULTIPLE: using 1 lane instead of "
                          << config_.lanes;
  }
  CreateMpiOps();

  std::vector<int> everyone(topo_.size);
  for (int r = 0; r < topo_.size; ++r) everyone[r] = r;
  std::shared_ptr<ProcessSet> global;
  status = OpenProcessSet(0, everyone, world_, world_, config_, lanes_, *lane_factory_,
                          [this](const Batch& b, const std::vector<Status>& s,
                                 std::vector<Result>& r) { OnBatchDone(0, b, s, r); },
                          &global);
  if (!status.ok()) return status;
  // Only the global set is tuned: its rounds are the same sequence on every rank, so
  // a switch lands on the same request everywhere. Another set's rounds interleave
  // with them differently on each rank, so it keeps the configured knobs.
  if (config_.autotune || config_.lanes_auto) {
    status = AutoTuner::Open(config_, world_, lanes_, &global->tuner);
    if (!status.ok()) return status;
    if (global->tuner) autotune_state_ = global->tuner->State();
  }
  sets_[0] = std::move(global);
  next_set_id_ = 1;
  // Serialized MPI: a waiting thread holds the MPI lock, the checks could not send.
  if (thread_multiple_ && topo_.size > 1 && StallInspector::Watches(config_))
    SetWaitHook(&watch_hook_);
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "perseus-engine");  // for top -H, perf, gdb
    MpiCallerScope mpi_caller;
    Loop();
  });
  return Status::OK();
}

Engine::~Engine() {
  if (thread_.joinable()) Shutdown();
}

void Engine::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stop_requested_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (rank_failure_.pending()) {  // noted after the last step: revoke before freeing
    std::lock_guard<std::mutex> step(step_mu_);
    FailWorld();
  }
  std::map<int, std::shared_ptr<ProcessSet>> sets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sets.swap(sets_);
    stopped_ = true;
  }
  for (auto& kv : sets)
    if (kv.second->stall) kv.second->stall->Drain();
  p2p_->Close(Status::Error(PERSEUS_SHUT_DOWN, "Perseus was shut down"));
  if (device_messages_) device_messages_->Close(Status::Error(PERSEUS_SHUT_DOWN, "Perseus was shut down"));
  sets.clear();  // lanes finish the batches every rank agreed on, then stop
  SetWaitHook(nullptr);  // no thread of ours waits any more
  handles_->FailAll(Status::Error(PERSEUS_SHUT_DOWN, "Perseus was shut down"));
  launch_order_.reset();  // its rounds' communicator, before MPI may be finalized
  if (cross_comm_ != MPI_COMM_NULL) MPI_Comm_free(&cross_comm_);
  if (local_comm_ != MPI_COMM_NULL) MPI_Comm_free(&local_comm_);
  FreeMpiOps();
  // A failed world's communicator stays for the next init, which shrinks it.
  if (!rank_failure_.declared()) MPI_Comm_free(&world_);
}

MPI_Comm Engine::TakeFailedWorld() {
  MPI_Comm world = MPI_COMM_NULL;
  if (rank_failure_.declared()) std::swap(world, world_);
  return world;
}

Status Engine::Enqueue(const perseus_request_t* requests, int n, int64_t* handles_out,
                       bool wake_engine) {
  std::vector<EntryPtr> entries;
  std::vector<ProcessSet*> targets;
  for (int i = 0; i < n; ++i) {
    // The first GPU request loads CUDA here, outside the engine's lock.
    if (requests[i].device != PERSEUS_CPU_DEVICE) {
      gpu_->WarmGpu();
      break;
    }
  }
  int64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_requested_) return Status::Error(PERSEUS_SHUT_DOWN, "Perseus is shutting down");
    std::set<std::pair<int, std::string>> batch_names;
    ReadyEvents ready;  // GPU: one event per stream for the whole call
    for (int i = 0; i < n; ++i) {
      const perseus_request_t& r = requests[i];
      auto it = sets_.find(r.process_set);
      if (it == sets_.end())
        return Status::Error(PERSEUS_INVALID_ARGUMENT,
                             "unknown process set " + std::to_string(r.process_set));
      ProcessSet* set = it->second.get();
      Status status = CheckMember(topo_.rank, set->rank, set->id);
      if (!status.ok()) return status;
      if (set->stopped) return set->stop_status;
      EntryPtr entry;
      status = MakeEntry(r, set->rank, set->size(), &entry);
      // GPU: an event on the caller's stream, which the device lane will wait for.
      if (status.ok() && entry->meta.device != PERSEUS_CPU_DEVICE)
        status = gpu_->PrepareGpuEntry(entry.get(), &ready);
      if (!status.ok()) return status;
      if (set->in_flight.count(entry->meta.name) ||
          !batch_names.emplace(set->id, entry->meta.name).second)
        return Status::Error(PERSEUS_INVALID_ARGUMENT,
                             "a request named '" + entry->meta.name +
                                 "' is already in flight; wait for it before reusing the name");
      entries.push_back(std::move(entry));
      targets.push_back(set);
    }
    for (int i = 0; i < n; ++i) {
      if (entries[i]->meta.group_size > 0) entries[i]->group = next_group_;
      entries[i]->handle = handles_->Create();
      handles_out[i] = entries[i]->handle;
      targets[i]->in_flight.emplace(entries[i]->meta.name, entries[i]);
      bytes += PayloadBytes(entries[i]->meta);
      incoming_.push_back(std::move(entries[i]));
    }
    ++next_group_;
    // A held engine is not woken for what it would hold anyway; it wakes when its hold ends.
    if (!SchedulePolicy::EnqueueWakes(bytes, &hold_headroom_)) wake_engine = false;
  }
  if (wake_engine) cv_.notify_all();
  return Status::OK();
}

void Engine::Loop() {
  {
    // A first pass schedules the stall inspector's probes, if it is on.
    std::lock_guard<std::mutex> step(step_mu_);
    if (Iterate(false)) return;
  }
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto news = [&] { return !incoming_.empty() || stop_requested_ || poked_; };
      if (!busy_) {
        // Idle: no polling, no cost to the rest of the process. busy_ wakes it too:
        // a driver handing over unfinished work sets it before notifying. Only the
        // stall inspector, when on, wakes it now and then to look for peers' pings.
        Clock::time_point wake_at = WakeAt();
        if (wake_at == Clock::time_point::max()) {
          cv_.wait(lock, [&] { return news() || busy_; });
        } else {
          cv_.wait_until(lock, wake_at, [&] { return news() || busy_; });
        }
      } else {
        Clock::time_point wake_at = WakeAt();
        if (wake_at > Clock::now()) cv_.wait_until(lock, wake_at, news);
      }
    }
    std::lock_guard<std::mutex> step(step_mu_);
    if (Iterate(false)) return;
  }
}

Clock::time_point Engine::WakeAt() const {
  const Clock::time_point at = Clock::time_point(Clock::duration(wake_at_.load()));
  if (!poll_failures_.load(std::memory_order_relaxed)) return at;
  const Clock::time_point now = Clock::now();
  return std::min(at, now + FailurePollPeriod(now));  // PollFailures' next look
}

Clock::duration Engine::FailurePollPeriod(Clock::time_point now) const {
  const Clock::time_point queued = Clock::time_point(Clock::duration(last_device_batch_.load()));
  if (now - queued < kFailurePollBusyFor) return kFailurePollBusy;
  return kFailurePollIdle;
}

void Engine::PollFailures(Clock::time_point now) {
  if (!poll_failures_.load(std::memory_order_relaxed) || rank_failure_.noted() ||
      now - last_failure_poll_ < FailurePollPeriod(now))
    return;
  last_failure_poll_ = now;
  std::vector<int> failed;
  {
    auto mpi = LockMpi();
    failed = FailedRanks(world_);
  }
  if (!failed.empty())
    rank_failure_.Note(Status::Error(PERSEUS_RANK_FAILED,
                                     "ULFM's list of failed processes, asked while GPU lanes run "
                                     "(MPIX_Comm_get_failed: rank(s) " + ListString(failed) + ")"));
}

bool Engine::Iterate(bool driving) {
  std::vector<EntryPtr> arrived;
  std::vector<std::shared_ptr<ProcessSet>> sets;
  bool stopping;
  Clock::time_point now = Clock::now();
  PollFailures(now);
  {
    std::lock_guard<std::mutex> lock(mu_);
    arrived.swap(incoming_);
    // Under mu_: the stall inspector may read it from a thread blocked in a collective.
    for (EntryPtr& entry : arrived) entry->submitted = now;
    polled_ = poked_;
    poked_ = false;
    stopping = stop_requested_;
    set_ids_.clear();
    for (auto& kv : sets_) {
      if (!kv.second->negotiator) continue;
      sets.push_back(kv.second);
      set_ids_.push_back(kv.first);
    }
  }
  for (EntryPtr& entry : arrived) {
    for (auto& set : sets) {
      if (set->id != entry->process_set) continue;
      if (set->stopped) {
        Finish(set->id, entry, set->stop_status);
      } else {
        set->negotiator->Add(entry);
        set->new_work = true;
      }
    }
  }
  Clock::time_point wake_at = Clock::time_point::max();
  bool busy = false, all_stopped = true;
  single_set_ = sets.size() == 1;
  int64_t hold_headroom = 0;
  for (auto& set : sets) {
    Step(set.get(), stopping, driving, now, &wake_at, &busy, &hold_headroom);
    all_stopped = all_stopped && set->stopped;
  }
  const LaunchStep launch = launch_order_->Step(set_ids_, stopping && all_stopped, driving, Clock::now());
  wake_at = std::min(wake_at, launch.wake_at);
  busy = busy || launch.busy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hold_headroom_ = SchedulePolicy::QuietBytes(hold_headroom, single_set_,
                                                !incoming_.empty() || poked_, stopping);
  }
  wake_at_ = wake_at.time_since_epoch().count();
  busy_ = busy;
  return stopping && all_stopped && launch.over;
}

Status Engine::EnqueueAndDrive(const perseus_request_t* requests, int n, int64_t* handles_out,
                               double max_drive_s) {
  Status status = Enqueue(requests, n, handles_out, /*wake_engine=*/false);
  if (!status.ok()) return status;
  Drive(handles_out, n, max_drive_s, /*handed_work=*/true);
  return Status::OK();
}

void Engine::Drive(const int64_t* handles, int n, double max_drive_s, bool handed_work) {
  WaiterScope waiting;
  MpiCallerScope mpi_caller;
  auto all_done = [&] {
    for (int i = 0; i < n; ++i) {
      bool done = false;
      if (handles_->Poll(handles[i], &done).ok() && !done) return false;
    }
    return true;
  };
  const Clock::time_point give_up =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::max(0.0, max_drive_s)));
  std::unique_lock<std::mutex> step(step_mu_, std::try_to_lock);
  if (step.owns_lock()) {
    // This thread is the engine until its requests are done, so none of them waits
    // for a thread hand-off. It stops driving when only lanes have work left.
    while (!all_done() && !Iterate(true) && !all_done() && busy_) {
      Clock::time_point wake_at = std::min(WakeAt(), give_up), now = Clock::now();
      if (now >= give_up) break;
      if (wake_at > now) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_until(lock, wake_at, [&] { return !incoming_.empty() || stop_requested_; });
      }
    }
    step.unlock();
  } else if (!handed_work) {
    // Another thread drives; the caller waits on its handles. The driver may have
    // decided to hold requests before this waiter came: make it look again.
    EndHold();
    return;
  }
  bool leftover;
  {
    std::lock_guard<std::mutex> lock(mu_);
    leftover = busy_ || !incoming_.empty() || stop_requested_;
  }
  if (leftover) cv_.notify_all();  // the background thread takes over from here
}

void Engine::EndHold() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    poked_ = true;
  }
  cv_.notify_all();
}

void Engine::Step(ProcessSet* set, bool stopping, bool driving, Clock::time_point now,
                  Clock::time_point* wake_at, bool* busy, int64_t* hold_headroom) {
  const Clock::duration spin = driving ? WaiterSpin() : kBackgroundSpin;
  *hold_headroom = 0;  // unless this set ends the step holding requests
  if (lost_pending_.load(std::memory_order_acquire)) StopLostSets();
  if (rank_failure_.pending()) FailWorld();
  StallInspector& stall = *set->stall;
  if (set->stopped) {
    // Still answer peers' pings: a rank that gave up on the set is not a frozen one.
    if (stall.Due(now)) stall.Check(now, SetWaits(), false);
    *wake_at = std::min(*wake_at, stall.next_check());
    return;
  }
  Negotiator& negotiator = *set->negotiator;
  if (stall.Due(now)) {
    StallVerdict verdict = stall.Check(now, WaitsOf(set, true), true);
    if (!verdict.lost.empty()) {
      LoseRanks(verdict.lost, verdict.stop);
      StopLostSets();
      return;
    }
    if (!verdict.removed.ok()) {
      StopSet(set, verdict.removed);
      return;
    }
    negotiator.RequestInspection(verdict.inspect_flags);
  }
  *wake_at = std::min(*wake_at, stall.next_check());
  if (negotiator.active()) {
    RoundOutcome outcome;
    Status error;
    if (!negotiator.Test(&outcome, &error)) {
      *busy = true;
      *wake_at = std::min(*wake_at, now + PollGap(now - set->round_start, spin));
      return;
    }
    if (!error.ok()) {
      StopSet(set, error);
      return;
    }
    now = Clock::now();
    Apply(set, outcome, now, driving);
    if (set->stopped) return;
  }
  if (set->withdrawing.load()) TakeWithdrawn(set);
  bool wanted = stopping ? !set->final_round_done : negotiator.WantsRound();
  if (!wanted) return;
  *busy = true;
  RoundFacts facts;
  facts.now = now;
  facts.stopping = stopping;
  facts.driving = driving;
  facts.someone_waits = polled_ || SomeoneWaits();
  facts.fresh = set->new_work || set->progressed;
  facts.retry_at = set->retry_at;
  facts.round_start = set->round_start;
  if (SchedulePolicy::MayHold(facts)) facts.pending = negotiator.PendingLoad();  // O(pending)
  const RoundDecision round = schedule_.NextRound(set->knobs, facts);
  if (!round.due) {
    *wake_at = std::min(*wake_at, round.wake_at);
    *hold_headroom = round.headroom;
    return;
  }
  StartRound(set, stopping, now);
  *wake_at = now;  // test it straight away
}

void Engine::SetLeavingHow(const std::string& how) {
  std::lock_guard<std::mutex> lock(mu_);
  leaving_how_ = how;
}

void Engine::StartRound(ProcessSet* set, bool stopping, Clock::time_point now) {
  std::string how;
  if (stopping) {
    std::lock_guard<std::mutex> lock(mu_);
    how = leaving_how_;
  }
  Status status = set->negotiator->Start(stopping, how);
  if (!status.ok()) {
    StopSet(set, status);
    return;
  }
  if (stopping) set->final_round_done = true;
  if (TimelineOn() && Timeline::Get().mark_cycles()) Timeline::Get().Cycle(set->id, now);
  set->round_start = now;
  set->new_work = false;
}

void Engine::Apply(ProcessSet* set, RoundOutcome& outcome, Clock::time_point now,
                   bool driving) {
  for (auto& failed : outcome.failed) Finish(set->id, failed.first, failed.second);
  for (auto& done : outcome.finished)
    Finish(set->id, done.first, Status::OK(), std::move(done.second));
  if (!outcome.agreed.empty()) {
    if (TimelineOn()) TraceAgreed(set->id, outcome.agreed, now);
    if (set->tuner && set->tuner->tuning()) {
      // Before planning: a new setting applies from this round on, on every member.
      Status status = set->tuner->OnRound(outcome.agreed, now);
      if (!status.ok()) {
        for (BatchItem& item : outcome.agreed)
          if (item.entry) Finish(set->id, item.entry, status);
        StopSet(set, status);
        return;
      }
      set->knobs = set->tuner->knobs();
      std::lock_guard<std::mutex> lock(mu_);
      set->holds[0] = Hold(set->knobs, false);
      set->holds[1] = Hold(set->knobs, true);
      if (!set->tuner->tuning()) autotune_state_ = set->tuner->State();
    }
    const bool begins = set->id == PERSEUS_GLOBAL_PROCESS_SET && AgreesToAddSet(outcome.agreed);
    const Knobs& knobs = set->knobs;
    std::vector<Batch> batches =
        PlanBatches(std::move(outcome.agreed), knobs.fusion_threshold, knobs.chunk_bytes);
    launch_order_->Number(set->id, begins, &batches);
    const bool only_batch = batches.size() == 1;
    for (Batch& batch : batches) {
      batch.agreed = now;
      batch.chunk_bytes = knobs.chunk_bytes;
      Lane& lane = LaneFor(set, batch);
      bool inline_ok = SchedulePolicy::MayRunInline(knobs, batch, only_batch, driving, single_set_);
      // Fault tolerant: a GPU batch never runs on the thread that steps, where an NCCL
      // call blocked on a dead peer (a full queue behind a kernel that waits for it)
      // would keep the step, and so PollFailures, from ever seeing the failure.
      if (rank_failure_.enabled() && batch.items.front().meta.device != PERSEUS_CPU_DEVICE) {
        inline_ok = false;
        last_device_batch_.store(now.time_since_epoch().count());  // see PollFailures
      }
      if (!(inline_ok && lane.TryRunInline(batch))) lane.Push(std::move(batch));
    }
  }
  set->progressed = outcome.progressed;
  const Retry retry = SchedulePolicy::AfterRound(outcome.progressed, set->backoff, now);
  set->backoff = retry.backoff;
  set->retry_at = retry.at;
  if (outcome.inspect_flags) ReportStall(set, outcome, now);
  if (!outcome.shutdown_ranks.empty()) ReportLeavers(set, outcome.shutdown_ranks);
}

void Engine::ReportLeavers(ProcessSet* set, const std::vector<std::pair<int, std::string>>& leavers) {
  std::ostringstream ranks, hows;
  for (size_t i = 0; i < leavers.size(); ++i) {
    const int rank = leavers[i].first;
    const std::string& how = leavers[i].second;
    ranks << (i ? ", " : "") << rank;
    if (how.empty()) continue;
    hows << (hows.tellp() > 0 ? "; " : " (") << "rank " << rank << " " << how;
    // Said at once, once per rank: an exit that is not a clean one usually makes the
    // launcher kill every process within milliseconds, before any error reaches Python.
    if (rank == topo_.rank ||
        std::find(leavers_told_.begin(), leavers_told_.end(), rank) != leavers_told_.end())
      continue;
    leavers_told_.push_back(rank);
    PERSEUS_LOG(kWarning) << "rank " << rank << " " << how
                          << " and has left the job: requests that need it fail";
  }
  if (hows.tellp() > 0) hows << ")";
  if (set->stopped) return;
  StopSet(set, Status::Error(PERSEUS_SHUT_DOWN, "Perseus was shut down on rank(s) [" + ranks.str() + "]" +
                                                    hows.str() + " before this request could complete"));
}

Lane& Engine::LaneFor(ProcessSet* set, const Batch& batch) {
  if (batch.items.front().meta.device == PERSEUS_CPU_DEVICE)
    return *set->lanes[set->next_lane++ % std::min<size_t>(set->knobs.lanes, set->lanes.size())];
  if (set->device_lanes.empty()) {
    if (rank_failure_.enabled()) poll_failures_.store(true);  // see PollFailures
    std::vector<LaneSpec> specs;
    for (size_t i = 0; i < set->device_comms.size(); ++i)
      specs.push_back(LaneSpec{static_cast<int>(i), set->device_comms[i], set->rank, set->size(), &set->ranks,
                               set->done, set->id});
    set->device_lanes = lane_factory_->MakeDeviceLanes(specs);
  }
  return *set->device_lanes[set->next_device_lane++ % set->device_lanes.size()];
}

void Engine::StopSet(ProcessSet* set, const Status& status) {
  if (rank_failure_.Note(status)) cv_.notify_all();  // the next step fails the world
  {
    std::lock_guard<std::mutex> lock(mu_);
    set->stopped = true;
    set->stop_status = status;
  }
  for (EntryPtr& entry : set->negotiator->TakePending()) Finish(set->id, entry, status);
}

void Engine::Finish(int set_id, const EntryPtr& entry, Status status, Result result) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sets_.find(set_id);
    if (it != sets_.end()) it->second->in_flight.erase(entry->meta.name);
  }
  handles_->Complete(entry->handle, std::move(status), std::move(result));
}

void Engine::OnBatchDone(int set_id, const Batch& batch, const std::vector<Status>& statuses,
                         std::vector<Result>& results) {
  {
    // Names are freed before handles complete, so a waiter may reuse a name at once.
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sets_.find(set_id);
    if (it != sets_.end())
      for (const BatchItem& item : batch.items)
        if (item.entry) it->second->in_flight.erase(item.meta.name);
  }
  for (size_t i = 0; i < batch.items.size(); ++i) {
    if (rank_failure_.Note(statuses[i])) cv_.notify_all();  // the next step fails the world
    if (batch.items[i].entry)
      handles_->Complete(batch.items[i].entry->handle, statuses[i], std::move(results[i]));
  }
}

void Engine::ReportStall(ProcessSet* set, const RoundOutcome& outcome, Clock::time_point now) {
  // Every member saw the same gather, so all stop together, with the same error.
  if ((outcome.inspect_flags & kInspectShutdown) && !outcome.stalled.empty()) {
    StopSet(set, StallInspector::ShutdownError(set->id, outcome.stalled, outcome.idle));
    return;
  }
  set->stall->Warn(outcome.stalled, outcome.idle, now, set->negotiator->OldestSubmitted());
}

void Engine::TakeWithdrawn(ProcessSet* set) {
  std::map<std::string, std::string> marked;  // the negotiator's view: names
  std::map<std::string, WithdrawMark> marks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = set->withdrawals.begin(); it != set->withdrawals.end();) {
      auto request = set->in_flight.find(it->first);
      if (request == set->in_flight.end() || request->second->handle != it->second.handle) {
        it = set->withdrawals.erase(it);  // completed meanwhile (the name may be in use again)
      } else {
        marked.emplace(it->first, std::string());
        ++it;
      }
    }
    marks = set->withdrawals;
    set->withdrawing.store(!marked.empty());
  }
  std::vector<Negotiator::Withdrawn> taken;
  set->negotiator->TakeWithdrawn(marked, &taken);
  for (Negotiator::Withdrawn& w : taken)
    Finish(set->id, w.entry, marks.at(w.entry->meta.name).error(w.entry->meta.name, w.missing));
}

void Engine::Withdraw(int64_t handle, std::function<Status(const std::string&, const std::vector<int>&)> error) {
  std::shared_ptr<ProcessSet> marked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& kv : sets_) {
      for (auto& request : kv.second->in_flight) {
        if (request.second->handle != handle) continue;
        kv.second->withdrawals[request.first] = WithdrawMark{handle, error};
        kv.second->withdrawing.store(true);
        marked = kv.second;
      }
    }
  }
  if (!marked || !marked->stall) return;
  // Ask the peers into a round that says who lacks it (so ping them, even if the stall
  // times are off), and wake the engine for it.
  marked->stall->ShortenProbe(StallInspector::ProbeInterval(config_));
  marked->stall->CheckSoon();
  EndHold();
}

Status Engine::PostPointToPoint(const PointToPointOp& op, int64_t* handle) {
  std::shared_ptr<ProcessSet> set;  // keeps its communicator while posting
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_ || stop_requested_) return Status::Error(PERSEUS_SHUT_DOWN, "Perseus was shut down");
    auto it = sets_.find(op.set_id);
    if (it == sets_.end())
      return Status::Error(PERSEUS_INVALID_ARGUMENT, "unknown process set " + std::to_string(op.set_id));
    set = it->second;
    if (set->stopped) return set->stop_status;
  }
  Status status = CheckMember(topo_.rank, set->rank, set->id);
  if (!status.ok()) return status;
  if (op.peer != MPI_ANY_SOURCE && (op.peer < 0 || op.peer >= set->size()))
    return Status::Error(PERSEUS_INVALID_ARGUMENT,
                         std::string(op.recv ? "recv: source" : "send: destination") + " rank " +
                             std::to_string(op.peer) + " is outside the process set's " +
                             std::to_string(set->size()) + " ranks");
  if (set->size() == 1)  // a receive from any rank would wait forever
    return Status::Error(PERSEUS_INVALID_ARGUMENT,
                         std::string(op.recv ? "recv" : "send") +
                             ": the process set has no other rank to exchange messages with");
  if (op.tag < 0)
    return Status::Error(PERSEUS_INVALID_ARGUMENT, "point-to-point tags must be >= 0, got " +
                                                       std::to_string(op.tag));
  if (op.device < 0) return p2p_->Post(op, set->p2p_comm, set->rank, handle);
  if (!device_messages_)
    return Status::Error(PERSEUS_UNSUPPORTED, "point-to-point messages of GPU memory are not supported here");
  MessageRoute route{set->device_p2p_comm, set->rank, set->size()};
  return device_messages_->Post(op, route, message_handles_, handle);
}

bool Engine::WithdrawPointToPoint(int64_t handle, const std::string& why) {
  return p2p_->Withdraw(handle, why) || (device_messages_ && device_messages_->Withdraw(handle, why));
}

Status Engine::SetProbeInterval(int id, double interval_s) {
  std::shared_ptr<ProcessSet> set;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sets_.find(id);
    if (it == sets_.end())
      return Status::Error(PERSEUS_INVALID_ARGUMENT, "unknown process set " + std::to_string(id));
    set = it->second;
  }
  if (!set->stall) return Status::OK();  // not a member
  set->stall->ShortenProbe(std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(interval_s)));
  EndHold();  // the engine thread sleeps until the old probe time: wake it
  return Status::OK();
}

SetWaits Engine::WaitsOf(ProcessSet* set, bool stepping) {
  SetWaits waits;
  waits.withdrawing = set->withdrawing.load();
  if (stepping) waits.oldest_pending = set->negotiator->OldestSubmitted();
  const Clock::time_point ungranted = launch_order_->WaitingSince();
  if (set->id == PERSEUS_GLOBAL_PROCESS_SET && ungranted != Clock::time_point()) {
    ++waits.count;
    waits.oldest = ungranted;
    waits.oldest_name = "(GPU launches waiting for the order across process sets)";
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& kv : set->in_flight) {
    const Entry& entry = *kv.second;
    // Unset until Iterate takes the request in (under mu_): it is not waiting yet.
    if (entry.submitted == Clock::time_point()) continue;
    ++waits.count;
    if (entry.submitted < waits.oldest) {
      waits.oldest = entry.submitted;
      waits.oldest_name = kv.first;
    }
  }
  return waits;
}

std::vector<std::shared_ptr<ProcessSet>> Engine::SetsWithLostRanks() {
  std::vector<std::shared_ptr<ProcessSet>> affected;
  for (auto& kv : sets_) {
    ProcessSet* set = kv.second.get();
    if (!set->negotiator || set->stopped) continue;
    for (int rank : lost_ranks_)
      if (std::binary_search(set->ranks.begin(), set->ranks.end(), rank)) {
        affected.push_back(kv.second);
        break;
      }
  }
  return affected;
}

void Engine::LoseRanks(const std::vector<int>& lost, const Status& status) {
  // Under ULFM a rank that stopped answering is a failed rank when it runs on this host:
  // ended here, it fails as a dead rank does, and the survivors shrink past it (the
  // next step fails the world). One alone on another host is left to the path below.
  if (rank_failure_.enabled() && EndSilentRanksHere(lost, node_processes_)) {
    if (rank_failure_.Note(Status::Error(PERSEUS_RANK_FAILED, status.message))) cv_.notify_all();
    return;
  }
  // Waits on them give up (this thread's too); MPI is not finalized at exit.
  MarkPeerLost(std::any_of(lost.begin(), lost.end(), [this](int rank) {
    return !std::binary_search(node_ranks_.begin(), node_ranks_.end(), rank);
  }), lost);
  std::vector<std::unordered_map<std::string, EntryPtr>> failed;  // released after mu_
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int rank : lost)
      if (std::find(lost_ranks_.begin(), lost_ranks_.end(), rank) == lost_ranks_.end())
        lost_ranks_.push_back(rank);
    if (lost_status_.ok()) lost_status_ = status;
    // Every request of those sets fails now, those in a lane's collective with a lost
    // rank included (no caller may wait for them); the sets stop at the next step.
    for (auto& set : SetsWithLostRanks()) {
      failed.emplace_back();
      failed.back().swap(set->in_flight);
    }
  }
  lost_pending_.store(true, std::memory_order_release);
  for (auto& requests : failed)
    for (auto& kv : requests) handles_->Complete(kv.second->handle, status);
  cv_.notify_all();
}

void Engine::FailWorld() {
  std::vector<MPI_Comm> comms = {world_, local_comm_, cross_comm_};
  std::vector<std::shared_ptr<ProcessSet>> sets;
  std::vector<Lane*> lanes;  // made by the thread that steps, which holds step_mu_ as this one does
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& kv : sets_) {
      sets.push_back(kv.second);
      ProcessSet& set = *kv.second;
      for (auto& lane : set.device_lanes) lanes.push_back(lane.get());
      comms.push_back(set.negotiation_comm);
      comms.push_back(set.p2p_comm);
      comms.push_back(set.device_p2p_comm);
      comms.insert(comms.end(), set.lane_comms.begin(), set.lane_comms.end());
      comms.insert(comms.end(), set.device_comms.begin(), set.device_comms.end());
    }
  }
  const Status error = rank_failure_.Declare(world_, comms);
  launch_order_->GiveUp();  // its rounds would wait for the dead rank
  // Revoking reaches MPI only: the device lanes abort their NCCL communicators, whose
  // kernels (or creation) would wait for the dead rank for good (Lane::Abort), and so
  // do the pairs of GPU messages (DeviceMessages::Abort), whose messages fail.
  for (Lane* lane : lanes) lane->Abort(error);
  if (device_messages_) device_messages_->Abort(error);
  std::vector<std::unordered_map<std::string, EntryPtr>> failed;  // released after mu_
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Every request fails now, those in a lane's collective included.
    for (auto& set : sets) {
      failed.emplace_back();
      failed.back().swap(set->in_flight);
    }
  }
  for (auto& requests : failed)
    for (auto& kv : requests) handles_->Complete(kv.second->handle, error);
  for (auto& set : sets)
    if (set->negotiator && !set->stopped) StopSet(set.get(), error);
}

void Engine::StopLostSets() {
  lost_pending_.store(false);
  std::vector<std::shared_ptr<ProcessSet>> affected;
  Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    affected = SetsWithLostRanks();
    status = lost_status_;
  }
  for (auto& set : affected) StopSet(set.get(), status);
}

void Engine::WatchFromWait(void* engine) { static_cast<Engine*>(engine)->Watch(); }

void Engine::Watch() {
  const Clock::time_point now = Clock::now();
  Clock::rep due = watch_at_.load(std::memory_order_relaxed);
  if (now.time_since_epoch().count() < due) return;
  // One watcher at a time; the others go back to their waits.
  if (!watch_at_.compare_exchange_strong(due, (now + watch_interval_).time_since_epoch().count()))
    return;
  std::vector<std::pair<std::shared_ptr<ProcessSet>, bool>> sets;  // and whether stopped
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& kv : sets_)
      if (kv.second->negotiator) sets.emplace_back(kv.second, kv.second->stopped);
  }
  Clock::time_point next = now + watch_interval_;
  for (auto& [set, stopped] : sets) {
    if (set->stall->Due(now)) {
      // A stopped set only answers pings, as in Step.
      SetWaits waits = stopped ? SetWaits() : WaitsOf(set.get(), false);
      StallVerdict verdict = set->stall->Check(now, waits, false);
      if (!verdict.lost.empty()) LoseRanks(verdict.lost, verdict.stop);
    }
    next = std::min(next, set->stall->next_check());  // its deadlines, not only the probes
  }
  watch_at_.store(next.time_since_epoch().count());
}

Status Engine::AddProcessSet(const int32_t* ranks, int n, int32_t* id_out) {
  std::lock_guard<std::mutex> control(control_mu_);
  MpiCallerScope mpi_caller;
  if (n <= 0) return Status::Error(PERSEUS_INVALID_ARGUMENT, "a process set needs at least one rank");
  std::vector<int> sorted(ranks, ranks + n);
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < n; ++i) {
    if (sorted[i] < 0 || sorted[i] >= topo_.size)
      return Status::Error(PERSEUS_INVALID_ARGUMENT, "process set rank " + std::to_string(sorted[i]) +
                                                         " is outside [0, " +
                                                         std::to_string(topo_.size) + ")");
    if (i > 0 && sorted[i] == sorted[i - 1])
      return Status::Error(PERSEUS_INVALID_ARGUMENT,
                           "process set lists rank " + std::to_string(sorted[i]) + " twice");
  }
  Status met = Meet(kAddSetMeeting, "add_process_set", "no process set was added");
  if (!met.ok()) return met;
  launch_order_->MakeRounds(world_);  // before anything below can fail: every rank that met makes them
  // Every rank must pass the same list: compare with rank 0's.
  auto mpi = LockMpi();
  std::vector<int> reference = sorted;
  int count = n;
  MPI_Bcast(&count, 1, MPI_INT, 0, world_);
  reference.resize(count);
  MPI_Bcast(reference.data(), count, MPI_INT, 0, world_);
  int same = reference == sorted ? 1 : 0, all_same = 0;
  MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_MIN, world_);
  if (!all_same)
    return Status::Error(PERSEUS_INVALID_ARGUMENT,
                         "add_process_set was called with different ranks on different processes");
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& kv : sets_)
      if (kv.second->ranks == sorted)
        return Status::Error(PERSEUS_INVALID_ARGUMENT,
                             "a process set with these ranks already exists (id " +
                                 std::to_string(kv.first) + ")");
  }
  int position = static_cast<int>(std::find(sorted.begin(), sorted.end(), topo_.rank) - sorted.begin());
  bool member = position < n;
  MPI_Comm comm = MPI_COMM_NULL;
  Status status = MpiStatus(
      MPI_Comm_split(world_, member ? 0 : MPI_UNDEFINED, position, &comm), "MPI_Comm_split");
  if (!status.ok()) return status;
  int id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_set_id_++;
  }
  std::shared_ptr<ProcessSet> set;
  status = OpenProcessSet(id, sorted, comm, world_, config_, lanes_, *lane_factory_,
                          [this, id](const Batch& b, const std::vector<Status>& s,
                                     std::vector<Result>& r) { OnBatchDone(id, b, s, r); },
                          &set);
  if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  if (!status.ok()) return status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sets_[id] = std::move(set);
  }
  *id_out = id;
  return Status::OK();
}

// A control operation's MPI calls block until every rank makes them, and cannot be
// given up. So the ranks meet first through the global set's negotiation, which can:
// a barrier request, anonymous so that it is never cached (a cached one could be
// agreed by its bit after this rank withdrew it). One name per operation, so that the
// next call of all ranks meets again after a failed one.
Status Engine::Meet(const char* name, const char* operation, const char* outcome) {
  const double limit_s = config_.MeetingSeconds();
  perseus_request_t request{};
  request.name = name;
  request.op_type = PERSEUS_BARRIER;
  request.device = PERSEUS_CPU_DEVICE;
  request.process_set = PERSEUS_GLOBAL_PROCESS_SET;
  request.anonymous = 1;
  int64_t handle = 0;
  // This thread waits for the meeting, so it ends any hold at once and drives the
  // engine, as a thread waiting on a collective does; else the meeting would sit
  // out the hold (PERSEUS_HOLD_TIME) like a gradient nobody waits for yet.
  WaiterScope waiting;
  Status status = EnqueueAndDrive(&request, 1, &handle, kMeetDriveS);
  if (!status.ok()) return status;
  status = handles_->Wait(handle, limit_s);
  // Not everyone came: withdraw the request, once a round that gathered after this
  // point tells which ranks lack it (the stall inspector gets idle ranks into one).
  if (status.code == PERSEUS_TIMEOUT) {
    const std::string op(operation), then(outcome);
    Withdraw(handle, [op, then, limit_s](const std::string&, const std::vector<int>& missing) {
      std::ostringstream msg;
      msg << op << " must be called on every rank: rank(s) " << ListString(missing)
          << " did not call it within " << limit_s << " s (PERSEUS_STALL_CHECK_TIME_SECONDS); "
          << then;
      return Status::Error(PERSEUS_MISMATCH, msg.str());
    });
    status = handles_->Wait(handle, limit_s);
  }
  // Still pending: no round completes (a member that answers nothing, with the peer
  // timeout off). Take it back now, naming who lacked it at the last gather, if any.
  const Clock::time_point last_try = Clock::now();
  while (status.code == PERSEUS_TIMEOUT) {
    EntryPtr entry;
    std::vector<int> missing;
    {
      std::lock_guard<std::mutex> step(step_mu_);
      std::shared_ptr<ProcessSet> global;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = sets_.find(PERSEUS_GLOBAL_PROCESS_SET);
        if (it != sets_.end()) global = it->second;
      }
      if (global && global->negotiator && !global->stopped) {
        std::vector<int> seen;
        entry = global->negotiator->Withdraw(name, &seen);
        if (entry && seen.empty() && Clock::now() < last_try) {
          global->negotiator->Add(entry);  // not known yet: put it back and look again
          entry = nullptr;
        }
        missing = seen;
      }
    }
    if (entry) {
      std::ostringstream msg;
      msg << operation << " must be called on every rank: rank(s) "
          << (missing.empty() ? std::string("(unknown)") : ListString(missing))
          << " did not call it within " << limit_s
          << " s (PERSEUS_STALL_CHECK_TIME_SECONDS); " << outcome;
      Finish(PERSEUS_GLOBAL_PROCESS_SET, entry, Status::Error(PERSEUS_MISMATCH, msg.str()));
    }
    status = handles_->Wait(handle, 0.02);
  }
  handles_->Release(handle);
  return status;
}

Status Engine::StartTimeline(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> control(control_mu_);
  MpiCallerScope mpi_caller;
  Status status = Meet("perseus.start_timeline", "start_timeline", "no timeline was started");
  if (!status.ok()) return status;
  // Rank 0 writes the file; every rank returns its outcome.
  Status mine = topo_.rank == 0 ? Timeline::Get().Start(path, mark_cycles) : Status::OK();
  auto mpi = LockMpi();
  return AgreeOnStatus(world_, mine);
}

Status Engine::RemoveProcessSet(int id) {
  std::lock_guard<std::mutex> control(control_mu_);
  if (id == PERSEUS_GLOBAL_PROCESS_SET)
    return Status::Error(PERSEUS_INVALID_ARGUMENT, "the global process set cannot be removed");
  std::shared_ptr<ProcessSet> removed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sets_.find(id);
    if (it == sets_.end())
      return Status::Error(PERSEUS_INVALID_ARGUMENT, "unknown process set " + std::to_string(id));
    if (!it->second->in_flight.empty() || p2p_->Busy(id) ||
        (device_messages_ && device_messages_->Busy(id)))
      return Status::Error(PERSEUS_INVALID_ARGUMENT,
                           "process set " + std::to_string(id) + " still has requests in flight");
    removed = std::move(it->second);
    sets_.erase(it);
  }
  if (removed->stall) {
    removed->stall->AnnounceRemoval();
    removed->stall->Drain();
  }
  if (device_messages_) device_messages_->Forget(id);  // before its communicator goes
  return Status::OK();  // freed here or, if the engine still holds it, after its step
}

std::string Engine::autotune_state() {
  std::lock_guard<std::mutex> lock(mu_);
  return autotune_state_;
}

Status Engine::ProcessSetHold(int id, bool gpu, Hold* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end())
    return Status::Error(PERSEUS_INVALID_ARGUMENT, "unknown process set " + std::to_string(id));
  *out = it->second->holds[gpu ? 1 : 0];
  return Status::OK();
}

Status Engine::DescribeProcessSet(int id, std::vector<int>* ranks, int* rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end())
    return Status::Error(PERSEUS_INVALID_ARGUMENT, "unknown process set " + std::to_string(id));
  *ranks = it->second->ranks;
  *rank = it->second->rank;
  return Status::OK();
}

}  // namespace perseus
