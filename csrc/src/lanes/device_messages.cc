#include "lanes/device_messages.h"

#include <mpi.h>
#include <pthread.h>

#include <algorithm>
#include <deque>
#include <utility>

#include "common/clock.h"
#include "cuda/nccl/nccl_pair.h"
#include "mpi/mpi_lock.h"
#include "mpi/mpi_status.h"
#include "mpi/wait_policy.h"

namespace perseus {

namespace {

enum Kind : int32_t { kPost = 1, kCancel, kAck, kNak, kSchedule, kRefuse };
constexpr int kMatchTag = 0;  // every matching message: MPI keeps them in order per pair
constexpr int kOpenTag = 1;   // each side's outcome of opening the pair's communicator

// One matching message (the header's table). Fixed size: one MPI message each.
struct Wire {
  int32_t kind = 0;
  int32_t recv = 0;     // kPost: the follower's message is a receive
  int32_t tag = 0;      // kPost
  int32_t open = 0;     // kSchedule: `id` opens the pair's communicator
  int32_t failed = 0;   // kNak, kRefuse: the pair failed (not a withdrawal, not sizes)
  int32_t unused = 0;
  int64_t bytes = 0;    // kPost: the message's size; kRefuse: the leader's
  int64_t message = 0;  // the follower's message: its handle there
  gpu::ncclUniqueId id{};
};

std::string Describe(const PointToPointOp& op) {
  const std::string peer = op.peer == MPI_ANY_SOURCE ? "any rank" : "rank " + std::to_string(op.peer);
  return (op.recv ? "recv from " : "send to ") + peer + " (tag " + std::to_string(op.tag) + ")";
}

}  // namespace

struct NcclDeviceMessages::Posted {
  PointToPointOp op;
  int64_t handle = 0;
  MessageHandles handles;
  std::shared_ptr<void> ready;  // recorded on the framework's stream at posting
  MessageRoute route;
  std::string withdrawn;  // a leader's, withdrawn while its match waits for an answer: why
};

// Everything the matching thread keeps: per set, per peer (set rank), a Pair.
struct NcclDeviceMessages::State {
  struct Theirs {  // a follower's message, as the leader knows it
    int64_t message;
    bool recv;
    int tag;
    int64_t bytes;
  };
  struct Pair {
    bool leader = false;
    int device = -1;
    std::unique_ptr<gpu::NcclPair> nccl;
    bool opened = false;  // opening was tried
    Status broken;        // why every later message of the pair fails
    std::deque<Posted> mine;                           // leader: not matched yet
    std::deque<Theirs> theirs;                         // leader: the follower's, not matched yet
    std::deque<std::pair<Posted, int64_t>> scheduled;  // leader: matched, the answer awaited
    std::map<int64_t, Posted> posted;                  // follower: by handle, the leader awaited
  };
  struct Set {
    MessageRoute route;
    std::map<int, Pair> pairs;
  };
  struct Done {
    Posted message;
    Status status;
    std::shared_ptr<void> event;
  };

  std::map<int, Set> sets;
  std::vector<Done> done;  // completed during a step, reported after it

  // One pass: takes what was posted and withdrawn, reads what the peers sent, matches.
  // Whether anything happened.
  bool Step(std::vector<Posted> posts, const std::vector<std::pair<int64_t, std::string>>& withdrawals);
  // Fails what is left (shutdown, a set going away) and frees the sets' pairs.
  void Drop(int set_id, const Status& status);

 private:
  Pair& PairOf(Set& set, int peer) {
    Pair& pair = set.pairs[peer];
    pair.leader = set.route.rank < peer;
    return pair;
  }
  void Take(Posted p);
  bool WithdrawOne(int64_t handle, const std::string& why);
  bool Receive(Set& set);
  void OnWire(Set& set, int peer, const Wire& w);
  void Match(Set& set, int peer, Pair& pair);
  void Open(Set& set, int peer, Pair& pair, const gpu::ncclUniqueId& id, int index);
  void Launch(Pair& pair, Posted m);
  Status Send(Set& set, int peer, const Wire& w);
  void Fail(Posted m, const Status& status) { done.push_back(Done{std::move(m), status, nullptr}); }
  void Fail(Posted m, perseus_status_t code, const std::string& why) {
    const std::string what = Describe(m.op) + ": " + why;
    Fail(std::move(m), Status::Error(code, what));
  }
  void Break(Set& set, int peer, Pair& pair, const Status& why);
};

// ---- the matching thread's state ---------------------------------------------------

Status NcclDeviceMessages::State::Send(Set& set, int peer, const Wire& w) {
  auto mpi = LockMpi();
  return MpiStatus(MPI_Send(&w, sizeof w, MPI_BYTE, peer, kMatchTag, set.route.comm),
                   "MPI_Send (matching a GPU message)");
}

void NcclDeviceMessages::State::Break(Set& set, int peer, Pair& pair, const Status& why) {
  if (pair.nccl) pair.nccl->Abort();
  if (pair.broken.ok())
    pair.broken = Status::Error(why.code, "messages of GPU memory between set ranks " +
                                              std::to_string(set.route.rank) + " and " + std::to_string(peer) +
                                              " failed: " + why.message);
}

void NcclDeviceMessages::State::Take(Posted p) {
  Set& set = sets[p.op.set_id];
  if (set.pairs.empty()) set.route = p.route;
  const int peer = p.op.peer;
  Pair& pair = PairOf(set, peer);
  if (pair.device < 0) pair.device = p.op.device;
  if (!pair.broken.ok()) return Fail(std::move(p), pair.broken.code, pair.broken.message);
  if (pair.leader) {
    pair.mine.push_back(std::move(p));
    return;
  }
  Wire w;
  w.kind = kPost;
  w.recv = p.op.recv ? 1 : 0;
  w.tag = p.op.tag;
  w.bytes = p.op.bytes;
  w.message = p.handle;
  Status sent = Send(set, peer, w);
  if (!sent.ok()) return Fail(std::move(p), sent.code, sent.message);
  const int64_t handle = p.handle;
  pair.posted.emplace(handle, std::move(p));
}

bool NcclDeviceMessages::State::WithdrawOne(int64_t handle, const std::string& why) {
  for (auto& s : sets) {
    for (auto& kv : s.second.pairs) {
      Pair& pair = kv.second;
      auto mine = std::find_if(pair.mine.begin(), pair.mine.end(), [&](const Posted& m) { return m.handle == handle; });
      if (mine != pair.mine.end()) {  // the leader's own: nobody else knows it
        Posted m = std::move(*mine);
        pair.mine.erase(mine);
        Fail(std::move(m), PERSEUS_WITHDRAWN, "did not complete " + why);
        return true;
      }
      for (auto& waiting : pair.scheduled) {  // decided by the follower's answer
        if (waiting.first.handle != handle) continue;
        waiting.first.withdrawn = why;
        return true;
      }
      auto posted = pair.posted.find(handle);
      if (posted != pair.posted.end()) {  // the leader drops it, or declines its match (kNak)
        Wire w;
        w.kind = kCancel;
        w.message = handle;
        Send(s.second, kv.first, w);
        Posted m = std::move(posted->second);
        pair.posted.erase(posted);
        Fail(std::move(m), PERSEUS_WITHDRAWN, "did not complete " + why);
        return true;
      }
    }
  }
  return false;  // matched meanwhile: it completes as usual
}

bool NcclDeviceMessages::State::Receive(Set& set) {
  bool any = false;
  while (true) {
    int flag = 0;
    MPI_Status status;
    Wire w;
    {
      auto mpi = LockMpi();
      MPI_Iprobe(MPI_ANY_SOURCE, kMatchTag, set.route.comm, &flag, &status);
      if (!flag) break;
      MPI_Recv(&w, sizeof w, MPI_BYTE, status.MPI_SOURCE, kMatchTag, set.route.comm, MPI_STATUS_IGNORE);
    }
    any = true;
    OnWire(set, status.MPI_SOURCE, w);
  }
  return any;
}

void NcclDeviceMessages::State::OnWire(Set& set, int peer, const Wire& w) {
  Pair& pair = PairOf(set, peer);
  const std::string them = "rank " + std::to_string(peer);
  switch (w.kind) {
    case kPost:
      pair.theirs.push_back(Theirs{w.message, w.recv != 0, w.tag, w.bytes});
      break;
    case kCancel: {
      auto it = std::find_if(pair.theirs.begin(), pair.theirs.end(),
                             [&](const Theirs& t) { return t.message == w.message; });
      if (it != pair.theirs.end()) pair.theirs.erase(it);  // else matched first: its kNak follows
      break;
    }
    case kAck:
    case kNak: {
      if (pair.scheduled.empty() || pair.scheduled.front().second != w.message) {
        Break(set, peer, pair, Status::Error(PERSEUS_INTERNAL_ERROR, "an answer out of order from " + them));
        for (auto& waiting : pair.scheduled) Fail(std::move(waiting.first), pair.broken.code, pair.broken.message);
        pair.scheduled.clear();
        break;
      }
      Posted m = std::move(pair.scheduled.front().first);
      pair.scheduled.pop_front();
      if (w.kind == kAck) {
        Launch(pair, std::move(m));
      } else if (w.failed) {
        Fail(std::move(m), PERSEUS_INTERNAL_ERROR, them + " could not run it: its side of the pair failed");
      } else if (!m.withdrawn.empty()) {
        const std::string why = m.withdrawn;
        Fail(std::move(m), PERSEUS_WITHDRAWN, "did not complete " + why);
      } else {
        // Its match was withdrawn there meanwhile, which for this message is as if it
        // had never been posted: it waits for the next one, first of its tag and
        // direction (a later one may have been matched meanwhile: MPI's non-overtaking
        // does not hold across such a withdrawal).
        pair.mine.push_front(std::move(m));
      }
      break;
    }
    case kSchedule: {
      auto it = pair.posted.find(w.message);
      const bool take = it != pair.posted.end() && pair.broken.ok();
      Wire answer;
      answer.kind = take ? kAck : kNak;
      answer.message = w.message;
      answer.failed = pair.broken.ok() ? 0 : 1;
      Status sent = Send(set, peer, answer);
      if (w.open) Open(set, peer, pair, w.id, 1);  // the leader waits for it, accepted or not
      if (it == pair.posted.end()) break;           // withdrawn here: declined
      Posted m = std::move(it->second);
      pair.posted.erase(it);
      if (!sent.ok()) Break(set, peer, pair, sent);
      Launch(pair, std::move(m));
      break;
    }
    case kRefuse: {
      auto it = pair.posted.find(w.message);
      if (it == pair.posted.end()) break;  // withdrawn here meanwhile
      Posted m = std::move(it->second);
      pair.posted.erase(it);
      if (w.failed) {
        Fail(std::move(m), PERSEUS_INTERNAL_ERROR, them + "'s side of the pair failed");
      } else if (m.op.recv) {
        Fail(std::move(m), PERSEUS_INVALID_ARGUMENT,
             them + " sends " + std::to_string(w.bytes) + " bytes into a tensor of " + std::to_string(m.op.bytes) +
                 "; nothing was received");
      } else {
        Fail(std::move(m), PERSEUS_INVALID_ARGUMENT,
             them + " receives into a tensor of " + std::to_string(w.bytes) + " bytes, this one has " +
                 std::to_string(m.op.bytes) + "; nothing was sent");
      }
      break;
    }
    default:
      Break(set, peer, pair, Status::Error(PERSEUS_INTERNAL_ERROR, "an unknown message from " + them));
  }
}

void NcclDeviceMessages::State::Match(Set& set, int peer, Pair& pair) {
  for (auto it = pair.mine.begin(); it != pair.mine.end();) {
    // MPI's rule: the follower's first message of this tag going the other way.
    auto t = std::find_if(pair.theirs.begin(), pair.theirs.end(), [&](const Theirs& x) {
      return x.recv != it->op.recv && x.tag == it->op.tag;
    });
    if (t == pair.theirs.end()) {
      ++it;
      continue;
    }
    const Theirs theirs = *t;
    pair.theirs.erase(t);
    Posted m = std::move(*it);
    it = pair.mine.erase(it);
    Wire w;
    w.message = theirs.message;
    if (!pair.opened && pair.broken.ok()) {  // the pair's first match opens its communicator
      Status made = gpu::NcclPair::NewId(&w.id);
      if (!made.ok()) Break(set, peer, pair, made);
    }
    if (!pair.broken.ok() || theirs.bytes != m.op.bytes) {  // both fail, nothing reaches NCCL
      w.kind = kRefuse;
      w.failed = pair.broken.ok() ? 0 : 1;
      w.bytes = m.op.bytes;
      Send(set, peer, w);
      const std::string them = "rank " + std::to_string(peer);
      if (!pair.broken.ok()) {
        Fail(std::move(m), pair.broken.code, pair.broken.message);
      } else if (m.op.recv) {
        Fail(std::move(m), PERSEUS_INVALID_ARGUMENT,
             them + " sends " + std::to_string(theirs.bytes) + " bytes into a tensor of " +
                 std::to_string(m.op.bytes) + "; nothing was received");
      } else {
        Fail(std::move(m), PERSEUS_INVALID_ARGUMENT,
             them + " receives into a tensor of " + std::to_string(theirs.bytes) + " bytes, this one has " +
                 std::to_string(m.op.bytes) + "; nothing was sent");
      }
      continue;
    }
    w.kind = kSchedule;
    w.open = pair.opened ? 0 : 1;
    Status sent = Send(set, peer, w);
    if (!sent.ok()) {
      Break(set, peer, pair, sent);
      Fail(std::move(m), pair.broken.code, pair.broken.message);
      continue;
    }
    if (w.open) Open(set, peer, pair, w.id, 0);
    pair.scheduled.emplace_back(std::move(m), theirs.message);
  }
}

void NcclDeviceMessages::State::Open(Set& set, int peer, Pair& pair, const gpu::ncclUniqueId& id, int index) {
  pair.opened = true;
  pair.nccl = std::make_unique<gpu::NcclPair>(pair.device);
  Status local = pair.nccl->Open(id, index);
  // Both learn whether both opened, so neither launches on a communicator the other lacks.
  char mine = local.ok() ? 1 : 0, theirs = 0;
  Status exchanged;
  {
    auto mpi = LockMpi();
    exchanged = MpiStatus(MPI_Sendrecv(&mine, 1, MPI_CHAR, peer, kOpenTag, &theirs, 1, MPI_CHAR, peer, kOpenTag,
                                       set.route.comm, MPI_STATUS_IGNORE),
                          "MPI_Sendrecv (opening NCCL for GPU messages)");
  }
  if (!local.ok())
    return Break(set, peer, pair,
                 Status::Error(local.code, local.message + " (ranks that share a GPU need NCCL 2.30 or later with "
                                                           "NCCL_MULTI_RANK_GPU_ENABLE=1 for this)"));
  if (!exchanged.ok()) return Break(set, peer, pair, exchanged);
  if (!theirs)
    Break(set, peer, pair,
          Status::Error(PERSEUS_INTERNAL_ERROR, "opening its NCCL communicator failed on rank " + std::to_string(peer)));
}

void NcclDeviceMessages::State::Launch(Pair& pair, Posted m) {
  if (!pair.broken.ok()) return Fail(std::move(m), pair.broken.code, pair.broken.message);
  if (!pair.nccl || !pair.nccl->open())
    return Fail(std::move(m), PERSEUS_INTERNAL_ERROR, "its pair's NCCL communicator was never opened");
  std::shared_ptr<void> event;
  if (m.op.bytes > 0) {  // an empty message matched and ended here: nothing for NCCL
    Status launched = pair.nccl->Launch(m.op.recv, m.op.data, m.op.bytes, m.ready, &event);
    if (!launched.ok()) {
      pair.nccl->Abort();
      pair.broken = Status::Error(launched.code, "an earlier message's NCCL call failed: " + launched.message);
      return Fail(std::move(m), launched.code, launched.message);
    }
  }
  done.push_back(Done{std::move(m), Status::OK(), std::move(event)});
}

bool NcclDeviceMessages::State::Step(std::vector<Posted> posts,
                                     const std::vector<std::pair<int64_t, std::string>>& withdrawals) {
  bool moved = !posts.empty() || !withdrawals.empty();
  for (Posted& p : posts) Take(std::move(p));
  for (const auto& w : withdrawals) WithdrawOne(w.first, w.second);
  for (auto& s : sets) moved = Receive(s.second) || moved;
  for (auto& s : sets)
    for (auto& kv : s.second.pairs)
      if (kv.second.leader && !kv.second.mine.empty() && !kv.second.theirs.empty()) {
        const size_t before = kv.second.mine.size();
        Match(s.second, kv.first, kv.second);
        moved = moved || kv.second.mine.size() != before;
      }
  return moved;
}

void NcclDeviceMessages::State::Drop(int set_id, const Status& status) {
  auto it = sets.find(set_id);
  if (it == sets.end()) return;
  for (auto& kv : it->second.pairs) {
    Pair& pair = kv.second;
    for (Posted& m : pair.mine) Fail(std::move(m), status.code, status.message);
    for (auto& s : pair.scheduled) Fail(std::move(s.first), status.code, status.message);
    for (auto& p : pair.posted) Fail(std::move(p.second), status.code, status.message);
  }
  // What peers sent and nobody will read: a later communicator may get this one's context.
  while (true) {
    int flag = 0;
    MPI_Status probed;
    auto mpi = LockMpi();
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, it->second.route.comm, &flag, &probed);
    if (!flag) break;
    int count = 0;
    MPI_Get_count(&probed, MPI_BYTE, &count);
    std::vector<char> sink(count > 0 ? count : 1);
    MPI_Recv(sink.data(), count, MPI_BYTE, probed.MPI_SOURCE, probed.MPI_TAG, it->second.route.comm,
             MPI_STATUS_IGNORE);
  }
  sets.erase(it);  // the pairs' queued GPU work finishes, then their communicators go
}

// ---- the interface -------------------------------------------------------------------

NcclDeviceMessages::NcclDeviceMessages(const GpuSettings& settings, bool thread_multiple)
    : settings_(settings), thread_multiple_(thread_multiple), state_(std::make_unique<State>()) {}

NcclDeviceMessages::~NcclDeviceMessages() { Close(Status::Error(PERSEUS_SHUT_DOWN, "Perseus was shut down")); }

Status NcclDeviceMessages::Post(const PointToPointOp& op, const MessageRoute& route, const MessageHandles& handles,
                                int64_t* handle) {
  const std::string what = Describe(op) + ": ";
  if (op.peer == MPI_ANY_SOURCE)
    return Status::Error(PERSEUS_UNSUPPORTED,
                         what + "a receive from any rank is not possible for GPU tensors: NCCL, which "
                                "carries them, has no wildcard receive (it must be told the peer before "
                                "anything arrives); name the source rank, or receive into a CPU tensor");
  if (op.peer == route.rank) return Status::Error(PERSEUS_INVALID_ARGUMENT, what + "the peer is this rank itself");
  if (!thread_multiple_)
    return Status::Error(PERSEUS_UNSUPPORTED, what + "GPU tensors need MPI initialized with MPI_THREAD_MULTIPLE");
  Posted p;
  p.op = op;
  p.handles = handles;
  p.route = route;
  Status status = PrepareDeviceMessage(op.device, op.stream, settings_, &p.ready);
  if (!status.ok()) return Status::Error(status.code, what + status.message);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Status::Error(PERSEUS_SHUT_DOWN, "Perseus was shut down");
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
  std::vector<State::Done> done;
  {
    std::lock_guard<std::mutex> state(state_mu_);
    state_->Drop(set_id, Status::Error(PERSEUS_INVALID_ARGUMENT, "its process set was removed"));
    done.swap(state_->done);
  }
  for (State::Done& d : done) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      outstanding_.erase(d.message.handle);
    }
    d.message.handles.complete(d.message.handle, d.status, Result());
  }
}

void NcclDeviceMessages::Close(const Status& status) {
  std::vector<Posted> unread;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = stop_ = true;
    unread.swap(inbox_);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<State::Done> done;
  {
    std::lock_guard<std::mutex> state(state_mu_);
    std::vector<int> ids;
    for (const auto& s : state_->sets) ids.push_back(s.first);
    for (int id : ids) state_->Drop(id, status);
    done.swap(state_->done);
  }
  for (Posted& p : unread) {
    Status failed = Status::Error(status.code, Describe(p.op) + ": " + status.message);
    done.push_back(State::Done{std::move(p), failed, nullptr});
  }
  for (State::Done& d : done) d.message.handles.complete(d.message.handle, d.status, Result());
  std::lock_guard<std::mutex> lock(mu_);
  outstanding_.clear();
}

void NcclDeviceMessages::Loop() {
  pthread_setname_np(pthread_self(), "perseus-gpumsg");  // for top -H, perf, gdb
  MpiCallerScope mpi_caller;
  Clock::time_point quiet_since = Clock::now();  // of the last step that moved anything
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    std::vector<Posted> posts;
    posts.swap(inbox_);
    std::vector<std::pair<int64_t, std::string>> withdrawals;
    withdrawals.swap(withdrawals_);
    lock.unlock();
    bool moved;
    std::vector<State::Done> done;
    {
      std::lock_guard<std::mutex> state(state_mu_);
      moved = state_->Step(std::move(posts), withdrawals);
      done.swap(state_->done);
    }
    for (State::Done& d : done) {
      {
        std::lock_guard<std::mutex> outstanding(mu_);
        outstanding_.erase(d.message.handle);  // before completing: Busy() is false for a done set
      }
      Result result;
      result.shape = {d.message.op.peer};
      result.done_event = std::move(d.event);
      d.message.handles.complete(d.message.handle, d.status, std::move(result));
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
