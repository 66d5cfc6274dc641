// Point-to-point messages (torch's send and recv) between members of a process set.
//
// Unlike collectives they are not negotiated: MPI matches a send with a receive by
// source and tag, in posting order, over a communicator of the set's own
// (ProcessSet::p2p_comm), so they never meet the set's collectives or another set's
// messages. A thread of this class's own (started at the first message) tests the
// outstanding requests by the wait policy and completes their handles.
#ifndef PERSEUS_POINT_TO_POINT_H_
#define PERSEUS_POINT_TO_POINT_H_

#include <mpi.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/point_to_point_op.h"
#include "common/status.h"
#include "engine/handle_table.h"

namespace perseus {

class PointToPoint {
 public:
  explicit PointToPoint(HandleTable* handles) : handles_(handles) {}
  // Fails what is outstanding (Close) and stops the thread.
  ~PointToPoint();

  // Posts `op` on `comm` (the set's p2p communicator; `set_rank` is this process's
  // rank there) and makes its handle. A receive's result carries the source's set rank
  // in shape[0].
  Status Post(const PointToPointOp& op, MPI_Comm comm, int set_rank, int64_t* handle);
  // Gives up on the message of `handle`, if it is one of ours and still outstanding: a
  // receive is cancelled, a send fails now (MPI may still deliver it). Its handle
  // fails with PERSEUS_WITHDRAWN, naming the peer and ending with `why`.
  bool Withdraw(int64_t handle, const std::string& why);
  // Whether messages of set `set_id` are outstanding.
  bool Busy(int set_id);
  // Fails every outstanding message with `status` (shutdown).
  void Close(const Status& status);

 private:
  struct Pending {
    PointToPointOp op;
    int64_t handle;
    MPI_Request request;
    Clock::time_point posted;
  };
  struct Done {
    int64_t handle;
    Status status;
    int source;
  };

  void Loop();
  // Tests each request once (mu_ held); the finished ones leave pending_ for *done.
  void TestAll(std::vector<Done>* done);
  // Abandons p's request: a receive is cancelled (MPI stops writing into its buffer).
  static void Abandon(Pending* p);
  static std::string Describe(const PointToPointOp& op);

  HandleTable* handles_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending> pending_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace perseus

#endif  // PERSEUS_POINT_TO_POINT_H_
