// The NCCL side of device point-to-point messages between two members of a process set
// (lanes/device_messages.h matches them): a communicator of the two alone and a stream
// of its own.
//
// Why a communicator per pair and not a lane's: a lane's communicator runs the set's
// collectives in the order every member agreed, and a message between two members,
// which nobody negotiates, would land among them in a different place on each side. Why
// a stream per pair: messages of different pairs then never queue behind one another on
// the GPU (a send to one peer waiting for that peer while a receive from another, queued
// behind it, is what the other peer waits for). Not in launch order implicit: a message
// must not wait on the GPU for collectives launched before it.
#ifndef PERSEUS_CUDA_NCCL_PAIR_H_
#define PERSEUS_CUDA_NCCL_PAIR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "cuda/runtime/cuda_api.h"

namespace perseus {
namespace gpu {

class NcclPair {
 public:
  explicit NcclPair(int device) : device_(device) {}
  // Lets queued messages finish, then frees the communicator and stream (aborts the
  // communicator when the stream reports an NCCL failure).
  ~NcclPair();
  NcclPair(const NcclPair&) = delete;
  NcclPair& operator=(const NcclPair&) = delete;

  // An id for Open, made by the pair's first rank.
  static Status NewId(ncclUniqueId* id);
  // Collective with the peer (blocks until it calls too): `index` 0 made `id`.
  Status Open(const ncclUniqueId& id, int index);
  bool open() const { return comm_ != nullptr; }
  // Queues one message of `bytes` (> 0) at `data` on the pair's stream, after `ready`
  // (recorded on the framework's stream); *done is recorded after it.
  Status Launch(bool recv, void* data, int64_t bytes, const std::shared_ptr<void>& ready,
                std::shared_ptr<void>* done);
  // After a failure: the communicator is aborted (a peer may have left it mid-call).
  void Abort();

 private:
  const int device_;
  int index_ = 0;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
};

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_NCCL_PAIR_H_
