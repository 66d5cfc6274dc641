// The engine: one background thread per process that moves submitted requests
// through negotiation into the lanes, plus the process-set table and topology.
// When it runs a round, and where a batch runs, is engine/schedule.h's policy.
//
// Threads:
// - The engine thread (Loop) sleeps on cv_ until requests, a poll (EndHold), a
//   shutdown or the time the last step asked for (wake_at_), then runs one step
//   (Iterate) under step_mu_.
// - A driver: a user thread about to wait (Drive, EnqueueAndDrive). If step_mu_ is
//   free it runs the steps itself until its requests complete (or its time is up,
//   or only lane work is left), so no thread hand-off is on its path; then it wakes
//   the engine thread if work is left. Otherwise it ends any hold and just waits.
// - A thread in a control operation (add_process_set, start_timeline) drives the
//   engine while it waits for the ranks to meet (Meet), and takes step_mu_ to
//   withdraw its meeting request from the global set's negotiator.
// - Other user threads enqueue, poll and query under mu_, and change process sets
//   under control_mu_.
// - Lane threads run batches; a batch may instead run inline on the thread running
//   the step. Completion (Finish, OnBatchDone) takes mu_ to free the names, then
//   completes handles, whose callbacks run on the completing thread: a lane, or one
//   that holds step_mu_.
// - Any thread blocked long in a collective (a lane, or one running a batch inline,
//   step_mu_ held) runs the stall inspector's checks from its wait (Watch), so that a
//   peer that froze in the middle of a collective is still found.
//
// Locks, taken only in this order (a thread holding one takes only later ones):
//   control_mu_ -> step_mu_ -> a set's StallInspector lock -> the MPI lock (LockMpi,
//   serialized MPI only) -> mu_ -> the handle table's lock.
// busy_ and wake_at_ are written by the stepping thread and read without step_mu_,
// by Loop (under mu_) and Drive, to decide how long to sleep.
#ifndef PERSEUS_ENGINE_H_
#define PERSEUS_ENGINE_H_

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/config.h"
#include "engine/handle_table.h"
#include "engine/launch_order.h"
#include "engine/point_to_point.h"
#include "engine/rank_failure.h"
#include "engine/process_set.h"
#include "engine/schedule.h"
#include "lane_api/lane_backend.h"
#include "mpi/node_layout.h"
#include "mpi/runtime_processes.h"
#include "mpi/wait_policy.h"

namespace perseus {

struct Topology {
  int rank = 0, size = 1, local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
  NodeLayout nodes;
};

class Engine {
 public:
  // `world` is the communicator Perseus runs on (already duplicated for us);
  // `backend` makes every lane, does the GPU work of enqueue and takes the launch
  // order's grants.
  static Status Start(const Config& config, MPI_Comm world, bool thread_multiple,
                      LaneBackend backend, HandleTable* handles, std::unique_ptr<Engine>* out);
  ~Engine();

  // Drains agreed work, tells the peers, fails what is left, stops the thread.
  void Shutdown();
  // How this process is ending, for the peers (before Shutdown): "" (the default)
  // for a call of shutdown(), else e.g. "called os._exit(3)"; they warn with it.
  void SetLeavingHow(const std::string& how);

  Status Enqueue(const perseus_request_t* requests, int n, int64_t* handles_out,
                 bool wake_engine = true);
  // Enqueues, then lets the calling thread run the engine until these requests
  // complete (or max_drive_s passes, or only lane work is left). For callers that
  // wait at once: the engine thread stays asleep, so no hand-off is on the path.
  Status EnqueueAndDrive(const perseus_request_t* requests, int n, int64_t* handles_out,
                         double max_drive_s);
  // Runs the engine on the calling thread, as EnqueueAndDrive does, until `handles`
  // complete (same limits). For a caller about to wait on them: the background
  // thread may then poll lazily, since whoever waits spins for the latency.
  // handed_work: the caller enqueued without waking the engine thread.
  void Drive(const int64_t* handles, int n, double max_drive_s, bool handed_work = false);
  // Someone looks for results (a poll that found a request unfinished): the next
  // step starts a round for held requests instead of holding them longer.
  void EndHold();
  // A point-to-point message (perseus_point_to_point): posted at once, matched by MPI,
  // never negotiated (engine/point_to_point.h).
  Status PostPointToPoint(const PointToPointOp& op, int64_t* handle);
  // perseus_withdraw of a point-to-point message's handle; false for any other handle.
  bool WithdrawPointToPoint(int64_t handle, const std::string& why);
  Status AddProcessSet(const int32_t* ranks, int n, int32_t* id_out);
  // Collective, like AddProcessSet: rank 0 opens the timeline file (common/timeline.h)
  // and every rank returns the outcome.
  Status StartTimeline(const std::string& path, bool mark_cycles);
  Status RemoveProcessSet(int id);
  // perseus_withdraw: marks the request of `handle` (if still in flight) to be taken
  // back at a step between rounds, once a round has told who lacks it, unless every
  // member agrees on it first; it then fails with error(those ranks).
  void Withdraw(int64_t handle, std::function<Status(const std::string& name, const std::vector<int>& missing)> error);
  // perseus_process_set_probe.
  Status SetProbeInterval(int id, double interval_s);
  // Copies the set's global ranks and this process's rank in it (-1: not a member).
  Status DescribeProcessSet(int id, std::vector<int>* ranks, int* rank);
  // The set's hold of CPU requests as its knobs stand now (autotuning changes them).
  Status ProcessSetHold(int id, bool gpu, Hold* out);

  const Topology& topology() const { return topo_; }
  int lanes() const { return lanes_; }
  bool thread_multiple() const { return thread_multiple_; }
  const Config& config() const { return config_; }
  // A rank of this world failed (ULFM): the world of the survivors comes from it (the
  // failure may be declared only at the next step, Shutdown's included).
  bool world_failed() const { return rank_failure_.noted(); }
  // After Shutdown of a failed world: its communicator, kept for MPIX_Comm_shrink
  // (the caller frees it). MPI_COMM_NULL otherwise.
  MPI_Comm TakeFailedWorld();
  // (global rank, process id) of every rank on this host, this one included.
  const std::vector<std::pair<int, int>>& node_processes() const { return node_processes_; }
  // Every rank's process as the launcher's runtime names it, in rank order; gathered in
  // a fault-tolerant run only (empty otherwise), for EndExcludedRanks.
  const std::vector<RuntimeProcess>& runtime_processes() const { return runtime_processes_; }
  // The autotuner's AutoTuner::State(); empty when it is off.
  std::string autotune_state();

 private:
  Engine(const Config& config, MPI_Comm world, bool thread_multiple, LaneBackend backend,
         HandleTable* handles);
  Status Init();
  void Loop();
  // One pass of the engine: admit new requests, advance every set. The caller holds
  // step_mu_; `driving`: a waiting caller runs it, not the engine thread. True once
  // a requested shutdown has completed.
  bool Iterate(bool driving);
  Clock::time_point WakeAt() const;
  // One scheduling step for a set; lowers *wake_at when it needs attention sooner.
  void Step(ProcessSet* set, bool stopping, bool driving, Clock::time_point now,
            Clock::time_point* wake_at, bool* busy, int64_t* hold_headroom);
  void StartRound(ProcessSet* set, bool stopping, Clock::time_point now);
  void Apply(ProcessSet* set, RoundOutcome& outcome, Clock::time_point now, bool driving);
  // The next lane for `batch`: MPI lanes for CPU tensors, device lanes (made at the
  // set's first GPU batch) for GPU tensors, each kind round robin.
  Lane& LaneFor(ProcessSet* set, const Batch& batch);
  void StopSet(ProcessSet* set, const Status& status);
  void Finish(int set_id, const EntryPtr& entry, Status status, Result result = Result());
  void OnBatchDone(int set_id, const Batch& batch, const std::vector<Status>& statuses,
                   std::vector<Result>& results);
  void ReportStall(ProcessSet* set, const RoundOutcome& outcome, Clock::time_point now);
  // Members that left (RoundOutcome::shutdown_ranks): warns of each one's end once, and
  // stops the set with an error naming them.
  void ReportLeavers(ProcessSet* set, const std::vector<std::pair<int, std::string>>& leavers);
  // Between rounds: fails the requests marked for withdrawal that the negotiator gives back.
  void TakeWithdrawn(ProcessSet* set);
  // What the stall inspector needs to know of this rank's waits in `set`; the
  // negotiator's part only for the stepping thread.
  SetWaits WaitsOf(ProcessSet* set, bool stepping);
  // Members that stopped answering (global ranks), from any thread: fails every
  // request of the sets they are in, those already on lanes included, and has the next
  // step stop those sets (StopLostSets) with `status`.
  void LoseRanks(const std::vector<int>& lost, const Status& status);
  void StopLostSets();
  // A rank failed (ULFM; engine/rank_failure.h): revokes every communicator, fails
  // every request of every set with the error naming the failed ranks, stops the sets.
  void FailWorld();
  std::vector<std::shared_ptr<ProcessSet>> SetsWithLostRanks();  // under mu_
  // The stall inspector's checks from a thread blocked in a collective (the wait
  // policy's long-wait hook), at most once per probe interval: the thread that runs
  // the engine may be the blocked one.
  static void WatchFromWait(void* engine);
  void Watch();
  // A control operation's first step (add_process_set, start_timeline): every rank
  // must arrive, within the stall check time. Else an error on the ranks that came,
  // "<operation> must be called on every rank: rank(s) [...] did not call it ...;
  // <outcome>". `name`: the meeting's request name, one per operation.
  Status Meet(const char* name, const char* operation, const char* outcome);

  const Config config_;
  MPI_Comm world_;  // control communicator: process-set creation, start_timeline
  MPI_Comm local_comm_ = MPI_COMM_NULL, cross_comm_ = MPI_COMM_NULL;
  const bool thread_multiple_;
  const int lanes_;
  const std::unique_ptr<LaneFactory> lane_factory_;  // makes every set's lanes
  const std::unique_ptr<GpuEnqueue> gpu_;             // the GPU work of Enqueue
  HandleTable* handles_;
  std::unique_ptr<PointToPoint> p2p_;
  std::unique_ptr<DeviceMessages> device_messages_;  // GPU memory's (lane_api/device_messages.h)
  const MessageHandles message_handles_;             // handles_, as device messages use them
  const SchedulePolicy schedule_;
  Topology topo_;

  std::mutex mu_;  // guards everything below, and ProcessSet's guarded fields
  std::condition_variable cv_;
  std::map<int, std::shared_ptr<ProcessSet>> sets_;
  int next_set_id_ = 0;
  int64_t next_group_ = 1;  // the group id of the next enqueue call's grouped requests
  std::vector<EntryPtr> incoming_;
  bool poked_ = false;  // EndHold() was called: the next step holds nothing
  // While the engine holds small requests: bytes that may still arrive without
  // waking it (it would only hold them too). 0 = wake it for every request.
  int64_t hold_headroom_ = 0;
  bool stop_requested_ = false;
  std::string leaving_how_;  // SetLeavingHow()
  bool stopped_ = false;
  std::string autotune_state_;  // for autotune_state(), which user threads call
  std::vector<int> lost_ranks_;  // members that stopped answering (global ranks)
  std::vector<int> node_ranks_;  // the global ranks on this host (local_comm_), sorted
  std::vector<std::pair<int, int>> node_processes_;  // node_processes()
  std::vector<RuntimeProcess> runtime_processes_;     // runtime_processes()
  Status lost_status_;           // the error their sets stop with
  std::mutex step_mu_;      // held by whichever thread runs Iterate()
  bool single_set_ = true;  // under step_mu_: this rank is in one process set
  bool polled_ = false;      // under step_mu_: EndHold() was called before this step
  std::vector<int> leavers_told_;  // under step_mu_: ranks whose end was reported here
  // Left by the last Iterate(): whether work is under way, and when to look again.
  std::atomic<bool> busy_{false};
  std::atomic<Clock::rep> wake_at_{Clock::time_point::max().time_since_epoch().count()};

  // LoseRanks was called: the next step stops the sets of lost ranks.
  std::atomic<bool> lost_pending_{false};
  // Watch(): when it is next due, and how often.
  std::atomic<Clock::rep> watch_at_{0};
  const Clock::duration watch_interval_;
  WaitHook watch_hook_{&Engine::WatchFromWait, this};

  // The order of GPU launches across process sets (launch_order.h): Apply numbers the
  // GPU batches, AddProcessSet makes the rounds, Iterate steps them. Until Shutdown.
  std::unique_ptr<LaunchOrder> launch_order_;
  RankFailure rank_failure_;
  // ULFM and device lanes: an NCCL kernel waiting for a dead peer makes no MPI call
  // that would fail, so while device lanes exist the engine asks ULFM for failed
  // processes (MPIX_Comm_get_failed, a local call) every FailurePollPeriod: often
  // while GPU batches were queued lately (last_device_batch_, the clock's count),
  // rarely after, waking for it (PollFailures, from Iterate; last_failure_poll_ under
  // step_mu_).
  void PollFailures(Clock::time_point now);
  Clock::duration FailurePollPeriod(Clock::time_point now) const;
  std::atomic<bool> poll_failures_{false};
  std::atomic<Clock::rep> last_device_batch_{0};
  Clock::time_point last_failure_poll_;
  std::vector<int> set_ids_;  // under step_mu_: this step's sets, by id (for Step)

  std::mutex control_mu_;  // serialises process-set changes made by user threads
  std::thread thread_;
};

}  // namespace perseus

#endif  // PERSEUS_ENGINE_H_
