// The NCCL implementations of each operation on device buffers, one per file
// (nccl_<op>.cc), run by a device lane on its stream and communicator. They queue
// device work and return; none waits for the device.
#ifndef PERSEUS_CUDA_NCCL_OPS_H_
#define PERSEUS_CUDA_NCCL_OPS_H_

#include <vector>

#include "common/batch.h"
#include "cuda/context/device_context.h"

namespace perseus {
namespace gpu {

// The NCCL type of a Perseus dtype, or -1 (int16 and bool have none).
int NcclType(int dtype);

// Whether NCCL runs a batch with this (agreed) metadata exactly as the MPI path would;
// other GPU batches run host-staged on the same lane. Depends on agreed fields only,
// so every rank takes the same path. Staged: Adasum; BAND, BOR and BXOR; reductions of
// int16; integer reductions with scale factors (the MPI path truncates each scaled
// product); Min, Max and Product with scale factors (NCCL has no scaled form of them).
bool NcclServes(const TensorMeta& meta);

// A reduction operator for a batch: ncclSum/Avg/Min/Max/Prod, or for scaled Sum and
// Average one ncclRedOpCreatePreMulSum op of prescale * postscale (/ size for
// Average), so that scaling costs no extra pass. Average over one rank is Sum (no
// kernel at all). Destroyed with the object (allowed once the collectives given it
// have returned).
class ReduceOp {
 public:
  ReduceOp() = default;
  ~ReduceOp();
  ReduceOp(const ReduceOp&) = delete;
  ReduceOp& operator=(const ReduceOp&) = delete;
  Status Create(const TensorMeta& meta, const DeviceContext& ctx);
  ncclRedOp_t get() const { return op_; }
  // Whether NCCL computes it with a scaling kernel (PreMulSum, or ncclAvg).
  bool scales() const { return custom_ != nullptr || op_ == kNcclAvg; }

 private:
  ncclRedOp_t op_ = kNcclSum;
  const DeviceContext* custom_ = nullptr;  // set when op_ must be destroyed
};

// ncclAllReduce(in, out, count) on the lane, in the batch's launch turn; over one rank
// with an NCCL that leaves elements out of scaled one-rank reductions (nccl_one_rank.h),
// in whole pieces.
// `what` names the call in errors.
Status AllReduceWhole(const DeviceContext& ctx, const void* in, void* out, int64_t count,
                      int dtype, const ReduceOp& op, const char* what);

// Runs `batch` (NcclServes its metadata) with NCCL; `results` gets one per item.
Status RunNcclBatch(const Batch& batch, DeviceContext& ctx, std::vector<Result>* results);

Status NcclAllreduce(const Batch& batch, DeviceContext& ctx);
Status NcclBroadcast(const Batch& batch, DeviceContext& ctx);
Status NcclAllgather(const BatchItem& item, DeviceContext& ctx, Result* result);
Status NcclAlltoall(const BatchItem& item, DeviceContext& ctx, Result* result);
Status NcclReducescatter(const BatchItem& item, DeviceContext& ctx);

// Runs fn() between ncclGroupStart and ncclGroupEnd, in the batch's launch turn; the
// group is closed even when fn fails (an open group would swallow the lane's next calls).
template <typename Fn>
Status InGroup(const DeviceContext& ctx, Fn fn) {
  LaunchScope launch(ctx);  // the group is one launch (ncclGroupEnd)
  PERSEUS_RETURN_IF_ERROR(ctx.Nc(ctx.nccl->GroupStart(), "ncclGroupStart"));
  Status status = fn();
  Status end = ctx.Nc(ctx.nccl->GroupEnd(), "ncclGroupEnd");
  return status.ok() ? end : status;
}

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_NCCL_OPS_H_
