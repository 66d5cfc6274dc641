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

void CrossSetOrder::Begin(int64_t ungated) {
  std::lock_guard<std::mutex> lock(TheDevice().mu);
  ungated_total_ = ungated;
}

void CrossSetOrder::Grant(const std::vector<LaunchGrant>& grants) {
  if (grants.empty()) return;
  Device& d = TheDevice();
  {
    std::lock_guard<std::mutex> lock(d.mu);
    grants_.insert(grants_.end(), grants.begin(), grants.end());
  }
  d.cv.notify_all();
}

void CrossSetOrder::End() {
  Device& d = TheDevice();
  {
    std::lock_guard<std::mutex> lock(d.mu);
    ended_ = true;
    grants_.clear();
  }
  d.cv.notify_all();
}

bool CrossSetOrder::Heads(int set_id, int64_t turn) const {
  return !grants_.empty() && grants_.front().set_id == set_id && grants_.front().from == turn;
}

bool CrossSetOrder::MayLaunch(int set_id, int64_t turn) const {
  return ended_ || (ungated_passed_ >= ungated_total_ && Heads(set_id, turn));
}

void CrossSetOrder::Launched(int set_id, int64_t turn) {
  if (Heads(set_id, turn) && ++grants_.front().from == grants_.front().to) grants_.pop_front();
}

bool LaunchTurn::Reached() const {
  if (sequence_->next_ != turn_) return false;
  return !gated_ || sequence_->across_->MayLaunch(sequence_->set_id_, turn_);
}

void LaunchTurn::Take() {
  if (sequence_ == nullptr || taken_ || passed_) return;
  Device& d = TheDevice();
  std::unique_lock<std::mutex> lock(d.mu);
  d.cv.wait(lock, [&] { return Reached() && !d.launching; });
  d.launching = true;
  taken_ = true;
}

void LaunchTurn::Pass() {
  if (sequence_ == nullptr || passed_) return;
  Device& d = TheDevice();
  {
    std::unique_lock<std::mutex> lock(d.mu);
    if (taken_) d.launching = false;
    else d.cv.wait(lock, [&] { return Reached(); });
    sequence_->next_ = turn_ + 1;
    CrossSetOrder& across = *sequence_->across_;
    if (gated_) across.Launched(sequence_->set_id_, turn_);
    else ++across.ungated_passed_;
    passed_ = true;
  }
  d.cv.notify_all();
}

SoloLaunch::SoloLaunch() {
  Device& d = TheDevice();
  std::unique_lock<std::mutex> lock(d.mu);
  d.cv.wait(lock, [&] { return !d.launching; });
  d.launching = true;
}

SoloLaunch::~SoloLaunch() {
  Device& d = TheDevice();
  {
    std::lock_guard<std::mutex> lock(d.mu);
    d.launching = false;
  }
  d.cv.notify_all();
}

}  // namespace gpu
}  // namespace perseus
