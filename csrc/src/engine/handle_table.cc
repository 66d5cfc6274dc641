#include "engine/handle_table.h"

#include <chrono>
#include <cstdlib>

namespace perseus {

HandleTable::~HandleTable() {
  for (auto& kv : states_) kv.second->result.FreeData();
}

int64_t HandleTable::Create() {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t h = next_++;
  states_.emplace(h, std::make_shared<State>());
  return h;
}

std::shared_ptr<HandleTable::State> HandleTable::Find(int64_t handle) {
  auto it = states_.find(handle);
  return it == states_.end() ? nullptr : it->second;
}

void HandleTable::Complete(int64_t handle, Status status, Result result) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto s = Find(handle);
    if (!s || s->done) {
      result.FreeData();
      return;
    }
    s->status = std::move(status);
    s->result = std::move(result);
    s->done = true;
  }
  cv_.notify_all();
}

static Status Unknown(int64_t handle) {
  return Status::Error(PERSEUS_INVALID_ARGUMENT,
                       "unknown or already released handle " + std::to_string(handle));
}

Status HandleTable::Poll(int64_t handle, bool* done) {
  std::lock_guard<std::mutex> lock(mu_);
  auto s = Find(handle);
  if (!s) return Unknown(handle);
  *done = s->done;
  return Status::OK();
}

Status HandleTable::Wait(int64_t handle, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  auto s = Find(handle);
  if (!s) return Unknown(handle);
  auto ready = [&] { return s->done; };
  if (timeout_s < 0) {
    cv_.wait(lock, ready);
  } else if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), ready)) {
    return Status::Error(PERSEUS_TIMEOUT, "request still pending after " +
                                              std::to_string(timeout_s) + " s");
  }
  return s->status;
}

Status HandleTable::TakeResult(int64_t handle, Result** result) {
  std::lock_guard<std::mutex> lock(mu_);
  auto s = Find(handle);
  if (!s) return Unknown(handle);
  if (!s->done) return Status::Error(PERSEUS_INVALID_ARGUMENT, "handle is still pending");
  *result = &s->result;
  return Status::OK();
}

Status HandleTable::DoneEvent(int64_t handle, std::shared_ptr<void>* event) {
  std::lock_guard<std::mutex> lock(mu_);
  auto s = Find(handle);
  if (!s) return Unknown(handle);
  if (!s->done) return Status::Error(PERSEUS_INVALID_ARGUMENT, "handle is still pending");
  *event = s->result.done_event;
  return Status::OK();
}

Status HandleTable::Release(int64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = states_.find(handle);
  if (it == states_.end()) return Unknown(handle);
  if (!it->second->done)
    return Status::Error(PERSEUS_INVALID_ARGUMENT, "cannot release a pending handle");
  it->second->result.FreeData();  // unless the caller took ownership (data reset)
  states_.erase(it);
  return Status::OK();
}

void HandleTable::FailAll(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& kv : states_) {
      if (!kv.second->done) {
        kv.second->status = status;
        kv.second->done = true;
      }
    }
  }
  cv_.notify_all();
}

}  // namespace perseus
