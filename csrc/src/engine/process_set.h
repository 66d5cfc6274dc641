// A process set: a group of global ranks with its own communicators, negotiator
// and lanes, so that work in one set never waits for another set.
#ifndef PERSEUS_PROCESS_SET_H_
#define PERSEUS_PROCESS_SET_H_

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "engine/autotune.h"
#include "engine/config.h"
#include "lane_api/lane.h"
#include "engine/negotiator.h"
#include "engine/stall_inspector.h"
#include "lane_api/lane_factory.h"

namespace perseus {

// A request to be taken back: its handle, and the error it then fails with, made from
// the global ranks that had not submitted it.
struct WithdrawMark {
  int64_t handle;
  std::function<Status(const std::string& name, const std::vector<int>& missing)> error;
};

struct ProcessSet {
  int id = 0;
  std::vector<int> ranks;  // global ranks, sorted; set rank = index here
  int rank = -1;           // this process's rank in the set, -1 if not a member
  int size() const { return static_cast<int>(ranks.size()); }
  ~ProcessSet();

  // Members only.
  MPI_Comm negotiation_comm = MPI_COMM_NULL;
  MPI_Comm p2p_comm = MPI_COMM_NULL;  // point-to-point messages (engine/point_to_point.h)
  MPI_Comm device_p2p_comm = MPI_COMM_NULL;  // matching those of GPU memory (lanes/device_messages.h)
  std::vector<MPI_Comm> lane_comms;
  std::unique_ptr<Negotiator> negotiator;
  std::unique_ptr<StallInspector> stall;
  std::vector<std::unique_ptr<Lane>> lanes;
  size_t next_lane = 0;
  Knobs knobs;  // what rounds are planned and scheduled with
  std::unique_ptr<AutoTuner> tuner;  // the global set, under PERSEUS_AUTOTUNE; changes knobs
  // GPU batches run on device lanes, made at the set's first GPU batch (the engine's
  // thread, the same point on every member); each has its own MPI communicator,
  // duplicated here at creation because lanes never share one.
  std::vector<MPI_Comm> device_comms;
  std::vector<std::unique_ptr<Lane>> device_lanes;
  size_t next_device_lane = 0;
  BatchDone done;  // what every lane of the set calls when a batch finishes

  // Guarded by the engine mutex.
  // Requests submitted and not yet completed, by name (the stall inspector reads their
  // age and, should a member stop answering, fails them: Engine::LoseRanks).
  std::unordered_map<std::string, EntryPtr> in_flight;
  Hold holds[2];  // knobs' hold of CPU [0] and GPU [1] requests, for front ends that gather
  bool stopped = false;                       // no more rounds: shut down here or by a peer
  Status stop_status;

  // Requests marked for withdrawal (Engine::Withdraw), by name. Guarded by the engine
  // mutex; `withdrawing` says there are some, without it.
  std::map<std::string, WithdrawMark> withdrawals;
  std::atomic<bool> withdrawing{false};

  // Engine-thread scheduling state.
  bool new_work = false;      // submissions since the last round began
  bool progressed = false;    // the last round agreed or failed something
  bool final_round_done = false;
  Clock::time_point round_start, retry_at;
  Clock::duration backoff{};
};

// Builds a set from `comm` (already restricted to the members, or MPI_COMM_NULL
// for a non-member): duplicates the negotiation, point-to-point, lane and device-lane communicators
// and has `lane_factory` make the CPU lanes (`lanes` of them; the knobs say how many
// are used). `world`: the engine's, which carries the stall inspector's messages.
Status OpenProcessSet(int id, std::vector<int> ranks, MPI_Comm comm, MPI_Comm world,
                      const Config& config, int lanes, LaneFactory& lane_factory, BatchDone done,
                      std::shared_ptr<ProcessSet>* out);

}  // namespace perseus

#endif  // PERSEUS_PROCESS_SET_H_
