// The stall inspector of one process set: notices requests that have waited too long
// for other ranks and names the members holding them up. Symmetric (no coordinator),
// and all its traffic flows only while a request waits: the steady-state round is
// unchanged.
//
// A rank that withdraws a request (perseus_withdraw, a front end's timeout) asks for
// an inspection too, at once: the round that follows tells who lacks the request,
// which its error then names (Negotiator::TakeWithdrawn).
//
// A member may hold a request up in two ways:
// - It does not submit it (it refused it, skipped it, or is busy elsewhere, even in a
//   long native call), but its engine runs. A rank whose oldest pending request has
//   waited all but two probe intervals of the stall check time asks for an
//   inspection: it raises a flag in its next round and pings every other member. An
//   idle member (whose engine runs no rounds, so the round cannot complete) finds the
//   ping when it next looks, at most a probe interval later, and joins a round with
//   the flag raised. That round gathers every member's pending names, so each rank
//   can say who lacks what; the warning goes out at the check time (later only if the
//   round is late), the stall shutdown is a round every member stops in.
// - It does not answer at all (stopped with SIGSTOP, hung in the kernel, its node
//   gone): no round can complete without it. So while any request of the set waits
//   (negotiating, running on a lane, or joined) for a probe interval, this rank keeps
//   one ping outstanding to each peer, and every engine answers each ping it finds (a
//   pong). A peer that leaves a ping unanswered for the reply bound is named as not
//   responding, in the warning at the check time, and at the shutdown time or the peer
//   timeout (on by default), whichever comes first, this rank stops the set on its
//   own, failing every request in it with an error naming the peer (Engine::LoseRanks).
// Pings and pongs are point-to-point messages on the world communicator tagged with the
// set's id (stall_inspector.cc says why), which never match the rounds' collectives.
//
// Checks run on the thread that steps the engine and, should that thread be blocked
// in a collective (a batch run inline, whose peer froze), on any thread that waits in
// one (Engine::WatchFromWait): so a rank answers pings, and finds a lost peer, even
// then. Hence the inspector's own lock (engine/engine.h gives the lock order).
#ifndef PERSEUS_STALL_INSPECTOR_H_
#define PERSEUS_STALL_INSPECTOR_H_

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "engine/config.h"

namespace perseus {

// What an inspection round asks for (bits, also carried by pings).
constexpr int kInspectWarn = 1;
constexpr int kInspectShutdown = 2;

// A name some members hold and others do not, as seen by an inspection round.
struct StalledRequest {
  std::string name;
  std::vector<int> holders;  // global ranks that submitted it
  std::vector<int> missing;  // global ranks that did not
  bool held_here = false;
};

// A member with nothing pending (other than join) in an inspection round: it has
// stopped submitting, e.g. after refusing a request locally or while busy elsewhere.
struct IdleRank {
  int rank;          // global rank
  std::string last;  // the last name it submitted in this set, "" if none
};

// This rank's waits in the set, as the engine sees them at a check.
struct SetWaits {
  Clock::time_point oldest_pending = Clock::time_point::max();  // negotiating, join aside
  Clock::time_point oldest = Clock::time_point::max();  // any request not completed yet
  std::string oldest_name;                              // that request's name
  size_t count = 0;                                     // requests not completed yet
  bool withdrawing = false;  // a request waits to be withdrawn (perseus_withdraw)
};

// What a check asks of the engine.
struct StallVerdict {
  int inspect_flags = 0;  // kInspect* bits to raise in the next round
  std::vector<int> lost;  // global ranks that stopped answering: stop the set with `stop`
  Status stop;
  Status removed;  // not ok: members removed the set (remove_process_set) while this rank waits
};

class StallInspector {
 public:
  // `world`: the engine's world communicator, in which `global_ranks` are ranks; `rank`:
  // this rank's place among them.
  StallInspector(const Config& config, int set_id, MPI_Comm world, int rank,
                 std::vector<int> global_ranks);
  bool enabled() const { return enabled_; }

  // Whether `config` asks for any watching: a stall time or the peer timeout.
  static bool Watches(const Config& config);
  // How often an engine looks for pings under `config`: a fraction of the shortest
  // of those times.
  static Clock::duration ProbeInterval(const Config& config);

  // Look for peers' messages at least every `interval` (perseus_process_set_probe),
  // and watch even if the configuration asks for nothing.
  void ShortenProbe(Clock::duration interval);
  // Tells every other member that this rank removed the set (remove_process_set), so
  // that one waiting on it says so instead of finding this rank silent.
  void AnnounceRemoval();
  // Receives, unanswered, the peers' messages that have arrived, when the set is
  // removed, so that they do not wait in MPI's queues for the engine's lifetime.
  void Drain();
  // Makes the next Due() true: a request is to be withdrawn.
  void CheckSoon() { next_check_.store(Clock::now().time_since_epoch().count()); }
  // Whether it is time to Check: every probe interval (to answer peers), and at each
  // deadline of this rank's waits. Cheap: the engine asks on every step.
  bool Due(Clock::time_point now) const { return enabled_ && now >= next_check(); }
  // When the engine must look again, idle or not; max() when off.
  Clock::time_point next_check() const {
    return Clock::time_point(Clock::duration(next_check_.load(std::memory_order_relaxed)));
  }
  // Answers peers' pings, pings peers while this rank waits, and decides what to ask
  // for, warn about or stop. `stepping`: the caller runs the engine's step and raises
  // the returned flags. Otherwise the flags that pings asked for are kept for the next
  // stepping check, and waits.oldest_pending (the negotiator's) is not read.
  StallVerdict Check(Clock::time_point now, const SetWaits& waits, bool stepping);

  // After an inspection round: notes who lacks what among the names this rank
  // submitted, and warns when the oldest has waited the stall time (at most once per
  // stall time; else Check warns when it has).
  void Warn(const std::vector<StalledRequest>& stalled, const std::vector<IdleRank>& idle,
            Clock::time_point now, Clock::time_point oldest_pending);
  // The error every member stops the set with after a stall-shutdown round. Built only
  // from the gathered data, so it is the same text on every rank.
  static Status ShutdownError(int set_id, const std::vector<StalledRequest>& stalled,
                              const std::vector<IdleRank>& idle);

 private:
  // Receives the peers' messages that have arrived; answers pings when `answer`.
  // Returns the inspection flags they asked for.
  int ReadMessages(bool answer = true);
  // The inspection flags this rank asks for, its oldest pending request being that old.
  int Asks(Clock::time_point now, const SetWaits& waits);
  // Names the peers that leave pings unanswered: a warning at the check time, a stop at
  // the shutdown time. False when every peer answers.
  bool JudgeSilent(Clock::time_point now, const SetWaits& waits, StallVerdict* verdict);
  void Ping(int flags, Clock::time_point now);
  std::vector<int> Silent(Clock::time_point now, double* longest_s) const;
  void LogFindings(Clock::time_point now, Clock::time_point oldest_pending);
  Clock::time_point NextCheck(Clock::time_point now, const SetWaits& waits) const;

  std::mutex mu_;  // everything below that changes
  bool enabled_;
  int set_id_;
  double warn_s_, shutdown_s_;
  double lost_s_;          // members answering no ping are given up on after this wait; 0: never
  bool lost_by_shutdown_;  // ... at the stall shutdown time (else the peer timeout)
  Clock::duration probe_interval_;  // how often an engine looks for pings
  Clock::duration reply_bound_;     // a ping unanswered this long: the peer is not responding
  Clock::duration ask_lead_;        // inspections are asked for this long before the check time
  MPI_Comm world_;
  int tag_;  // the set's id, as a tag
  int rank_;
  std::vector<int> global_ranks_;
  // Per set rank: when the oldest ping it has not answered went out; max() if none.
  std::vector<Clock::time_point> unanswered_;
  std::atomic<Clock::rep> next_check_;
  Clock::time_point next_ask_, next_warn_, next_withdraw_ask_;
  int deferred_flags_ = 0;  // asked for by pings a non-stepping check read
  std::vector<int> removed_by_;  // global ranks that announced they removed the set
  // The last inspection's description of this rank's stalled names, for the warning
  // at the check time, and the oldest pending request it was gathered for.
  std::string findings_;
  Clock::time_point findings_for_;
};

}  // namespace perseus

#endif  // PERSEUS_STALL_INSPECTOR_H_
