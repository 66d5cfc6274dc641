// What NCCL can run, its types and reduction operators, and the switch to each op.
#include "cuda/nccl/nccl_ops.h"

#include <cstdint>

#include "common/dtype.h"
#include "cuda/nccl/nccl_one_rank.h"

namespace perseus {
namespace gpu {

int NcclType(int dtype) {
  switch (dtype) {
    case PERSEUS_UINT8: return kNcclUint8;
    case PERSEUS_INT8: return kNcclInt8;
    case PERSEUS_INT32: return kNcclInt32;
    case PERSEUS_INT64: return kNcclInt64;
    case PERSEUS_FLOAT16: return kNcclFloat16;
    case PERSEUS_BFLOAT16: return kNcclBfloat16;
    case PERSEUS_FLOAT32: return kNcclFloat32;
    case PERSEUS_FLOAT64: return kNcclFloat64;
    default: return -1;
  }
}

bool NcclServes(const TensorMeta& meta) {
  if (meta.op_type != PERSEUS_ALLREDUCE && meta.op_type != PERSEUS_REDUCESCATTER)
    return true;  // moved as bytes: any dtype
  // NCCL has no Adasum and no bitwise operators: those go host-staged.
  if (meta.reduce_op == PERSEUS_ADASUM || IsBitwiseOp(meta.reduce_op) || NcclType(meta.dtype) < 0)
    return false;
  const bool scaled = meta.prescale != 1.0 || meta.postscale != 1.0;
  if (!scaled) return true;
  return IsFloatingDtype(meta.dtype) &&
         (meta.reduce_op == PERSEUS_SUM || meta.reduce_op == PERSEUS_AVERAGE);
}

ReduceOp::~ReduceOp() {
  // After an abort the operator went with the communicator (ncclCommAbort frees both).
  if (custom_ != nullptr && !custom_->CommAborted()) custom_->nccl->RedOpDestroy(op_, custom_->comm);
}

Status ReduceOp::Create(const TensorMeta& meta, const DeviceContext& ctx) {
  const double scale = meta.prescale * meta.postscale;
  const int reduce_op = meta.reduce_op == PERSEUS_AVERAGE && ctx.size == 1 ? PERSEUS_SUM
                                                                            : meta.reduce_op;
  switch (reduce_op) {
    case PERSEUS_MIN: op_ = kNcclMin; return Status::OK();
    case PERSEUS_MAX: op_ = kNcclMax; return Status::OK();
    case PERSEUS_PRODUCT: op_ = kNcclProd; return Status::OK();
    case PERSEUS_SUM:
      if (scale == 1.0) {
        op_ = kNcclSum;
        return Status::OK();
      }
      break;
    case PERSEUS_AVERAGE:
      if (scale == 1.0) {
        op_ = kNcclAvg;
        return Status::OK();
      }
      break;
    default:
      return Status::Error(PERSEUS_INTERNAL_ERROR,
                           std::string("no NCCL form of reduce op ") + ReduceOpName(meta.reduce_op));
  }
  // Scaled Sum/Average of a floating type (NcclServes): x * pre summed, times post
  // (and 1/size) equals the sum of x * (pre * post / size).
  const double factor = scale * (reduce_op == PERSEUS_AVERAGE ? 1.0 / ctx.size : 1.0);
  union {
    uint16_t half;
    float single;
    double dbl;
  } scalar;  // in the tensor's own type, as NCCL reads it
  switch (meta.dtype) {
    case PERSEUS_FLOAT16: scalar.half = FloatToHalf(static_cast<float>(factor)); break;
    case PERSEUS_BFLOAT16: scalar.half = FloatToBf16(static_cast<float>(factor)); break;
    case PERSEUS_FLOAT32: scalar.single = static_cast<float>(factor); break;
    case PERSEUS_FLOAT64: scalar.dbl = factor; break;
    default:
      return Status::Error(PERSEUS_INTERNAL_ERROR,
                           std::string("scaled NCCL reduction of ") + DtypeName(meta.dtype));
  }
  PERSEUS_RETURN_IF_ERROR(ctx.Nc(ctx.nccl->RedOpCreatePreMulSum(&op_, &scalar, NcclType(meta.dtype),
                                                                kNcclScalarHostImmediate, ctx.comm),
                                 "ncclRedOpCreatePreMulSum"));
  custom_ = &ctx;
  return Status::OK();
}

Status AllReduceWhole(const DeviceContext& ctx, const void* in, void* out, int64_t count,
                      int dtype, const ReduceOp& op, const char* what) {
  const ncclDataType_t type = NcclType(dtype);
  LaunchScope launch(ctx);
  const bool split = ctx.size == 1 && op.scales() && ctx.nccl->version < kNcclOneRankFixedVersion;
  if (!split) return ctx.Nc(ctx.nccl->AllReduce(in, out, count, type, op.get(), ctx.comm, ctx.stream), what);
  const int64_t esize = static_cast<int64_t>(DtypeSize(dtype));
  int64_t offset = 0;
  for (int64_t piece : OneRankPieces(count, esize)) {
    PERSEUS_RETURN_IF_ERROR(ctx.Nc(ctx.nccl->AllReduce(static_cast<const char*>(in) + offset * esize,
                                                       static_cast<char*>(out) + offset * esize,
                                                       piece, type, op.get(), ctx.comm, ctx.stream),
                                   what));
    offset += piece;
  }
  return Status::OK();
}

Status RunNcclBatch(const Batch& batch, DeviceContext& ctx, std::vector<Result>* results) {
  switch (batch.op_type()) {
    case PERSEUS_ALLREDUCE: return NcclAllreduce(batch, ctx);
    case PERSEUS_BROADCAST: return NcclBroadcast(batch, ctx);
    case PERSEUS_ALLGATHER: return NcclAllgather(batch.items[0], ctx, &(*results)[0]);
    case PERSEUS_ALLTOALL: return NcclAlltoall(batch.items[0], ctx, &(*results)[0]);
    case PERSEUS_REDUCESCATTER: return NcclReducescatter(batch.items[0], ctx);
    default:
      return Status::Error(PERSEUS_INTERNAL_ERROR, std::string("a device lane got ") +
                                                       OpTypeName(batch.op_type()));
  }
}

}  // namespace gpu
}  // namespace perseus
