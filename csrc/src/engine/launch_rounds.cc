#include "engine/launch_rounds.h"

#include <algorithm>

#include "mpi/mpi_lock.h"
#include "mpi/mpi_status.h"

namespace perseus {

namespace {

// A round's words, all reduced with MIN: the slots wanted as kAny minus the count (so
// MIN gives the largest), whether nobody leaves, then one count per set id.
constexpr size_t kSlotsWanted = 0, kStaying = 1, kHeader = 2;
constexpr size_t kFirstSlots = 8;

}  // namespace

LaunchRounds::LaunchRounds(MPI_Comm comm)
    : comm_(comm), send_(new std::vector<uint64_t>), recv_(new std::vector<uint64_t>), slots_(kFirstSlots) {}

LaunchRounds::~LaunchRounds() {
  // Abandoned, or a round some peer may never join: MPI may still write the buffers,
  // and freeing the communicator could wait; both are left.
  if (abandoned_ || in_flight()) return;
  delete send_;
  delete recv_;
  auto mpi = LockMpi();
  MPI_Comm_free(&comm_);
}

Status LaunchRounds::Start(const std::vector<uint64_t>& agreed, bool leaving) {
  if (ended_ || in_flight()) return Status::OK();
  std::vector<uint64_t>& send = *send_;
  send.assign(kHeader + slots_, kAny);
  send[kSlotsWanted] = kAny - agreed.size();
  send[kStaying] = leaving ? 0 : 1;
  std::copy_n(agreed.begin(), std::min(agreed.size(), slots_), send.begin() + kHeader);
  recv_->assign(send.size(), 0);
  auto mpi = LockMpi();
  int rc = MPI_Iallreduce(send.data(), recv_->data(), static_cast<int>(send.size()), MPI_UINT64_T, MPI_MIN,
                          comm_, &request_);
  if (rc != MPI_SUCCESS) {
    request_ = MPI_REQUEST_NULL;
    return MpiStatus(rc, "launch round MPI_Iallreduce");
  }
  return Status::OK();
}

bool LaunchRounds::Test(std::vector<uint64_t>* agreed, bool* changed, Status* error) {
  if (!in_flight()) return false;
  int done = 0;
  {
    auto mpi = LockMpi();
    int rc = MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      *error = MpiStatus(rc, "launch round MPI_Test");
      abandoned_ = ended_ = true;
      return true;
    }
  }
  if (!done) return false;
  const std::vector<uint64_t>& recv = *recv_;
  agreed->assign(recv.begin() + kHeader, recv.end());
  *changed = *agreed != last_;
  last_ = *agreed;
  ended_ = recv[kStaying] == 0;
  slots_ = std::max(slots_, static_cast<size_t>(kAny - recv[kSlotsWanted]));
  return true;
}

void LaunchRounds::Abandon() {
  abandoned_ = ended_ = true;
}

}  // namespace perseus
