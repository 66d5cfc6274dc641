// Fusion planning with CPU and GPU requests whose GPU ordinals differ by rank (rank 0
// on cuda:0, rank 1 on cuda:1): every rank must plan the same batches in the same
// order, and no batch may mix CPU with GPU tensors, or GPU allreduces with different
// scale factors (NCCL scales a fused buffer with one factor). Run by
// tests/unit/test_cpp.py; prints "ok" or what went wrong.
#include <cstdio>
#include <string>
#include <vector>

#include "engine/fusion.h"
#include "expect.h"

using namespace perseus;

namespace {

BatchItem Item(const std::string& name, int op, int dtype, int device, int64_t elements,
               double prescale = 1.0, double postscale = 1.0, int root = 0) {
  BatchItem item;
  item.meta.name = name;
  item.meta.op_type = op;
  item.meta.dtype = dtype;
  item.meta.device = device;
  item.meta.shape = {elements};
  item.meta.prescale = prescale;
  item.meta.postscale = postscale;
  item.meta.root_rank = root;
  item.entry = std::make_shared<Entry>();
  item.entry->meta = item.meta;
  return item;
}

// The agreed list as one rank holds it: its own device ordinal in every GPU request.
std::vector<BatchItem> Agreed(int gpu) {
  const int cpu = PERSEUS_CPU_DEVICE;
  return {
      Item("cpu.a", PERSEUS_ALLREDUCE, PERSEUS_FLOAT32, cpu, 100),
      Item("gpu.b", PERSEUS_ALLREDUCE, PERSEUS_FLOAT32, gpu, 100),
      Item("cpu.c", PERSEUS_ALLREDUCE, PERSEUS_FLOAT32, cpu, 50),
      Item("gpu.d", PERSEUS_ALLREDUCE, PERSEUS_FLOAT32, gpu, 10, 2.0, 1.0),
      Item("gpu.e", PERSEUS_ALLREDUCE, PERSEUS_FLOAT32, gpu, 200),
      Item("gpu.f", PERSEUS_ALLREDUCE, PERSEUS_INT32, gpu, 30),
      Item("gpu.g", PERSEUS_ALLREDUCE, PERSEUS_FLOAT32, gpu, 10, 2.0, 1.0),
      Item("gpu.bc", PERSEUS_BROADCAST, PERSEUS_INT8, gpu, 7),
      Item("cpu.bc", PERSEUS_BROADCAST, PERSEUS_FLOAT64, cpu, 7),
      Item("gpu.bc2", PERSEUS_BROADCAST, PERSEUS_FLOAT16, gpu, 9),
      Item("gpu.big", PERSEUS_ALLREDUCE, PERSEUS_FLOAT32, gpu, 1 << 22),
      Item("gpu.ag", PERSEUS_ALLGATHER, PERSEUS_FLOAT32, gpu, 3 + gpu),  // rows differ by rank
      Item("cpu.e2", PERSEUS_ALLREDUCE, PERSEUS_FLOAT32, cpu, 20, 2.0, 1.0),
  };
}

std::vector<std::vector<std::string>> Names(const std::vector<Batch>& batches) {
  std::vector<std::vector<std::string>> names;
  for (const Batch& b : batches) {
    names.emplace_back();
    for (const BatchItem& item : b.items) names.back().push_back(item.meta.name);
  }
  return names;
}

std::string Show(const std::vector<std::vector<std::string>>& plan) {
  std::string out;
  for (const auto& batch : plan) {
    out += "[";
    for (size_t i = 0; i < batch.size(); ++i) out += (i ? " " : "") + batch[i];
    out += "] ";
  }
  return out;
}

bool Together(const std::vector<std::vector<std::string>>& plan, const std::string& a,
              const std::string& b) {
  for (const auto& batch : plan) {
    bool has_a = false, has_b = false;
    for (const std::string& n : batch) {
      has_a = has_a || n == a;
      has_b = has_b || n == b;
    }
    if (has_a || has_b) return has_a && has_b;
  }
  return false;
}

}  // namespace

int main() {
  const int64_t threshold = 64 << 20, chunk = 4 << 20;
  std::vector<Batch> rank0 = PlanBatches(Agreed(0), threshold, chunk);
  std::vector<Batch> rank1 = PlanBatches(Agreed(1), threshold, chunk);
  auto plan0 = Names(rank0), plan1 = Names(rank1);
  Expect(plan0 == plan1, "ranks on cuda:0 and cuda:1 plan differently: " + Show(plan0) + "vs " +
                             Show(plan1));
  for (const Batch& b : rank0) {
    const TensorMeta& head = b.items.front().meta;
    for (const BatchItem& item : b.items) {
      Expect((item.meta.device < 0) == (head.device < 0),
             "a batch mixes CPU and GPU: " + head.name + " with " + item.meta.name);
      if (head.device >= 0 && head.op_type == PERSEUS_ALLREDUCE)
        Expect(item.meta.prescale == head.prescale && item.meta.postscale == head.postscale,
               "a GPU batch mixes scale factors: " + head.name + " with " + item.meta.name);
    }
  }
  Expect(Together(plan0, "gpu.b", "gpu.e"), "gpu.b and gpu.e should fuse: " + Show(plan0));
  Expect(Together(plan0, "gpu.d", "gpu.g"), "gpu.d and gpu.g should fuse: " + Show(plan0));
  Expect(Together(plan0, "cpu.a", "cpu.c"), "cpu.a and cpu.c should fuse: " + Show(plan0));
  Expect(Together(plan0, "cpu.a", "cpu.e2"),
         "CPU allreduces fuse whatever their scale factors: " + Show(plan0));
  Expect(Together(plan0, "gpu.bc", "gpu.bc2"), "GPU broadcasts fuse across dtypes: " + Show(plan0));
  Expect(!Together(plan0, "gpu.b", "gpu.d"), "scaled and unscaled GPU tensors fused: " + Show(plan0));
  Expect(!Together(plan0, "gpu.bc", "cpu.bc"), "CPU and GPU broadcasts fused: " + Show(plan0));
  Expect(!Together(plan0, "gpu.b", "gpu.big"), "a large tensor should run alone: " + Show(plan0));
  return Verdict();
}
