#include "engine/point_to_point.h"

#include <algorithm>
#include <climits>

#include "common/result.h"
#include "mpi/mpi_lock.h"
#include "mpi/mpi_status.h"
#include "mpi/wait_policy.h"

namespace perseus {

PointToPoint::~PointToPoint() {
  Close(Status::Error(PERSEUS_SHUT_DOWN, "Perseus was shut down"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string PointToPoint::Describe(const PointToPointOp& op) {
  std::string peer = op.peer == MPI_ANY_SOURCE ? "any rank" : "rank " + std::to_string(op.peer);
  return (op.recv ? "recv from " : "send to ") + peer + " (tag " + std::to_string(op.tag) + ")";
}

Status PointToPoint::Post(const PointToPointOp& op, MPI_Comm comm, int set_rank, int64_t* handle) {
  if (op.bytes > INT_MAX)
    return Status::Error(PERSEUS_INVALID_ARGUMENT,
                         Describe(op) + ": messages above 2 GiB are not supported; split the tensor");
  if (op.peer == set_rank)
    return Status::Error(PERSEUS_INVALID_ARGUMENT, Describe(op) + ": the peer is this rank itself");
  Pending p{op, 0, MPI_REQUEST_NULL, Clock::now()};
  {
    auto mpi = LockMpi();
    int* tag_ub = nullptr;
    int has_ub = 0;
    MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &has_ub);
    if (has_ub && op.tag > *tag_ub)
      return Status::Error(PERSEUS_INVALID_ARGUMENT, Describe(op) + ": tags go up to MPI's " +
                                                         std::to_string(*tag_ub));
    const int count = static_cast<int>(op.bytes);
    int rc = op.recv ? MPI_Irecv(op.data, count, MPI_BYTE, op.peer, op.tag, comm, &p.request)
                     : MPI_Isend(op.data, count, MPI_BYTE, op.peer, op.tag, comm, &p.request);
    if (rc != MPI_SUCCESS) return MpiStatus(rc, op.recv ? "MPI_Irecv" : "MPI_Isend");
  }
  p.handle = handles_->Create();
  *handle = p.handle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(p);
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  }
  cv_.notify_all();
  return Status::OK();
}

void PointToPoint::TestAll(std::vector<Done>* done) {
  auto mpi = LockMpi();
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    int finished = 0;
    MPI_Status mpi_status;
    int rc = MPI_Test(&p.request, &finished, &mpi_status);
    if (rc == MPI_SUCCESS && !finished) {
      ++i;
      continue;
    }
    Status status;
    int source = p.op.recv ? mpi_status.MPI_SOURCE : p.op.peer;
    if (rc != MPI_SUCCESS) {
      status = MpiStatus(rc, p.op.recv ? "MPI_Irecv" : "MPI_Isend");
      int error_class = 0;
      MPI_Error_class(rc, &error_class);
      if (error_class == MPI_ERR_TRUNCATE)
        status = Status::Error(PERSEUS_INVALID_ARGUMENT,
                               Describe(p.op) + ": the message is larger than the " +
                                   std::to_string(p.op.bytes) + "-byte tensor");
    } else if (p.op.recv) {
      int count = 0;
      MPI_Get_count(&mpi_status, MPI_BYTE, &count);
      if (count != p.op.bytes)
        status = Status::Error(PERSEUS_INVALID_ARGUMENT,
                               Describe(p.op) + ": rank " + std::to_string(source) + " sent " +
                                   std::to_string(count) + " bytes into a tensor of " +
                                   std::to_string(p.op.bytes));
    }
    done->push_back(Done{p.handle, status, source});
    pending_[i] = pending_.back();
    pending_.pop_back();
  }
}

void PointToPoint::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
    if (stop_) return;
    std::vector<Done> done;
    TestAll(&done);
    Clock::time_point oldest = Clock::now();
    for (const Pending& p : pending_) oldest = std::min(oldest, p.posted);
    lock.unlock();
    for (Done& d : done) {
      Result result;
      result.shape = {d.source};
      handles_->Complete(d.handle, d.status, std::move(result));
    }
    lock.lock();
    if (done.empty() && !pending_.empty()) {
      // Nothing finished: pause by the wait policy (a new message wakes it sooner).
      const Clock::time_point now = Clock::now();
      auto gap = PollGap(now - oldest, SomeoneWaits() ? WaiterSpin() : kBackgroundSpin);
      if (gap > Clock::duration::zero()) cv_.wait_for(lock, gap);
    }
  }
}

void PointToPoint::Abandon(Pending* p) {
  auto mpi = LockMpi();
  if (p->op.recv) MPI_Cancel(&p->request);
  MPI_Request_free(&p->request);
}

bool PointToPoint::Withdraw(int64_t handle, const std::string& why) {
  Pending taken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.begin();
    while (it != pending_.end() && it->handle != handle) ++it;
    if (it == pending_.end()) return false;
    taken = *it;
    pending_.erase(it);
  }
  Abandon(&taken);
  handles_->Complete(handle, Status::Error(PERSEUS_WITHDRAWN,
                                           Describe(taken.op) + " did not complete " + why));
  return true;
}

bool PointToPoint::Busy(int set_id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Pending& p : pending_)
    if (p.op.set_id == set_id) return true;
  return false;
}

void PointToPoint::Close(const Status& status) {
  std::vector<Pending> taken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    taken.swap(pending_);
  }
  for (Pending& p : taken) {
    Abandon(&p);
    handles_->Complete(p.handle, Status::Error(status.code, Describe(p.op) + ": " + status.message));
  }
}

}  // namespace perseus
