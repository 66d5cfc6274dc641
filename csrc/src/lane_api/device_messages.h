// Point-to-point messages of device memory (torch's send and recv of CUDA tensors), as
// the engine sees them: it checks what every message must satisfy (a member, a peer in
// the set, a tag) and hands the message here; the lanes' side matches it with the
// peer's and runs it on the GPU (lanes/device_messages.h, over NCCL). The engine
// includes no CUDA header.
#ifndef PERSEUS_LANE_API_DEVICE_MESSAGES_H_
#define PERSEUS_LANE_API_DEVICE_MESSAGES_H_

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>

#include "common/point_to_point_op.h"
#include "common/result.h"
#include "common/status.h"

namespace perseus {

// Where a message goes: its process set as the lanes' side needs it.
struct MessageRoute {
  MPI_Comm comm;   // the set's communicator for device messages' matching (members only)
  int rank, size;  // this process's rank in the set, and the set's size
};

// The engine's handles, as the lanes' side makes and completes them.
struct MessageHandles {
  std::function<int64_t()> create;
  // A receive's result carries the source's set rank in shape[0]; a message that
  // reached the GPU carries the event recorded after its NCCL call (done_event).
  std::function<void(int64_t, const Status&, Result)> complete;
};

class DeviceMessages {
 public:
  virtual ~DeviceMessages() = default;  // fails what is outstanding, frees everything

  // Takes `op` (op.device >= 0; peer and tag checked by the engine) and makes its
  // handle, completed later through `handles`; an error makes none.
  virtual Status Post(const PointToPointOp& op, const MessageRoute& route,
                      const MessageHandles& handles, int64_t* handle) = 0;
  // Gives up on `handle` if it is one of ours and not yet matched (completed
  // PERSEUS_WITHDRAWN, ending with `why`); false for any other handle.
  virtual bool Withdraw(int64_t handle, const std::string& why) = 0;
  // Whether messages of set `set_id` wait to be matched.
  virtual bool Busy(int set_id) = 0;
  // The set is going away: nothing of it is read or sent any more (call before its
  // communicator is freed).
  virtual void Forget(int set_id) = 0;
  // Fails every outstanding message with `status` and stops (shutdown).
  virtual void Close(const Status& status) = 0;
  // The world failed (a rank died): every message outstanding, and every one posted
  // after, fails with `why`, and the lanes' side aborts what carries them (their NCCL
  // communicators, whose calls would wait for the dead rank for good), even while a
  // call of theirs is in flight. Any thread.
  virtual void Abort(const Status& why) = 0;
};

}  // namespace perseus

#endif  // PERSEUS_LANE_API_DEVICE_MESSAGES_H_
