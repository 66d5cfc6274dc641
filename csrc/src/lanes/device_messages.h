// Device point-to-point messages (lane_api/device_messages.h) over NCCL: what the
// engine hands over, on the callers' threads, and the one thread (perseus-gpumsg,
// started at the first message) that matches them with the peers' and launches them
// (lanes/message_pairs.h says how). It polls by the wait policy while messages of this
// process are outstanding, and sleeps otherwise. A handle completes once its message is
// queued on the GPU, with the event recorded after it, as a collective's does; a
// receive from any rank is refused, since NCCL cannot wait for whichever peer comes
// first. When the world fails (Abort) the pairs' communicators are aborted from the
// caller's thread and what is outstanding fails with the world's error.
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
#include "lanes/message_pairs.h"

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
  void Abort(const Status& why) override;

 private:
  void Loop();
  // A message's failure as it completes: the world's (Abort) once the world failed.
  Status Outcome(const PostedMessage& m, const Status& status);

  const GpuSettings settings_;
  const bool thread_multiple_;
  // What other threads hand the matching thread, and what they ask of it.
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<PostedMessage> inbox_;
  std::vector<std::pair<int64_t, std::string>> withdrawals_;
  std::map<int64_t, int> outstanding_;  // handle -> set id, until its completion
  bool stop_ = false, closed_ = false;
  Status aborted_;  // the world's failure (Abort): not OK once it failed
  // The matching; the thread holds state_mu_ while it works (Forget and Close take it
  // to reach the state between passes).
  std::mutex state_mu_;
  gpu::NcclPairs pairs_;  // what Abort reaches without state_mu_ (the thread may be inside NCCL)
  std::unique_ptr<MessagePairs> state_;
  std::thread thread_;
};

}  // namespace perseus

#endif  // PERSEUS_LANES_DEVICE_MESSAGES_H_
