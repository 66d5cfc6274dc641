#include "engine/rank_failure.h"

#include "common/list_string.h"
#include "common/logging.h"
#include "mpi/fault_tolerance.h"

namespace perseus {

bool RankFailure::Note(const Status& status) {
  if (!enabled_ || status.code != PERSEUS_RANK_FAILED) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (noted_.load()) return false;
  first_ = status;
  noted_.store(true);
  return true;
}

Status RankFailure::Declare(MPI_Comm world, const std::vector<MPI_Comm>& comms) {
  for (MPI_Comm comm : comms) Revoke(comm);
  const std::vector<int> failed = FailedRanks(world);
  std::lock_guard<std::mutex> lock(mu_);
  std::string ranks = failed.empty() ? std::string("a rank") : "rank(s) " + ListString(failed);
  error_ = Status::Error(
      PERSEUS_RANK_FAILED,
      ranks + " of the job failed (their process ended, or stopped answering for the stall "
              "shutdown time; first seen in " + first_.message +
          "). Nothing more runs with the ranks of this world: hvd.elastic.run goes on with "
          "the survivors from the last commit (or call shutdown() and init(), which forms "
          "the world of the survivors)");
  declared_.store(true);
  PERSEUS_LOG(kWarning) << error_.message;
  return error_;
}

Status RankFailure::error() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

}  // namespace perseus
