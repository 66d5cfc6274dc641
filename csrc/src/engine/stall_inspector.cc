#include "engine/stall_inspector.h"

#include <algorithm>
#include <sstream>

#include "common/list_string.h"
#include "common/logging.h"
#include "mpi/mpi_lock.h"

namespace perseus {

namespace {

constexpr int kPingTag = 0x57a1;  // on the negotiation communicator; rounds use collectives
// How often a rank looks for pings and at its own oldest request: a fraction of the
// shortest configured time, so an idle peer answers well within it.
constexpr double kProbeFraction = 0.25, kMinProbeS = 0.05, kMaxProbeS = 5.0;
constexpr size_t kMaxNamesShown = 10;

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string Describe(const StalledRequest& s) {
  return "'" + s.name + "' (submitted by rank(s) " + ListString(s.holders) + ", missing on rank(s) " +
         ListString(s.missing) + ")";
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

}  // namespace

StallInspector::StallInspector(const Config& config, MPI_Comm comm, int rank, int size)
    : warn_s_(config.stall_check_seconds),
      shutdown_s_(config.stall_shutdown_seconds),
      comm_(comm),
      rank_(rank),
      size_(size) {
  enabled_ = size_ > 1 && (warn_s_ > 0 || shutdown_s_ > 0);
  double shortest = warn_s_ > 0 && shutdown_s_ > 0 ? std::min(warn_s_, shutdown_s_)
                                                    : std::max(warn_s_, shutdown_s_);
  probe_interval_ = Seconds(std::min(kMaxProbeS, std::max(kMinProbeS, shortest * kProbeFraction)));
  next_probe_ = Clock::now() + probe_interval_;
  next_ask_ = next_warn_ = Clock::time_point::min();
}

bool StallInspector::Due(Clock::time_point now, Clock::time_point* wake_at) {
  if (!enabled_) return false;
  bool due = now >= next_probe_;
  if (due) next_probe_ = now + probe_interval_;
  *wake_at = std::min(*wake_at, next_probe_);
  return due;
}

int StallInspector::Check(Clock::time_point now, Clock::time_point oldest) {
  int flags = ReceivePings();  // a peer's request counts as ours: join its inspection
  if (oldest != Clock::time_point::max()) {
    double waited = std::chrono::duration<double>(now - oldest).count();
    int mine = 0;
    if (shutdown_s_ > 0 && waited >= shutdown_s_) mine |= kInspectShutdown;
    if (warn_s_ > 0 && waited >= warn_s_ && now >= next_ask_) {
      mine |= kInspectWarn;
      next_ask_ = now + Seconds(warn_s_);  // look again each stall time while it lasts
    }
    if (mine) PingOthers(mine);
    flags |= mine;
  }
  return flags;
}

int StallInspector::ReceivePings() {
  int flags = 0;
  auto mpi = LockMpi();
  while (true) {
    int found = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kPingTag, comm_, &found, &status) != MPI_SUCCESS || !found)
      return flags;
    int ping = 0;
    MPI_Recv(&ping, 1, MPI_INT, status.MPI_SOURCE, kPingTag, comm_, MPI_STATUS_IGNORE);
    flags |= ping;
  }
}

void StallInspector::PingOthers(int flags) {
  static const int kPings[] = {0, kInspectWarn, kInspectShutdown, kInspectWarn | kInspectShutdown};
  auto mpi = LockMpi();
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Request request;
    // Fire and forget: the buffer is static, and a peer that is gone is no error here.
    if (MPI_Isend(&kPings[flags & 3], 1, MPI_INT, r, kPingTag, comm_, &request) == MPI_SUCCESS)
      MPI_Request_free(&request);
  }
}

void StallInspector::Warn(int set_id, const std::vector<StalledRequest>& stalled,
                          const std::vector<IdleRank>& idle, Clock::time_point now,
                          Clock::time_point oldest) {
  // Other ranks' inspections reach this rank too: warn only about a wait of our own
  // that has lasted the stall time, and only once per stall time.
  if (warn_s_ <= 0 || oldest == Clock::time_point::max() || now < next_warn_ ||
      now - oldest < Seconds(warn_s_))
    return;
  std::ostringstream names;
  size_t shown = 0, held = 0;
  for (const StalledRequest& s : stalled) {
    if (!s.held_here) continue;
    ++held;
    if (shown++ < kMaxNamesShown) names << (shown > 1 ? "; " : "") << Describe(s);
  }
  if (held == 0) return;  // only the ranks that submitted warn
  if (held > kMaxNamesShown) names << "; and " << (held - kMaxNamesShown) << " more";
  next_warn_ = now + Seconds(warn_s_);
  int waited = static_cast<int>(std::chrono::duration<double>(now - oldest).count());
  PERSEUS_LOG(kWarning) << "stall in process set " << set_id << ": for " << waited
                        << " s this rank has been waiting for other ranks to submit " << names.str()
                        << DescribeIdle(idle)
                        << ". A rank may be skipping these collectives (e.g. it refused one with "
                           "an error of its own), or be stuck elsewhere.";
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
