// Device point-to-point messages (lane_api/device_messages.h) over NCCL: how the two
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
// each naming both sizes. A receive from any rank is refused: NCCL cannot wait for
// whichever peer comes first.
//
// One thread (started at the first message) does the matching and the launches; it
// polls by the wait policy while messages of this process are outstanding, and sleeps
// otherwise. A handle completes once its message is queued on the GPU (with the event
// recorded after it), as a collective's does.
#ifndef PERSEUS_LANES_DEVICE_MESSAGES_H_
#define PERSEUS_LANES_DEVICE_MESSAGES_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device_backend.h"
#include "lane_api/device_messages.h"

namespace perseus {

class NcclDeviceMessages : public DeviceMessages {
 public:
  NcclDeviceMessages(const GpuSettings& settings, bool thread_multiple);
  ~NcclDeviceMessages() override;

  Status Post(const PointToPointOp& op, const MessageRoute& route, const MessageHandles& handles,
              int64_t* handle) override;
  bool Withdraw(int64_t handle, const std::string& why) override;
  bool Busy(int set_id) override;
  void Forget(int set_id) override;
  void Close(const Status& status) override;

  struct State;  // the matching thread's (device_messages.cc)

 private:
  struct Posted;
  void Loop();

  const GpuSettings settings_;
  const bool thread_multiple_;
  // What other threads hand the matching thread, and what they ask of it.
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Posted> inbox_;
  std::vector<std::pair<int64_t, std::string>> withdrawals_;
  std::map<int64_t, int> outstanding_;  // handle -> set id, until its completion
  bool stop_ = false, closed_ = false;
  // The matching state; the thread holds state_mu_ while it works (Forget and Close
  // take it to reach the state between steps).
  std::mutex state_mu_;
  std::unique_ptr<State> state_;
  std::thread thread_;
};

}  // namespace perseus

#endif  // PERSEUS_LANES_DEVICE_MESSAGES_H_
