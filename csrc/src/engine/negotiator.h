// Symmetric negotiation for one process set: every member runs the same rounds on
// its own communicator, with no coordinator rank.
//
// A round is one MPI_Iallreduce(BAND) of a bit vector: a bit per cached name
// (set when this rank has that request pending with the cached metadata) plus a
// flag word. Only when some rank has something the cache cannot express (a new
// name, changed metadata, an anonymous request, a join or a shutdown) does the
// round go on to gather every rank's pending metadata. All ranks see the same
// results and so agree on the same requests, in the same order.
#ifndef PERSEUS_NEGOTIATOR_H_
#define PERSEUS_NEGOTIATOR_H_

#include <mpi.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/batch.h"
#include "engine/handle_table.h"
#include "engine/response_cache.h"
#include "engine/round_payload.h"
#include "engine/schedule.h"
#include "engine/stall_inspector.h"

namespace perseus {

struct RoundOutcome {
  std::vector<BatchItem> agreed;                           // to execute, in agreed order
  std::vector<std::pair<EntryPtr, Status>> failed;         // local requests ending in error
  std::vector<std::pair<EntryPtr, Result>> finished;       // local requests done without data (join)
  // Global ranks that are leaving (shutdown() or an exit) and how each is ending, as
  // that rank said: "" for a call of shutdown(), else e.g. "called os._exit(3)".
  std::vector<std::pair<int, std::string>> shutdown_ranks;
  // Inspection rounds only (some rank raised stall flags): names not every rank holds.
  std::vector<StalledRequest> stalled;
  std::vector<IdleRank> idle;                              // members with nothing pending
  int inspect_flags = 0;                                   // kInspect* bits raised by any rank
  bool progressed = false;                                 // anything agreed, failed or finished
};

class Negotiator {
 public:
  // carry_payloads: rounds may carry a repeated small allreduce's data
  // (engine/round_payload.h).
  Negotiator(MPI_Comm comm, std::vector<int> global_ranks, int rank, int cache_capacity,
             bool carry_payloads = false);
  ~Negotiator();

  void Add(EntryPtr entry);
  bool HasPending() const { return !pending_.empty(); }
  // Pending requests, or an inspection asked for: this rank should run a round.
  bool WantsRound() const { return !pending_.empty() || inspect_flags_ != 0; }
  // Raises stall-inspection flags (kInspect*) in the next round.
  void RequestInspection(int flags) { inspect_flags_ |= flags; }
  // When the oldest pending request (other than join) was submitted; max() if none.
  Clock::time_point OldestSubmitted() const;
  // Payload bytes of this rank's pending requests, and when the oldest of them came.
  using Load = perseus::PendingLoad;  // what the hold of engine/schedule.h reads
  Load PendingLoad() const;
  bool active() const { return phase_ != Phase::kIdle; }
  std::vector<EntryPtr> TakePending();
  // Takes back this rank's pending anonymous request `name`, when no round that may
  // agree on it is under way (a gather in flight could). *missing: the global ranks
  // the last gather found without it (empty if no gather has seen it yet). Null when
  // it cannot be taken now, or is not pending.
  EntryPtr Withdraw(const std::string& name, std::vector<int>* missing);
  // A request perseus_withdraw marked, taken back, with the global ranks that had not
  // submitted it.
  struct Withdrawn {
    EntryPtr entry;
    std::vector<int> missing;
  };
  // Takes back this rank's pending requests named in `marked` (perseus_withdraw),
  // between rounds only, once the last round gathered and so said who lacks each (else
  // it asks for such a round). Returns how many marked requests it had to leave.
  int TakeWithdrawn(const std::map<std::string, std::string>& marked,
                    std::vector<Withdrawn>* out);

  // Begins a round. `leaving` announces that this rank is shutting down, `how` (sent
  // along) how its process is ending: "" for a call of shutdown().
  Status Start(bool leaving, const std::string& how = std::string());
  // Advances the outstanding round without blocking; true once it has finished.
  bool Test(RoundOutcome* outcome, Status* error);

 private:
  enum class Phase { kIdle, kBits, kSizes, kMetas };
  struct Held {  // one rank's pending request, as seen in the metadata gather
    int rank;
    TensorMeta meta;
    int32_t waited_ms;  // how long that rank has had it pending
  };

  void TakeFastAgreed();
  // Round payloads (engine/round_payload.h): Start lays out the round with the payload
  // of ride_bit_, TakeRidden completes the request it carried if every rank held it,
  // and PlanRide picks the next round's payload from what this round agreed.
  Status StartCarrying(bool holds_rider);
  void TakeRidden(RoundOutcome* out);
  void PlanRide(const RoundOutcome& out);
  Status BeginGather();
  void DecodeGather(RoundOutcome* outcome);
  // False while some member lacks the name (nothing agreed or failed yet).
  bool AgreeNamed(const std::string& name, const std::vector<Held>& holders, RoundOutcome* out);
  void FailCrossOpConflicts(const std::map<std::string, std::vector<Held>>& unagreed,
                            RoundOutcome* out);
  StalledRequest Stalled(const std::string& name, const std::vector<Held>& holders) const;
  void FinishJoinIfComplete(RoundOutcome* out);
  void RejectWhileJoined(RoundOutcome* out);
  EntryPtr TakeLocal(const std::string& name);
  // Fails `entry` and, when ranks disagree on its group's size, its group's other
  // pending members (some ranks never submit them).
  void FailMismatch(const EntryPtr& entry, bool group_differs, const std::string& message,
                    RoundOutcome* out);
  std::string RankList(const std::vector<int>& set_ranks) const;

  MPI_Comm comm_;
  std::vector<int> global_ranks_;
  int rank_, size_;
  ResponseCache cache_;
  std::map<std::string, EntryPtr> pending_;  // by name: sorted, so order is reproducible
  std::string last_added_;                   // the name this rank submitted last (stall reports)
  // This rank's pending names the last gather found missing on other ranks, and where.
  std::map<std::string, std::vector<int>> waiting_for_;
  bool last_round_gathered_ = false;  // waiting_for_ is as of the last round

  Phase phase_ = Phase::kIdle;
  MPI_Request request_ = MPI_REQUEST_NULL;
  uint64_t round_ = 0;
  bool leaving_ = false;
  std::string leaving_how_;
  int inspect_flags_ = 0;  // to raise in the next round
  int round_inspect_ = 0;  // raised by any rank in the current round
  std::vector<uint64_t> bits_send_, bits_recv_;
  int send_size_ = 0;
  std::vector<int> sizes_, displs_;
  std::vector<char> send_bytes_, recv_bytes_;
  std::vector<BatchItem> fast_agreed_;

  // Round payloads, identical on every member but for what this rank put in.
  std::unique_ptr<RoundPayloadOps> payload_ops_;  // null: rounds carry no payload
  int ride_bit_ = -1;           // the cached request the next round carries, or -1
  int alone_bit_ = -1;          // the cached request the last round agreed alone, or -1
  int alone_rounds_ = 0;        // ... in how many rounds in a row
  bool carrying_ = false;       // the round in flight carries ride_bit_'s payload
  EntryPtr rider_;              // this rank's request whose data the round carries
  std::vector<uint64_t> round_send_, round_recv_;
  std::vector<std::pair<EntryPtr, Result>> ridden_;  // completed by the round's payload
  // Join state, identical on every member: who has joined and in which round.
  std::vector<char> joined_;
  std::vector<uint64_t> join_round_;
};

}  // namespace perseus

#endif  // PERSEUS_NEGOTIATOR_H_
