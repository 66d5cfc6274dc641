#include "engine/negotiator.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "common/batch.h"
#include "common/counters.h"
#include "common/dtype.h"
#include "common/list_string.h"
#include "mpi/mpi_lock.h"
#include "mpi/mpi_status.h"

namespace perseus {

namespace {

// Flags travel inverted in word 0 so that the bitwise AND computes their OR.
constexpr uint64_t kNeedsGather = 1;
constexpr uint64_t kLeaving = 2;
constexpr int kInspectShift = 2;  // stall inspection bits (kInspectWarn/Shutdown) follow
// Flags in a rank's gathered message.
constexpr int32_t kMsgJoined = 1;
constexpr int32_t kMsgLeaving = 2;
// The same name submitted as different collectives on different ranks is a mismatch
// once every member has held its request this long: by then no rank is merely late
// with the other collective (a rank that submits both, in another order, has both).
// Judged from the waits in the gather, which every rank sees alike.
constexpr int32_t kConflictMs = 500;
// Requests waiting this long are gathered in full in every round, cached or not, so
// that such a conflict is seen: the cached bits of two different names never meet.
constexpr auto kGatherWhenWaiting = std::chrono::milliseconds(100);

// Agreed: every rank holds it or has joined, and at least one rank holds it.
bool Agreed(const std::vector<uint64_t>& bits, int capacity, int bit) {
  const int words = (capacity + 63) / 64;
  uint64_t agree = bits[1 + bit / 64], nobody_holds = bits[1 + words + bit / 64];
  return ((agree & ~nobody_holds) >> (bit % 64)) & 1u;
}

}  // namespace

Negotiator::Negotiator(MPI_Comm comm, std::vector<int> global_ranks, int rank, int cache_capacity,
                       bool carry_payloads)
    : comm_(comm),
      global_ranks_(std::move(global_ranks)),
      rank_(rank),
      size_(static_cast<int>(global_ranks_.size())),
      cache_(cache_capacity),
      joined_(size_, 0),
      join_round_(size_, 0) {
  if (carry_payloads && size_ > 1) payload_ops_ = std::make_unique<RoundPayloadOps>();
}

Negotiator::~Negotiator() = default;

void Negotiator::Add(EntryPtr entry) {
  last_added_ = entry->meta.name;
  pending_[entry->meta.name] = std::move(entry);
}

std::vector<EntryPtr> Negotiator::TakePending() {
  std::vector<EntryPtr> all;
  for (auto& kv : pending_) all.push_back(kv.second);
  pending_.clear();
  return all;
}

EntryPtr Negotiator::Withdraw(const std::string& name, std::vector<int>* missing) {
  // In the bits phase an anonymous request has no bit, only the gather would carry it.
  if (phase_ == Phase::kSizes || phase_ == Phase::kMetas) return nullptr;
  auto it = pending_.find(name);
  if (it == pending_.end() || !it->second->meta.anonymous) return nullptr;
  auto known = waiting_for_.find(name);
  *missing = known == waiting_for_.end() ? std::vector<int>() : known->second;
  return TakeLocal(name);
}

int Negotiator::TakeWithdrawn(const std::map<std::string, std::string>& marked,
                              std::vector<Withdrawn>* out) {
  if (phase_ != Phase::kIdle) return 1;
  int left = 0;
  for (const auto& mark : marked) {
    auto it = pending_.find(mark.first);
    if (it == pending_.end()) continue;  // agreed (or not taken in) yet: not ours to take
    auto known = waiting_for_.find(mark.first);
    if (!last_round_gathered_ || known == waiting_for_.end()) {
      inspect_flags_ |= kInspectWarn;  // a round that gathers, and so names who lacks it
      ++left;
      continue;
    }
    out->push_back(Withdrawn{it->second, known->second});
    pending_.erase(it);
  }
  return left;
}

Clock::time_point Negotiator::OldestSubmitted() const {
  Clock::time_point oldest = Clock::time_point::max();
  for (const auto& kv : pending_)  // a join legitimately waits for the others' data
    if (kv.second->meta.op_type != PERSEUS_JOIN) oldest = std::min(oldest, kv.second->submitted);
  return oldest;
}

Negotiator::Load Negotiator::PendingLoad() const {
  Load load;
  for (const auto& kv : pending_) {
    load.bytes += PayloadBytes(kv.second->meta);
    load.oldest = std::min(load.oldest, kv.second->submitted);
    load.gpu = load.gpu || kv.second->meta.device != PERSEUS_CPU_DEVICE;
  }
  return load;
}

EntryPtr Negotiator::TakeLocal(const std::string& name) {
  auto it = pending_.find(name);
  if (it == pending_.end()) return nullptr;
  EntryPtr e = it->second;
  pending_.erase(it);
  return e;
}

std::string Negotiator::RankList(const std::vector<int>& set_ranks) const {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < set_ranks.size(); ++i) out << (i ? ", " : "") << global_ranks_[set_ranks[i]];
  out << "]";
  return out.str();
}

Status Negotiator::Start(bool leaving, const std::string& how) {
  // Layout: [flags][agree bits][inverted hold bits]. A rank sets an agree bit when it
  // holds the request or has joined (it adds zeros); the hold bits, inverted so the
  // AND yields their OR, make sure somebody actually submitted it.
  const int capacity = cache_.capacity();
  const int words = (capacity + 63) / 64;
  bits_send_.assign(1 + 2 * words, 0);
  auto set_bit = [&](int section, int bit) {
    bits_send_[1 + section * words + bit / 64] |= uint64_t{1} << (bit % 64);
  };
  bool joined_here = false, needs_gather = leaving;
  const Clock::time_point waited_long = Clock::now() - kGatherWhenWaiting;
  rider_ = nullptr;
  for (const auto& kv : pending_) {
    const TensorMeta& meta = kv.second->meta;
    if (meta.op_type == PERSEUS_JOIN) {
      joined_here = true;
      continue;
    }
    if (kv.second->submitted < waited_long) needs_gather = true;
    int bit = meta.anonymous ? -1 : cache_.Lookup(meta);
    if (bit < 0) {
      needs_gather = true;
    } else {
      set_bit(0, bit);
      set_bit(1, bit);
      if (bit == ride_bit_) rider_ = kv.second;
    }
  }
  if (joined_here) {
    for (int bit = 0; bit < capacity; ++bit)
      if (cache_.InUse(bit)) set_bit(0, bit);
  }
  for (int w = 0; w < words; ++w) bits_send_[1 + words + w] = ~bits_send_[1 + words + w];
  if (joined_here != static_cast<bool>(joined_[rank_])) needs_gather = true;  // announce it
  // An inspection gathers every rank's pending names, which tells who lacks what.
  if (inspect_flags_) needs_gather = true;
  bits_send_[0] = ~((needs_gather ? kNeedsGather : 0) | (leaving ? kLeaving : 0) |
                    (static_cast<uint64_t>(inspect_flags_) << kInspectShift));
  inspect_flags_ = 0;
  bits_recv_.assign(bits_send_.size(), 0);
  leaving_ = leaving;
  leaving_how_ = how;
  Count(kNegotiationRounds);
  if (ride_bit_ >= 0) return StartCarrying(rider_ != nullptr);
  auto mpi = LockMpi();
  int rc = MPI_Iallreduce(bits_send_.data(), bits_recv_.data(), static_cast<int>(bits_send_.size()),
                          MPI_UINT64_T, MPI_BAND, comm_, &request_);
  if (rc != MPI_SUCCESS) return MpiStatus(rc, "negotiation MPI_Iallreduce");
  phase_ = Phase::kBits;
  return Status::OK();
}

Status Negotiator::StartCarrying(bool holds_rider) {
  const TensorMeta& meta = cache_.MetaAt(ride_bit_);
  const int bit_words = static_cast<int>(bits_send_.size());
  const int64_t bytes = PayloadBytes(meta);
  const int words = RoundPayloadOps::Words(bit_words, bytes);
  round_send_.assign(words, 0);
  round_recv_.assign(words, 0);
  RoundPayloadOps::WriteHeader(round_send_.data(), bit_words, bytes, meta.dtype, meta.reduce_op);
  uint64_t* bits = round_send_.data() + RoundPayloadOps::kHeaderWords;
  std::copy(bits_send_.begin(), bits_send_.end(), bits);
  if (holds_rider)
    CopyScaled(meta.dtype, bits + bit_words, rider_->input, meta.NumElements(), meta.prescale);
  carrying_ = true;
  Count(kPayloadRounds);
  auto mpi = LockMpi();
  int rc = MPI_Iallreduce(round_send_.data(), round_recv_.data(), 1, payload_ops_->TypeOf(words),
                          payload_ops_->op(), comm_, &request_);
  if (rc != MPI_SUCCESS) return MpiStatus(rc, "negotiation MPI_Iallreduce (with a payload)");
  phase_ = Phase::kBits;
  return Status::OK();
}

void Negotiator::TakeRidden(RoundOutcome* out) {
  if (!carrying_) return;
  carrying_ = false;
  const uint64_t* payload = round_recv_.data() + RoundPayloadOps::kHeaderWords + bits_recv_.size();
  for (auto it = fast_agreed_.begin(); it != fast_agreed_.end(); ++it) {
    if (!rider_ || it->entry != rider_) continue;
    // Every rank held it (its bit agreed), so the payload is the reduced data.
    const TensorMeta& meta = it->meta;
    const double average = meta.reduce_op == PERSEUS_AVERAGE ? 1.0 / size_ : 1.0;
    CopyScaled(meta.dtype, rider_->output, payload, meta.NumElements(), meta.postscale * average);
    out->finished.emplace_back(rider_, Result());
    Count(kRiddenRequests);
    fast_agreed_.erase(it);
    break;
  }
  rider_ = nullptr;
}

void Negotiator::PlanRide(const RoundOutcome& out) {
  ride_bit_ = -1;
  if (!payload_ops_) return;
  bool joined = false;
  for (char j : joined_) joined = joined || j;
  const TensorMeta* alone = nullptr;
  size_t agreed = out.agreed.size();
  for (const auto& done : out.finished) agreed += done.first->meta.op_type == PERSEUS_JOIN ? 0 : 1;
  if (agreed == 1)
    alone = out.agreed.empty() ? &out.finished.front().first->meta : &out.agreed.front().meta;
  const int bit = alone && !joined && MayRideInRound(*alone) ? cache_.Lookup(*alone) : -1;
  alone_rounds_ = bit >= 0 && bit == alone_bit_ ? alone_rounds_ + 1 : (bit >= 0 ? 1 : 0);
  alone_bit_ = bit;
  // Twice in a row: a loop, not a sequence of different requests whose payloads would
  // only make the rounds larger.
  if (alone_rounds_ >= 2) ride_bit_ = bit;
}

void Negotiator::TakeFastAgreed() {
  fast_agreed_.clear();
  for (int bit = 0; bit < cache_.capacity(); ++bit) {
    if (!Agreed(bits_recv_, cache_.capacity(), bit) || !cache_.InUse(bit)) continue;
    cache_.Touch(bit, round_);
    BatchItem item;
    item.meta = cache_.MetaAt(bit);
    auto it = pending_.find(item.meta.name);
    if (it != pending_.end() && cache_.Lookup(it->second->meta) == bit) {
      item.entry = it->second;
      item.meta = it->second->meta;  // carries this rank's own first dimension
      pending_.erase(it);
    }
    fast_agreed_.push_back(std::move(item));
  }
}

Status Negotiator::BeginGather() {
  Writer w;
  int32_t flags = (leaving_ ? kMsgLeaving : 0);
  int32_t count = 0;
  for (const auto& kv : pending_) {
    if (kv.second->meta.op_type == PERSEUS_JOIN) {
      flags |= kMsgJoined;
    } else {
      ++count;
    }
  }
  w.I32(flags);
  if (leaving_) w.Str(leaving_how_);
  w.I32(count);
  const Clock::time_point now = Clock::now();
  for (const auto& kv : pending_) {
    if (kv.second->meta.op_type == PERSEUS_JOIN) continue;
    w.Meta(kv.second->meta);
    w.I32(static_cast<int32_t>(std::min<int64_t>(
        INT32_MAX, std::chrono::duration_cast<std::chrono::milliseconds>(now - kv.second->submitted)
                       .count())));
  }
  if (round_inspect_) w.Str(last_added_);  // every rank knows round_inspect_ alike
  send_bytes_ = std::move(w.bytes());
  Count(kNegotiationGathers);
  sizes_.assign(size_, 0);
  send_size_ = static_cast<int>(send_bytes_.size());
  auto mpi = LockMpi();
  int rc = MPI_Iallgather(&send_size_, 1, MPI_INT, sizes_.data(), 1, MPI_INT, comm_, &request_);
  if (rc != MPI_SUCCESS) return MpiStatus(rc, "negotiation MPI_Iallgather");
  phase_ = Phase::kSizes;
  return Status::OK();
}

bool Negotiator::Test(RoundOutcome* outcome, Status* error) {
  while (phase_ != Phase::kIdle) {
    int done = 0;
    {
      auto mpi = LockMpi();
      int rc = MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        phase_ = Phase::kIdle;
        *error = MpiStatus(rc, "negotiation MPI_Test");
        return true;
      }
    }
    if (!done) return false;
    switch (phase_) {
      case Phase::kBits: {
        if (carrying_) {  // the bits come in the round's buffer
          const uint64_t* bits = round_recv_.data() + RoundPayloadOps::kHeaderWords;
          std::copy(bits, bits + bits_recv_.size(), bits_recv_.begin());
        }
        ++round_;
        round_inspect_ = static_cast<int>((~bits_recv_[0]) >> kInspectShift) &
                         (kInspectWarn | kInspectShutdown);
        TakeFastAgreed();
        ridden_.clear();
        if (carrying_) {
          RoundOutcome ridden;
          TakeRidden(&ridden);
          ridden_ = std::move(ridden.finished);
        }
        last_round_gathered_ = false;
        if ((~bits_recv_[0]) & kNeedsGather) {
          *error = BeginGather();
          if (!error->ok()) {
            phase_ = Phase::kIdle;
            return true;
          }
          break;  // test the gather straight away
        }
        *outcome = RoundOutcome();
        outcome->agreed = std::move(fast_agreed_);
        outcome->finished = std::move(ridden_);
        RejectWhileJoined(outcome);
        outcome->progressed = !outcome->agreed.empty() || !outcome->failed.empty() ||
                              !outcome->finished.empty();
        PlanRide(*outcome);
        phase_ = Phase::kIdle;
        return true;
      }
      case Phase::kSizes: {
        displs_.assign(size_, 0);
        int total = 0;
        for (int r = 0; r < size_; ++r) {
          displs_[r] = total;
          total += sizes_[r];
        }
        recv_bytes_.assign(std::max(total, 1), 0);
        auto mpi = LockMpi();
        int rc = MPI_Iallgatherv(send_bytes_.data(), static_cast<int>(send_bytes_.size()), MPI_BYTE,
                                 recv_bytes_.data(), sizes_.data(), displs_.data(), MPI_BYTE, comm_,
                                 &request_);
        if (rc != MPI_SUCCESS) {
          phase_ = Phase::kIdle;
          *error = MpiStatus(rc, "negotiation MPI_Iallgatherv");
          return true;
        }
        phase_ = Phase::kMetas;
        break;
      }
      case Phase::kMetas: {
        *outcome = RoundOutcome();
        outcome->agreed = std::move(fast_agreed_);
        outcome->finished = std::move(ridden_);
        try {
          DecodeGather(outcome);
        } catch (const std::exception& ex) {
          *error = Status::Error(PERSEUS_INTERNAL_ERROR, ex.what());
        }
        outcome->progressed = !outcome->agreed.empty() || !outcome->failed.empty() ||
                              !outcome->finished.empty();
        PlanRide(*outcome);
        phase_ = Phase::kIdle;
        return true;
      }
      case Phase::kIdle:
        break;
    }
  }
  return false;
}

void Negotiator::DecodeGather(RoundOutcome* out) {
  last_round_gathered_ = true;
  std::map<std::string, std::vector<Held>> by_name;  // sorted: the same order on every rank
  std::vector<std::pair<int, std::string>> leaving;  // set rank, how it ends
  for (int r = 0; r < size_; ++r) {
    Reader reader(recv_bytes_.data() + displs_[r], sizes_[r]);
    int32_t flags = reader.I32();
    if (flags & kMsgLeaving) leaving.emplace_back(r, reader.Str());
    int32_t count = reader.I32();
    if ((flags & kMsgJoined) && !joined_[r]) {
      joined_[r] = 1;
      join_round_[r] = round_;
    }
    for (int32_t i = 0; i < count; ++i) {
      TensorMeta meta = reader.Meta();
      int32_t waited_ms = reader.I32();
      std::string name = meta.name;
      by_name[name].push_back(Held{r, std::move(meta), waited_ms});
    }
    if (round_inspect_) {
      std::string last = reader.Str();
      if (count == 0 && !(flags & kMsgJoined)) out->idle.push_back(IdleRank{global_ranks_[r], last});
    }
  }
  for (auto& l : leaving) out->shutdown_ranks.emplace_back(global_ranks_[l.first], std::move(l.second));
  std::map<std::string, std::vector<Held>> unagreed;
  waiting_for_.clear();
  for (auto& kv : by_name) {
    if (AgreeNamed(kv.first, kv.second, out)) continue;
    if (pending_.count(kv.first)) waiting_for_[kv.first] = Stalled(kv.first, kv.second).missing;
    unagreed.emplace(kv.first, std::move(kv.second));
  }
  FailCrossOpConflicts(unagreed, out);
  out->inspect_flags = round_inspect_;
  RejectWhileJoined(out);  // before a completed join clears the joined ranks
  FinishJoinIfComplete(out);
}

bool Negotiator::AgreeNamed(const std::string& name, const std::vector<Held>& holders,
                            RoundOutcome* out) {
  // Ready once every rank that has not joined holds it.
  size_t needed = 0, present = 0;
  for (int r = 0; r < size_; ++r) needed += joined_[r] ? 0 : 1;
  for (const Held& h : holders) present += joined_[h.rank] ? 0 : 1;
  if (present < needed) {
    if (round_inspect_) out->stalled.push_back(Stalled(name, holders));
    return false;
  }

  const Held& first = holders.front();
  for (const Held& other : holders) {
    std::string diff = first.meta.Difference(other.meta);
    if (diff.empty()) continue;
    std::ostringstream msg;
    msg << "Mismatched " << OpTypeName(first.meta.op_type) << " of tensor '" << name
        << "' across ranks: rank " << global_ranks_[first.rank] << " vs rank "
        << global_ranks_[other.rank] << " differ in " << diff;
    if (EntryPtr local = TakeLocal(name))
      FailMismatch(local, first.meta.group_size != other.meta.group_size, msg.str(), out);
    return true;
  }
  BatchItem item;
  item.entry = TakeLocal(name);
  item.meta = item.entry ? item.entry->meta : first.meta;
  cache_.Put(first.meta, round_);
  out->agreed.push_back(std::move(item));
  return true;
}

void Negotiator::FailMismatch(const EntryPtr& entry, bool group_differs, const std::string& message,
                              RoundOutcome* out) {
  out->failed.emplace_back(entry, Status::Error(PERSEUS_MISMATCH, message));
  if (!group_differs || entry->group == 0) return;
  std::vector<std::string> members;
  for (const auto& kv : pending_)
    if (kv.second->group == entry->group) members.push_back(kv.first);
  for (const std::string& name : members)
    out->failed.emplace_back(TakeLocal(name), Status::Error(PERSEUS_MISMATCH, message));
}

void Negotiator::FailCrossOpConflicts(const std::map<std::string, std::vector<Held>>& unagreed,
                                      RoundOutcome* out) {
  // Wire names are "<collective>.<user name>": group the unagreed ones by user name.
  std::map<std::string, std::vector<const std::string*>> by_user_name;
  for (const auto& kv : unagreed) {
    const TensorMeta& meta = kv.second.front().meta;
    const std::string prefix = std::string(OpTypeName(meta.op_type)) + ".";
    if (meta.anonymous || kv.first.compare(0, prefix.size(), prefix) != 0) continue;
    by_user_name[kv.first.substr(prefix.size())].push_back(&kv.first);
  }
  for (const auto& kv : by_user_name) {
    if (kv.second.size() < 2) continue;
    std::vector<int> op_of(size_, -1);  // each member's collective under this name
    int32_t waited_ms = INT32_MAX;      // the shortest wait among them
    for (const std::string* name : kv.second) {
      for (const Held& h : unagreed.at(*name)) {
        op_of[h.rank] = h.meta.op_type;
        waited_ms = std::min(waited_ms, h.waited_ms);
      }
    }
    bool everyone = true;
    for (int r = 0; r < size_; ++r) everyone = everyone && (joined_[r] || op_of[r] >= 0);
    if (!everyone || waited_ms < kConflictMs) continue;  // a member may still be on its way
    std::map<int, std::vector<int>> ranks_by_op;
    for (int r = 0; r < size_; ++r)
      if (op_of[r] >= 0) ranks_by_op[op_of[r]].push_back(global_ranks_[r]);
    std::ostringstream msg;
    msg << "Mismatched collectives for tensor '" << kv.first << "' across ranks: ";
    bool first = true;
    for (const auto& op : ranks_by_op) {
      msg << (first ? "" : ", ") << OpTypeName(op.first) << " on rank(s) " << ListString(op.second);
      first = false;
    }
    for (const std::string* name : kv.second)
      if (EntryPtr local = TakeLocal(*name))
        out->failed.emplace_back(local, Status::Error(PERSEUS_MISMATCH, msg.str()));
  }
}

StalledRequest Negotiator::Stalled(const std::string& name, const std::vector<Held>& holders) const {
  StalledRequest s;
  s.name = name;
  std::vector<char> holds(size_, 0);
  for (const Held& h : holders) holds[h.rank] = 1;
  for (int r = 0; r < size_; ++r) {
    if (holds[r]) {
      s.holders.push_back(global_ranks_[r]);
    } else if (!joined_[r]) {
      s.missing.push_back(global_ranks_[r]);
    }
  }
  s.held_here = holds[rank_];
  return s;
}

void Negotiator::FinishJoinIfComplete(RoundOutcome* out) {
  for (int r = 0; r < size_; ++r)
    if (!joined_[r]) return;
  int last = 0;
  for (int r = 1; r < size_; ++r)
    if (join_round_[r] >= join_round_[last]) last = r;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second->meta.op_type == PERSEUS_JOIN) {
      Result result;
      result.shape = {global_ranks_[last]};
      out->finished.emplace_back(it->second, std::move(result));
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  std::fill(joined_.begin(), joined_.end(), 0);
  std::fill(join_round_.begin(), join_round_.end(), 0);
}

void Negotiator::RejectWhileJoined(RoundOutcome* out) {
  std::vector<int> joined;
  for (int r = 0; r < size_; ++r)
    if (joined_[r]) joined.push_back(r);
  if (joined.empty()) return;
  std::vector<BatchItem> kept;
  for (BatchItem& item : out->agreed) {
    if (item.meta.op_type == PERSEUS_ALLREDUCE) {
      kept.push_back(std::move(item));
    } else if (item.entry) {
      out->failed.emplace_back(
          item.entry, Status::Error(PERSEUS_MISMATCH,
                                    std::string(OpTypeName(item.meta.op_type)) + " of tensor '" +
                                        item.meta.name + "' cannot run while rank(s) " +
                                        RankList(joined) +
                                        " have joined; only allreduce supports join"));
    }
  }
  out->agreed = std::move(kept);
}

}  // namespace perseus
