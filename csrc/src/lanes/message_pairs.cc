#include "lanes/message_pairs.h"

#include <mpi.h>

#include <algorithm>

#include "mpi/mpi_lock.h"
#include "mpi/mpi_status.h"

namespace perseus {

namespace {

enum Kind : int32_t { kPost = 1, kCancel, kAck, kNak, kSchedule, kRefuse };
constexpr int kMatchTag = 0;  // every matching message: MPI keeps them in order per pair
constexpr int kOpenTag = 1;   // each side's outcome of opening the pair's communicator

}  // namespace

// One matching message (the header's table). Fixed size: one MPI message each.
struct MessagePairs::Wire {
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

std::string DescribeMessage(const PointToPointOp& op) {
  const std::string peer = op.peer == MPI_ANY_SOURCE ? "any rank" : "rank " + std::to_string(op.peer);
  return (op.recv ? "recv from " : "send to ") + peer + " (tag " + std::to_string(op.tag) + ")";
}

Status MessagePairs::Send(Set& set, int peer, const Wire& w) {
  auto mpi = LockMpi();
  return MpiStatus(MPI_Send(&w, sizeof w, MPI_BYTE, peer, kMatchTag, set.route.comm),
                   "MPI_Send (matching a GPU message)");
}

void MessagePairs::Break(Set& set, int peer, Pair& pair, const Status& why) {
  if (pair.nccl) pair.nccl->Abort();
  if (pair.broken.ok())
    pair.broken = Status::Error(why.code, "messages of GPU memory between set ranks " +
                                              std::to_string(set.route.rank) + " and " + std::to_string(peer) +
                                              " failed: " + why.message);
}

void MessagePairs::Take(PostedMessage p) {
  Set& set = sets_[p.op.set_id];
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

bool MessagePairs::WithdrawOne(int64_t handle, const std::string& why) {
  for (auto& s : sets_) {
    for (auto& kv : s.second.pairs) {
      Pair& pair = kv.second;
      auto mine = std::find_if(pair.mine.begin(), pair.mine.end(), [&](const PostedMessage& m) { return m.handle == handle; });
      if (mine != pair.mine.end()) {  // the leader's own: nobody else knows it
        PostedMessage m = std::move(*mine);
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
        PostedMessage m = std::move(posted->second);
        pair.posted.erase(posted);
        Fail(std::move(m), PERSEUS_WITHDRAWN, "did not complete " + why);
        return true;
      }
    }
  }
  return false;  // matched meanwhile: it completes as usual
}

bool MessagePairs::Receive(Set& set) {
  bool any = false;
  while (true) {
    int flag = 0;
    MPI_Status status;
    Wire w;
    {
      auto mpi = LockMpi();
      // An error (the communicator revoked: the world failed) ends the pass: what is
      // left fails when the world's failure reaches here (DeviceMessages::Abort).
      if (MPI_Iprobe(MPI_ANY_SOURCE, kMatchTag, set.route.comm, &flag, &status) != MPI_SUCCESS || !flag) break;
      if (MPI_Recv(&w, sizeof w, MPI_BYTE, status.MPI_SOURCE, kMatchTag, set.route.comm, MPI_STATUS_IGNORE) !=
          MPI_SUCCESS)
        break;
    }
    any = true;
    OnWire(set, status.MPI_SOURCE, w);
  }
  return any;
}

void MessagePairs::OnWire(Set& set, int peer, const Wire& w) {
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
      PostedMessage m = std::move(pair.scheduled.front().first);
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
      PostedMessage m = std::move(it->second);
      pair.posted.erase(it);
      if (!sent.ok()) Break(set, peer, pair, sent);
      Launch(pair, std::move(m));
      break;
    }
    case kRefuse: {
      auto it = pair.posted.find(w.message);
      if (it == pair.posted.end()) break;  // withdrawn here meanwhile
      PostedMessage m = std::move(it->second);
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

void MessagePairs::Match(Set& set, int peer, Pair& pair) {
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
    PostedMessage m = std::move(*it);
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

void MessagePairs::Open(Set& set, int peer, Pair& pair, const gpu::ncclUniqueId& id, int index) {
  pair.opened = true;
  pair.nccl = std::make_unique<gpu::NcclPair>(pair.device, pairs_);
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

void MessagePairs::Launch(Pair& pair, PostedMessage m) {
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
  done_.push_back(Done{std::move(m), Status::OK(), std::move(event)});
}

bool MessagePairs::Step(std::vector<PostedMessage> posts,
                                     const std::vector<std::pair<int64_t, std::string>>& withdrawals) {
  bool moved = !posts.empty() || !withdrawals.empty();
  for (PostedMessage& p : posts) Take(std::move(p));
  for (const auto& w : withdrawals) WithdrawOne(w.first, w.second);
  for (auto& s : sets_) moved = Receive(s.second) || moved;
  for (auto& s : sets_)
    for (auto& kv : s.second.pairs)
      if (kv.second.leader && !kv.second.mine.empty() && !kv.second.theirs.empty()) {
        const size_t before = kv.second.mine.size();
        Match(s.second, kv.first, kv.second);
        moved = moved || kv.second.mine.size() != before;
      }
  return moved;
}

void MessagePairs::Drop(int set_id, const Status& status) {
  auto it = sets_.find(set_id);
  if (it == sets_.end()) return;
  for (auto& kv : it->second.pairs) {
    Pair& pair = kv.second;
    for (PostedMessage& m : pair.mine) Fail(std::move(m), status.code, status.message);
    for (auto& s : pair.scheduled) Fail(std::move(s.first), status.code, status.message);
    for (auto& p : pair.posted) Fail(std::move(p.second), status.code, status.message);
  }
  // What peers sent and nobody will read: a later communicator may get this one's context.
  while (true) {
    int flag = 0;
    MPI_Status probed;
    auto mpi = LockMpi();
    // An error (revoked: the world failed, the communicator goes with it) ends it too.
    if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, it->second.route.comm, &flag, &probed) != MPI_SUCCESS || !flag)
      break;
    int count = 0;
    MPI_Get_count(&probed, MPI_BYTE, &count);
    std::vector<char> sink(count > 0 ? count : 1);
    if (MPI_Recv(sink.data(), count, MPI_BYTE, probed.MPI_SOURCE, probed.MPI_TAG, it->second.route.comm,
                 MPI_STATUS_IGNORE) != MPI_SUCCESS)
      break;
  }
  sets_.erase(it);  // the pairs' queued GPU work finishes, then their communicators go
}

std::vector<int> MessagePairs::SetIds() const {
  std::vector<int> ids;
  for (const auto& s : sets_) ids.push_back(s.first);
  return ids;
}

}  // namespace perseus
