// The matching of device point-to-point messages between the members of a process set,
// as the thread of NcclDeviceMessages (lanes/device_messages.h) runs it: how the two
// ranks of a message agree, over MPI, that it meets its peer's, and in which order the
// matched ones reach NCCL.
//
// NCCL pairs a send with a receive by the order of the calls on a communicator; it has
// no tags, no wildcard and no size check, and a call nobody matches waits on the GPU
// forever. So a message reaches NCCL only once both ranks know it meets the other's.
// Each pair of members has a leader, the lower set rank, which matches its own messages
// with those its follower posts to it, as MPI would (the same tag, the other direction,
// in posting order), and tells the follower each match in turn; both launch the matched
// messages in that one order, on the pair's communicator (cuda/nccl/nccl_pair.h). What
// goes over the set's communicator for this (ProcessSet::device_p2p_comm), on one tag:
//
//   follower -> leader  kPost    a message posted (direction, tag, size)
//                       kCancel  withdrawn before it was matched
//                       kAck     a match accepted: launched here; the leader launches its side
//                       kNak     a match declined (withdrawn meanwhile, or the pair failed)
//   leader -> follower  kSchedule  a match, in the leader's order (the first one of a
//                                  pair carries the NCCL id that opens its communicator)
//                       kRefuse    a match of different sizes, or the pair failed
//
// The leader launches only what the follower accepted, so neither side launches what
// the other dropped. Unmatched messages never reach the GPU: withdrawing one (the
// group's timeout) is local to its rank, and sizes that differ fail both messages,
// each naming both sizes. Not thread-safe: one thread runs it.
#ifndef PERSEUS_LANES_MESSAGE_PAIRS_H_
#define PERSEUS_LANES_MESSAGE_PAIRS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/point_to_point_op.h"
#include "common/status.h"
#include "cuda/nccl/nccl_pair.h"
#include "lane_api/device_messages.h"

namespace perseus {

// A message as posted, until it completes.
struct PostedMessage {
  PointToPointOp op;
  int64_t handle = 0;
  MessageHandles handles;
  std::shared_ptr<void> ready;  // recorded on the framework's stream at posting
  MessageRoute route;
  std::string withdrawn;  // a leader's, withdrawn while its match waits for an answer: why
};

// "send to rank 1 (tag 0)", as errors name a message.
std::string DescribeMessage(const PointToPointOp& op);

class MessagePairs {
 public:
  // The pairs' communicators are made among `pairs` (their owner's, outliving this),
  // which another thread may abort all at once.
  explicit MessagePairs(gpu::NcclPairs* pairs) : pairs_(pairs) {}

  struct Done {
    PostedMessage message;
    Status status;
    std::shared_ptr<void> event;  // recorded after its NCCL call (none for an empty one)
  };

  // One pass: takes what was posted and withdrawn, reads what the peers sent, matches
  // and launches. Whether anything happened.
  bool Step(std::vector<PostedMessage> posts, const std::vector<std::pair<int64_t, std::string>>& withdrawals);
  // Fails what is left of set `set_id` with `status`, reads what its peers sent and
  // nobody will read, and frees its pairs (their queued GPU work finishes first).
  void Drop(int set_id, const Status& status);
  std::vector<int> SetIds() const;
  // Fails `m` with `status` (reported by TakeDone).
  void Fail(PostedMessage m, const Status& status) { done_.push_back(Done{std::move(m), status, nullptr}); }
  // The messages completed since the last call, to be reported with no lock held.
  std::vector<Done> TakeDone() { return std::move(done_); }

 private:
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
    std::deque<PostedMessage> mine;                           // leader: not matched yet
    std::deque<Theirs> theirs;                                // leader: the follower's, not matched yet
    std::deque<std::pair<PostedMessage, int64_t>> scheduled;  // leader: matched, the answer awaited
    std::map<int64_t, PostedMessage> posted;                  // follower: by handle, the leader awaited
  };
  struct Set {
    MessageRoute route;
    std::map<int, Pair> pairs;  // by the peer's set rank
  };
  struct Wire;

  Pair& PairOf(Set& set, int peer) {
    Pair& pair = set.pairs[peer];
    pair.leader = set.route.rank < peer;
    return pair;
  }
  void Take(PostedMessage p);
  bool WithdrawOne(int64_t handle, const std::string& why);
  bool Receive(Set& set);
  void OnWire(Set& set, int peer, const Wire& w);
  void Match(Set& set, int peer, Pair& pair);
  void Open(Set& set, int peer, Pair& pair, const gpu::ncclUniqueId& id, int index);
  void Launch(Pair& pair, PostedMessage m);
  Status Send(Set& set, int peer, const Wire& w);
  void Fail(PostedMessage m, perseus_status_t code, const std::string& why) {
    const std::string what = DescribeMessage(m.op) + ": " + why;
    Fail(std::move(m), Status::Error(code, what));
  }
  void Break(Set& set, int peer, Pair& pair, const Status& why);

  gpu::NcclPairs* const pairs_;
  std::map<int, Set> sets_;
  std::vector<Done> done_;
};

}  // namespace perseus

#endif  // PERSEUS_LANES_MESSAGE_PAIRS_H_
