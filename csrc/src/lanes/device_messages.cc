#include "lanes/device_messages.h"

#include <mpi.h>
#include <pthread.h>

#include <utility>

#include "common/clock.h"
#include "mpi/mpi_lock.h"
#include "mpi/wait_policy.h"

namespace perseus {

NcclDeviceMessages::NcclDeviceMessages(const GpuSettings& settings, bool thread_multiple)
    : settings_(settings), thread_multiple_(thread_multiple), state_(std::make_unique<MessagePairs>(&pairs_)) {}

NcclDeviceMessages::~NcclDeviceMessages() { Close(Status::Error(PERSEUS_SHUT_DOWN, "Perseus was shut down")); }

Status NcclDeviceMessages::Post(const PointToPointOp& op, const MessageRoute& route, const MessageHandles& handles,
                                int64_t* handle) {
  const std::string what = DescribeMessage(op) + ": ";
  if (op.peer == MPI_ANY_SOURCE)
    return Status::Error(PERSEUS_UNSUPPORTED,
                         what + "a receive from any rank is not possible for GPU tensors: NCCL, which "
                                "carries them, has no wildcard receive (it must be told the peer before "
                                "anything arrives); name the source rank, or receive into a CPU tensor");
  if (op.peer == route.rank) return Status::Error(PERSEUS_INVALID_ARGUMENT, what + "the peer is this rank itself");
  if (!thread_multiple_)
    return Status::Error(PERSEUS_UNSUPPORTED, what + "GPU tensors need MPI initialized with MPI_THREAD_MULTIPLE");
  PostedMessage p;
  p.op = op;
  p.handles = handles;
  p.route = route;
  Status status = PrepareDeviceMessage(op.device, op.stream, settings_, &p.ready);
  if (!status.ok()) return Status::Error(status.code, what + status.message);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Status::Error(PERSEUS_SHUT_DOWN, "Perseus was shut down");
    if (!aborted_.ok()) return Status::Error(aborted_.code, what + aborted_.message);
    p.handle = handles.create();
    *handle = p.handle;
    outstanding_[p.handle] = op.set_id;
    inbox_.push_back(std::move(p));
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  }
  cv_.notify_all();
  return Status::OK();
}

bool NcclDeviceMessages::Withdraw(int64_t handle, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (outstanding_.count(handle) == 0) return false;
    withdrawals_.emplace_back(handle, why);
  }
  cv_.notify_all();
  return true;
}

bool NcclDeviceMessages::Busy(int set_id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& kv : outstanding_)
    if (kv.second == set_id) return true;
  return false;
}

void NcclDeviceMessages::Forget(int set_id) {
  std::vector<MessagePairs::Done> done;
  {
    std::lock_guard<std::mutex> state(state_mu_);
    state_->Drop(set_id, Status::Error(PERSEUS_INVALID_ARGUMENT, "its process set was removed"));
    done = state_->TakeDone();
  }
  for (MessagePairs::Done& d : done) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      outstanding_.erase(d.message.handle);
    }
    d.message.handles.complete(d.message.handle, d.status, Result());
  }
}

void NcclDeviceMessages::Close(const Status& status) {
  std::vector<PostedMessage> unread;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = stop_ = true;
    unread.swap(inbox_);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<MessagePairs::Done> done;
  {
    std::lock_guard<std::mutex> state(state_mu_);
    for (int id : state_->SetIds()) state_->Drop(id, status);
    done = state_->TakeDone();
  }
  for (PostedMessage& p : unread) {
    Status failed = Status::Error(status.code, DescribeMessage(p.op) + ": " + status.message);
    done.push_back(MessagePairs::Done{std::move(p), failed, nullptr});
  }
  for (MessagePairs::Done& d : done) d.message.handles.complete(d.message.handle, d.status, Result());
  std::lock_guard<std::mutex> lock(mu_);
  outstanding_.clear();
}

void NcclDeviceMessages::Abort(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || !aborted_.ok()) return;
    aborted_ = why;
  }
  pairs_.AbortAll();  // ends a call of the thread's in flight: it then fails what is left
  cv_.notify_all();
}

Status NcclDeviceMessages::Outcome(const PostedMessage& m, const Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (status.ok() || aborted_.ok()) return status;
  return Status::Error(aborted_.code, DescribeMessage(m.op) + ": " + aborted_.message);
}

void NcclDeviceMessages::Loop() {
  pthread_setname_np(pthread_self(), "perseus-gpumsg");  // for top -H, perf, gdb
  MpiCallerScope mpi_caller;
  Clock::time_point quiet_since = Clock::now();  // of the last step that moved anything
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    std::vector<PostedMessage> posts;
    posts.swap(inbox_);
    std::vector<std::pair<int64_t, std::string>> withdrawals;
    withdrawals.swap(withdrawals_);
    const Status world = aborted_;
    lock.unlock();
    bool moved;
    std::vector<MessagePairs::Done> done;
    {
      std::lock_guard<std::mutex> state(state_mu_);
      if (world.ok()) {
        moved = state_->Step(std::move(posts), withdrawals);
      } else {  // the world failed: nothing is matched or launched any more
        moved = false;
        for (int id : state_->SetIds()) state_->Drop(id, world);
        for (PostedMessage& p : posts) state_->Fail(std::move(p), world);
      }
      done = state_->TakeDone();
    }
    for (MessagePairs::Done& d : done) {
      {
        std::lock_guard<std::mutex> outstanding(mu_);
        outstanding_.erase(d.message.handle);  // before completing: Busy() is false for a done set
      }
      Result result;
      result.shape = {d.message.op.peer};
      result.done_event = std::move(d.event);
      d.message.handles.complete(d.message.handle, Outcome(d.message, d.status), std::move(result));
    }
    if (moved) quiet_since = Clock::now();
    lock.lock();
    if (stop_) break;
    if (moved || !inbox_.empty() || !withdrawals_.empty()) continue;
    if (outstanding_.empty()) {  // nothing of ours to match: what peers send waits in MPI
      cv_.wait(lock, [&] { return stop_ || !inbox_.empty() || !withdrawals_.empty(); });
      continue;
    }
    // Messages wait for their peers: pause by the wait policy (a new one wakes it sooner).
    auto gap = PollGap(Clock::now() - quiet_since, SomeoneWaits() ? kDriverSpin : kBackgroundSpin);
    if (gap > Clock::duration::zero()) cv_.wait_for(lock, gap);
  }
}

}  // namespace perseus
