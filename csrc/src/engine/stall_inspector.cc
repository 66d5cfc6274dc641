#include "engine/stall_inspector.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "common/list_string.h"
#include "common/logging.h"
#include "mpi/mpi_lock.h"

namespace perseus {

namespace {

// Messages go over the world communicator, which outlives every set, tagged with the
// set's id (ids are never reused while the engine lives): a set's communicators may be
// freed while a peer's last message to it is still on its way, and a later set given
// the freed context would otherwise read that message as its own (and its sender's
// rank in the wrong numbering). A message is two ints: its kind and its value.
constexpr int kPing = 1;     // value: the kInspect* flags asked for (0: are you there?)
constexpr int kPong = 2;     // the answer to a ping
constexpr int kRemoved = 3;  // the sender removed the set (remove_process_set)
constexpr int kTagLimit = 32767;  // the MPI_TAG_UB every MPI guarantees
// How often an engine looks for pings: a fraction of the shortest configured time.
constexpr double kProbeFraction = 0.25, kMinProbeS = 0.05, kMaxProbeS = 5.0;
// A live peer answers within a probe interval; it is named as not responding after
// this many (or half the shortest configured time, if longer) without an answer.
constexpr int kReplyProbes = 2;
constexpr int kProbeMisses = 8;
constexpr size_t kMaxNamesShown = 10;

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

double SecondsOf(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The shortest of the times set (0: none).
double Shortest(const Config& config) {
  double shortest = 0;
  for (double s : {config.stall_check_seconds, config.stall_shutdown_seconds,
                   config.peer_timeout_seconds})
    if (s > 0 && (shortest == 0 || s < shortest)) shortest = s;
  return shortest;
}

// When members that answer no ping are given up on: the stall shutdown time, or the
// peer timeout if that is sooner (0: never).
double LostAfter(const Config& config) {
  double shutdown_s = config.stall_shutdown_seconds, peer_s = config.peer_timeout_seconds;
  return shutdown_s > 0 && peer_s > 0 ? std::min(shutdown_s, peer_s) : std::max(shutdown_s, peer_s);
}

std::string Describe(const StalledRequest& s) {
  return "'" + s.name + "' (submitted by rank(s) " + ListString(s.holders) +
         ", missing on rank(s) " + ListString(s.missing) + ")";
}

// "; rank(s) that stopped submitting: 1 (last submitted 'allreduce.b'), ..."
std::string DescribeIdle(const std::vector<IdleRank>& idle) {
  if (idle.empty()) return "";
  std::ostringstream out;
  out << ". Rank(s) with nothing pending, which stopped submitting: ";
  for (size_t i = 0; i < idle.size(); ++i) {
    out << (i ? ", " : "") << idle[i].rank;
    if (idle[i].last.empty()) {
      out << " (submitted nothing yet)";
    } else {
      out << " (last submitted '" << idle[i].last << "')";
    }
  }
  return out.str();
}

// "rank(s) [1] not responding (stopped, stuck or unreachable): no answer for 1.5 s,
// while this rank waited 2.0 s for 'allreduce.x' (and 3 more requests)"
std::string DescribeSilent(const std::vector<int>& silent, double silent_s, double waited_s,
                           const SetWaits& waits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << "rank(s) " << ListString(silent)
      << " not responding (stopped, stuck or unreachable): no answer for " << silent_s
      << " s, while this rank waited " << waited_s << " s for '" << waits.oldest_name << "'";
  if (waits.count > 1) out << " (and " << (waits.count - 1) << " more request(s))";
  return out.str();
}

}  // namespace

bool StallInspector::Watches(const Config& config) { return Shortest(config) > 0; }

Clock::duration StallInspector::ProbeInterval(const Config& config) {
  return Seconds(std::min(kMaxProbeS, std::max(kMinProbeS, Shortest(config) * kProbeFraction)));
}

StallInspector::StallInspector(const Config& config, int set_id, MPI_Comm world, int rank,
                               std::vector<int> global_ranks)
    : set_id_(set_id),
      warn_s_(config.stall_check_seconds),
      shutdown_s_(config.stall_shutdown_seconds),
      lost_s_(LostAfter(config)),
      lost_by_shutdown_(lost_s_ == config.stall_shutdown_seconds),
      world_(world),
      tag_(set_id % kTagLimit),
      rank_(rank),
      global_ranks_(std::move(global_ranks)),
      unanswered_(global_ranks_.size(), Clock::time_point::max()) {
  enabled_ = global_ranks_.size() > 1 && Watches(config);
  probe_interval_ = ProbeInterval(config);
  ask_lead_ = kReplyProbes * probe_interval_;
  reply_bound_ = std::max(ask_lead_, Seconds(Shortest(config) / 2));
  next_check_ = (enabled_ ? Clock::now() + probe_interval_ : Clock::time_point::max())
                    .time_since_epoch()
                    .count();
  next_ask_ = next_warn_ = next_withdraw_ask_ = Clock::time_point::min();
}

void StallInspector::ShortenProbe(Clock::duration interval) {
  std::lock_guard<std::mutex> lock(mu_);
  interval = std::max(interval, std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(kMinProbeS)));
  if (global_ranks_.size() < 2 || (enabled_ && interval >= probe_interval_)) return;
  if (!enabled_) reply_bound_ = Clock::duration::max();  // nobody is given up on: no times set
  enabled_ = true;
  probe_interval_ = std::min(probe_interval_, interval);
  next_check_.store(Clock::now().time_since_epoch().count());
}

StallVerdict StallInspector::Check(Clock::time_point now, const SetWaits& waits, bool stepping) {
  std::lock_guard<std::mutex> lock(mu_);
  StallVerdict verdict;
  deferred_flags_ |= ReadMessages();  // a peer's inspection counts as ours: join it
  if (stepping) std::swap(verdict.inspect_flags, deferred_flags_);
  Clock::time_point next = NextCheck(now, waits);
  // Without the negotiator's part, keep the deadlines a stepping check set for it.
  if (!stepping && next_check() > now) next = std::min(next, next_check());
  next_check_ = next.time_since_epoch().count();
  if (!removed_by_.empty() && waits.oldest != Clock::time_point::max()) {
    std::sort(removed_by_.begin(), removed_by_.end());
    verdict.removed = Status::Error(
        PERSEUS_INVALID_ARGUMENT,
        "process set " + std::to_string(set_id_) + " was removed on rank(s) " +
            ListString(removed_by_) + " (remove_process_set) while this rank waited for '" +
            waits.oldest_name + "'; remove a process set on every rank, when no rank uses it");
  }
  if (waits.oldest == Clock::time_point::max()) {
    // Nothing waits: forget pings not answered yet, a later wait pings afresh.
    std::fill(unanswered_.begin(), unanswered_.end(), Clock::time_point::max());
    return verdict;
  }
  const int mine = stepping ? Asks(now, waits) : 0;
  if (mine || now - waits.oldest >= probe_interval_) Ping(mine, now);
  verdict.inspect_flags |= mine;
  if (!JudgeSilent(now, waits, &verdict) && stepping && !findings_.empty() &&
      findings_for_ == waits.oldest_pending && now - waits.oldest_pending >= Seconds(warn_s_) &&
      now >= next_warn_)
    LogFindings(now, waits.oldest_pending);
  return verdict;
}

int StallInspector::Asks(Clock::time_point now, const SetWaits& waits) {
  int flags = 0;
  if (waits.withdrawing && now >= next_withdraw_ask_) {  // until the request is taken back
    flags |= kInspectWarn;
    next_withdraw_ask_ = now + probe_interval_;
  }
  const Clock::time_point oldest_pending = waits.oldest_pending;
  if (oldest_pending == Clock::time_point::max()) return flags;
  const Clock::duration waited = now - oldest_pending;
  // Early enough for the round to be done by the check time: peers look every probe.
  if (warn_s_ > 0 && waited >= Seconds(warn_s_) - ask_lead_ && now >= next_ask_) {
    flags |= kInspectWarn;
    next_ask_ = now + Seconds(warn_s_);  // look again each stall time while it lasts
  }
  if (shutdown_s_ > 0 && waited >= Seconds(shutdown_s_)) flags |= kInspectShutdown;
  return flags;
}

bool StallInspector::JudgeSilent(Clock::time_point now, const SetWaits& waits,
                                 StallVerdict* verdict) {
  double silent_s = 0;
  std::vector<int> silent = Silent(now, &silent_s);
  if (silent.empty()) return false;
  const Clock::duration waited = now - waits.oldest;
  const std::string what = DescribeSilent(silent, silent_s, SecondsOf(waited), waits);
  if (lost_s_ > 0 && waited >= Seconds(lost_s_)) {
    verdict->lost = silent;
    verdict->stop = Status::Error(
        PERSEUS_SHUT_DOWN, "Perseus stopped process set " + std::to_string(set_id_) +
                               (lost_by_shutdown_ ? " at the stall shutdown time "
                                                    "(PERSEUS_STALL_SHUTDOWN_TIME_SECONDS): "
                                                  : " at the peer timeout "
                                                    "(PERSEUS_PEER_TIMEOUT_SECONDS): ") +
                               what);
  } else if (warn_s_ > 0 && waited >= Seconds(warn_s_) && now >= next_warn_) {
    next_warn_ = now + Seconds(warn_s_);
    PERSEUS_LOG(kWarning) << "stall in process set " << set_id_ << ": " << what
                          << ". Its process may be stopped (SIGSTOP), hung, or its node gone.";
  }
  return true;
}

Clock::time_point StallInspector::NextCheck(Clock::time_point now, const SetWaits& waits) const {
  // The probe interval, and each moment at which this rank's waits cross a threshold.
  Clock::time_point next = now + probe_interval_;
  auto consider = [&](Clock::time_point since, double s, Clock::duration lead) {
    if (since == Clock::time_point::max() || s <= 0) return;
    Clock::time_point at = since + Seconds(s) - lead;
    if (at > now) next = std::min(next, at);
  };
  consider(waits.oldest, SecondsOf(probe_interval_), Clock::duration::zero());  // first pings
  consider(waits.oldest, warn_s_, Clock::duration::zero());
  consider(waits.oldest, lost_s_, Clock::duration::zero());
  consider(waits.oldest_pending, warn_s_, ask_lead_);
  consider(waits.oldest_pending, warn_s_, Clock::duration::zero());
  consider(waits.oldest_pending, shutdown_s_, Clock::duration::zero());
  return next;
}

void StallInspector::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  if (enabled_) ReadMessages(/*answer=*/false);
}

int StallInspector::ReadMessages(bool answer) {
  static const int kPongMessage[2] = {kPong, 0};
  int flags = 0;
  auto mpi = LockMpi();
  // A probe may miss a message that has arrived: MPI makes progress in steps (MPICH's
  // shared memory polls a few senders per call), and a probe takes one step. An idle
  // engine probes only at its checks, so it probes until several in a row find nothing.
  const int enough = kProbeMisses + static_cast<int>(unanswered_.size());
  for (int misses = 0; misses < enough;) {
    int found = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, tag_, world_, &found, &status) != MPI_SUCCESS) break;
    if (!found) {
      ++misses;
      continue;
    }
    int message[2] = {0, 0};
    if (MPI_Recv(message, 2, MPI_INT, status.MPI_SOURCE, tag_, world_, MPI_STATUS_IGNORE) !=
        MPI_SUCCESS)
      break;
    // A sender that is no member wrote to an older set whose id shares the tag: ignore.
    auto member = std::find(global_ranks_.begin(), global_ranks_.end(), status.MPI_SOURCE);
    if (member == global_ranks_.end()) continue;
    const int from = static_cast<int>(member - global_ranks_.begin());
    unanswered_[from] = Clock::time_point::max();  // any message: the peer's engine runs
    if (message[0] == kRemoved &&
        std::find(removed_by_.begin(), removed_by_.end(), status.MPI_SOURCE) == removed_by_.end())
      removed_by_.push_back(status.MPI_SOURCE);
    if (message[0] != kPing || !answer) continue;
    flags |= message[1];
    MPI_Request request;
    // Fire and forget: the buffer is static, and a peer that is gone is no error here.
    if (MPI_Isend(kPongMessage, 2, MPI_INT, status.MPI_SOURCE, tag_, world_, &request) ==
        MPI_SUCCESS)
      MPI_Request_free(&request);
  }
  return flags;
}

void StallInspector::AnnounceRemoval() {
  static const int kRemovedMessage[2] = {kRemoved, 0};
  std::lock_guard<std::mutex> lock(mu_);
  if (!enabled_) return;
  auto mpi = LockMpi();
  for (int r = 0; r < static_cast<int>(unanswered_.size()); ++r) {
    MPI_Request request;
    if (r != rank_ && MPI_Isend(kRemovedMessage, 2, MPI_INT, global_ranks_[r], tag_, world_,
                                &request) == MPI_SUCCESS)
      MPI_Request_free(&request);
  }
}

void StallInspector::Ping(int flags, Clock::time_point now) {
  static const int kPings[4][2] = {{kPing, 0},
                                   {kPing, kInspectWarn},
                                   {kPing, kInspectShutdown},
                                   {kPing, kInspectWarn | kInspectShutdown}};
  auto mpi = LockMpi();
  for (int r = 0; r < static_cast<int>(unanswered_.size()); ++r) {
    // A plain "are you there?" only when the last one was answered: one outstanding.
    if (r == rank_ || (flags == 0 && unanswered_[r] != Clock::time_point::max())) continue;
    MPI_Request request;
    if (MPI_Isend(kPings[flags & 3], 2, MPI_INT, global_ranks_[r], tag_, world_, &request) ==
        MPI_SUCCESS)
      MPI_Request_free(&request);
    unanswered_[r] = std::min(unanswered_[r], now);
  }
}

std::vector<int> StallInspector::Silent(Clock::time_point now, double* longest_s) const {
  std::vector<int> silent;
  for (size_t r = 0; r < unanswered_.size(); ++r) {
    if (unanswered_[r] == Clock::time_point::max() || now - unanswered_[r] < reply_bound_) continue;
    silent.push_back(global_ranks_[r]);
    *longest_s = std::max(*longest_s, SecondsOf(now - unanswered_[r]));
  }
  return silent;
}

void StallInspector::Warn(const std::vector<StalledRequest>& stalled,
                          const std::vector<IdleRank>& idle, Clock::time_point now,
                          Clock::time_point oldest_pending) {
  std::lock_guard<std::mutex> lock(mu_);
  findings_.clear();
  if (warn_s_ <= 0 || oldest_pending == Clock::time_point::max()) return;
  // Other ranks' inspections reach this rank too: only the names it submitted count.
  std::ostringstream names;
  size_t shown = 0, held = 0;
  for (const StalledRequest& s : stalled) {
    if (!s.held_here) continue;
    ++held;
    if (shown++ < kMaxNamesShown) names << (shown > 1 ? "; " : "") << Describe(s);
  }
  if (held == 0) return;  // only the ranks that submitted warn
  if (held > kMaxNamesShown) names << "; and " << (held - kMaxNamesShown) << " more";
  findings_ = names.str() + DescribeIdle(idle);
  findings_for_ = oldest_pending;
  if (now - oldest_pending >= Seconds(warn_s_) && now >= next_warn_) LogFindings(now, oldest_pending);
}

void StallInspector::LogFindings(Clock::time_point now, Clock::time_point oldest_pending) {
  next_warn_ = now + Seconds(warn_s_);
  int waited = static_cast<int>(SecondsOf(now - oldest_pending));
  PERSEUS_LOG(kWarning) << "stall in process set " << set_id_ << ": for " << waited
                        << " s this rank has been waiting for other ranks to submit " << findings_
                        << ". A rank may be skipping these collectives (e.g. it refused one with "
                           "an error of its own), or be stuck elsewhere.";
  findings_.clear();
}

Status StallInspector::ShutdownError(int set_id, const std::vector<StalledRequest>& stalled,
                                     const std::vector<IdleRank>& idle) {
  std::ostringstream msg;
  msg << "Perseus stopped process set " << set_id
      << " because requests stalled past the stall shutdown time "
         "(PERSEUS_STALL_SHUTDOWN_TIME_SECONDS): ";
  for (size_t i = 0; i < stalled.size() && i < kMaxNamesShown; ++i)
    msg << (i ? "; " : "") << Describe(stalled[i]);
  if (stalled.size() > kMaxNamesShown) msg << "; and " << (stalled.size() - kMaxNamesShown) << " more";
  msg << DescribeIdle(idle);
  return Status::Error(PERSEUS_SHUT_DOWN, msg.str());
}

}  // namespace perseus
