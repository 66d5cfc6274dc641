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

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "cuda/runtime/cuda_api.h"

namespace perseus {
namespace gpu {

class NcclPair;

// The pairs of one owner (lanes/device_messages.h), which another thread may abort all
// at once when the world fails, while the messages' thread is inside an NCCL call of
// one of them (a message to the dead rank never completes) or making one's
// communicator: their communicators are aborted, never destroyed, and nothing more
// runs on them; a pair made later is aborted as soon as it is.
class NcclPairs {
 public:
  void AbortAll();  // any thread
  bool aborted() const { return aborted_.load(); }

 private:
  friend class NcclPair;
  std::mutex mu_;  // around each pair's registration, abort, and poll of its communicator
  std::vector<NcclPair*> live_;
  std::atomic<bool> aborted_{false};
};

class NcclPair {
 public:
  NcclPair(int device, NcclPairs* all);
  // Lets queued messages finish, then frees the communicator and stream (aborts the
  // communicator when the stream reports an NCCL failure; leaves it when aborted).
  ~NcclPair();
  NcclPair(const NcclPair&) = delete;
  NcclPair& operator=(const NcclPair&) = delete;

  // An id for Open, made by the pair's first rank.
  static Status NewId(ncclUniqueId* id);
  // Collective with the peer (until it calls too, or the pairs are aborted): `index` 0
  // made `id` (cuda/nccl/nccl_comm.h makes the communicator).
  Status Open(const ncclUniqueId& id, int index);
  bool open() const { return comm_ != nullptr && !aborted_.load(); }
  // Queues one message of `bytes` (> 0) at `data` on the pair's stream, after `ready`
  // (recorded on the framework's stream); *done is recorded after it.
  Status Launch(bool recv, void* data, int64_t bytes, const std::shared_ptr<void>& ready,
                std::shared_ptr<void>* done);
  // After a failure: the communicator is aborted (a peer may have left it mid-call).
  void Abort();

 private:
  friend class NcclPairs;
  void AbortLocked();  // with all_->mu_ held
  Status Drain();

  const int device_;
  NcclPairs* const all_;
  int index_ = 0;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};  // comm_ aborted: no call may use it
};

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_NCCL_PAIR_H_
