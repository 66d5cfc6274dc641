#include "lanes/device_lane.h"

#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/timeline.h"

namespace perseus {

DeviceLane::DeviceLane(const LaneSpec& spec, bool thread_multiple, const GpuSettings& settings,
                       std::shared_ptr<gpu::LaunchSequence> turns)
    : index_(spec.index),
      done_(spec.done),
      runner_(gpu::DeviceRunnerArgs{spec.index, spec.set_id, spec.comm, spec.rank, spec.size, spec.global_ranks,
                                    thread_multiple, settings, std::move(turns)}),
      worker_("perseus-gpulane", [this](const Batch& batch) { Execute(batch); }) {}

DeviceLane::~DeviceLane() { worker_.Stop(); }  // then runner_ drains its stream

void DeviceLane::Push(Batch batch) { worker_.Push(std::move(batch)); }

bool DeviceLane::TryRunInline(const Batch& batch) {
  // Opening blocks in collective calls (ncclCommInitRank): only on the lane's thread.
  // A gated batch waits for grants that the thread running the engine hands out.
  if (batch.launch_gated) return false;
  return worker_.TryRunInline(batch, [this] { return runner_.open(); });
}

void DeviceLane::Execute(const Batch& batch) {
  std::vector<Result> results(batch.items.size());
  const bool traced = TimelineOn();  // spans show the host time to queue the device work
  const auto start = traced ? Clock::now() : Clock::time_point();
  Status status = runner_.Execute(batch, &results);
  if (traced) TraceLaneBatch(batch, index_, start, Clock::now());
  if (!status.ok()) {
    status.message = std::string(OpTypeName(batch.op_type())) + " of GPU tensor '" +
                     batch.items[0].meta.name + "'" +
                     (batch.items.size() > 1 ? " (and fused tensors)" : "") + ": " + status.message;
    for (Result& result : results) result.FreeData();
  }
  std::vector<Status> statuses(batch.items.size(), status);
  done_(batch, statuses, results);
}

}  // namespace perseus
