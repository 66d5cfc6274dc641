#include "cuda/context/launch_order.h"

#include <condition_variable>
#include <mutex>

namespace perseus {
namespace gpu {

namespace {

// The process's GPU: who may launch. A leaf lock: nothing is taken under it.
struct Device {
  std::mutex mu;
  std::condition_variable cv;
  bool launching = false;
};

Device& TheDevice() {
  static Device* device = new Device;  // never destroyed: lanes may outlive static destructors
  return *device;
}

}  // namespace

void LaunchTurn::Take() {
  if (sequence_ == nullptr || taken_ || passed_) return;
  Device& d = TheDevice();
  std::unique_lock<std::mutex> lock(d.mu);
  d.cv.wait(lock, [&] { return sequence_->next_ == turn_ && !d.launching; });
  d.launching = true;
  taken_ = true;
}

void LaunchTurn::Pass() {
  if (sequence_ == nullptr || passed_) return;
  Device& d = TheDevice();
  {
    std::unique_lock<std::mutex> lock(d.mu);
    if (taken_) d.launching = false;
    else d.cv.wait(lock, [&] { return sequence_->next_ == turn_; });
    sequence_->next_ = turn_ + 1;
    passed_ = true;
  }
  d.cv.notify_all();
}

}  // namespace gpu
}  // namespace perseus
