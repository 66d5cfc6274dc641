// The stall inspector of one process set: notices requests that have waited too long
// for other ranks, and gets every member into one negotiation round that gathers all
// pending names, so each rank can say which ranks are missing which tensor.
//
// Symmetric, no coordinator. A rank whose oldest request has waited past the stall
// time asks for an inspection: it raises a flag in its next round and pings every
// other member (a point-to-point message on the negotiation communicator, which never
// matches the rounds' collectives). A member whose engine is idle (it submitted
// nothing, so it runs no rounds and the asker's round cannot complete) finds the ping
// when it next looks, every probe interval, and joins a round with the flag raised.
// All of it happens only while something is stalled: the steady-state round is unchanged.
#ifndef PERSEUS_STALL_INSPECTOR_H_
#define PERSEUS_STALL_INSPECTOR_H_

#include <mpi.h>

#include <chrono>
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

class StallInspector {
 public:
  StallInspector(const Config& config, MPI_Comm comm, int rank, int size);
  bool enabled() const { return enabled_; }

  // Called on every engine step: whether it is time to look (every probe interval);
  // lowers *wake_at to the next probe time, so an idle engine wakes up to look.
  bool Due(Clock::time_point now, Clock::time_point* wake_at);
  // When Due(): reads peers' pings and checks `oldest`, when this rank's oldest
  // pending request was submitted (Clock::time_point::max() if none). Returns the
  // inspection flags to raise in the next round (0: none).
  int Check(Clock::time_point now, Clock::time_point oldest);

  // After an inspection round: warns about the stalled requests, on the ranks that
  // submitted them and have waited the stall time, at most once per stall time.
  void Warn(int set_id, const std::vector<StalledRequest>& stalled,
            const std::vector<IdleRank>& idle, Clock::time_point now, Clock::time_point oldest);
  // The error every member stops the set with after a stall-shutdown round. Built only
  // from the gathered data, so it is the same text on every rank.
  static Status ShutdownError(int set_id, const std::vector<StalledRequest>& stalled,
                              const std::vector<IdleRank>& idle);

 private:
  int ReceivePings();
  void PingOthers(int flags);

  bool enabled_;
  double warn_s_, shutdown_s_;
  Clock::duration probe_interval_;
  MPI_Comm comm_;
  int rank_, size_;
  Clock::time_point next_probe_, next_ask_, next_warn_;
};

}  // namespace perseus

#endif  // PERSEUS_STALL_INSPECTOR_H_
