#include "common/request_rules.h"

#include <string>

#include "common/dtype.h"
#include "common/list_string.h"

namespace perseus {

namespace {

Status Invalid(std::string why) { return Status::Error(PERSEUS_INVALID_ARGUMENT, std::move(why)); }

}  // namespace

Status CheckMember(int rank, int set_rank, int set_id) {
  if (set_rank >= 0) return Status::OK();
  return Invalid("this rank (" + std::to_string(rank) + ") is not a member of process set " +
                 std::to_string(set_id));
}

Status CheckReduction(int32_t op_type, int32_t reduce_op, int32_t dtype) {
  if (op_type != PERSEUS_ALLREDUCE && op_type != PERSEUS_REDUCESCATTER) return Status::OK();
  if (reduce_op < 0 || reduce_op >= PERSEUS_NUM_REDUCE_OPS)
    return Invalid("unknown reduce op " + std::to_string(reduce_op));
  if (reduce_op == PERSEUS_ADASUM && op_type != PERSEUS_ALLREDUCE)
    return Status::Error(PERSEUS_UNSUPPORTED,
                         std::string("Adasum is not supported for ") + OpTypeName(op_type));
  if (reduce_op == PERSEUS_ADASUM && !IsFloatingDtype(dtype))
    return Invalid(std::string("Adasum needs a floating-point tensor (float16, bfloat16, "
                               "float32 or float64), got ") + DtypeName(dtype));
  if (IsBitwiseOp(reduce_op) && IsFloatingDtype(dtype))
    return Invalid(std::string(ReduceOpName(reduce_op)) + " needs an integer tensor (uint8, "
                   "int8, int16, int32 or int64), got " + DtypeName(dtype));
  if (dtype == PERSEUS_BOOL)
    return Invalid(std::string(OpTypeName(op_type)) + " does not support bool tensors");
  return Status::OK();
}

Status CheckDims(int32_t op_type, int32_t ndim) {
  bool splits_dim0 = op_type == PERSEUS_ALLGATHER || op_type == PERSEUS_ALLTOALL ||
                     op_type == PERSEUS_REDUCESCATTER;
  if (splits_dim0 && ndim < 1)
    return Invalid(std::string(OpTypeName(op_type)) +
                   " needs a tensor with at least one dimension");
  return Status::OK();
}

Status AlltoallSplits(int64_t rows, const int64_t* splits, int32_t nsplits, int set_size,
                      std::vector<int64_t>* send) {
  std::vector<int64_t> given;
  if (splits == nullptr || nsplits == 0) {
    if (rows >= 0 && rows % set_size != 0)
      return Invalid("alltoall: the first dimension (" + std::to_string(rows) +
                     ") is not divisible by the process set's size (" +
                     std::to_string(set_size) + "); pass splits");
    given.assign(set_size, rows >= 0 ? rows / set_size : 0);
  } else {
    given.assign(splits, splits + nsplits);
    if (nsplits != set_size)
      return Invalid("alltoall splits has " + std::to_string(nsplits) +
                     " entries; it needs one per rank of the process set (" +
                     std::to_string(set_size) + ")");
    int64_t total = 0;
    for (int64_t s : given) {
      if (s < 0) return Invalid("alltoall splits must be non-negative, got " + ListString(given));
      total += s;
    }
    if (rows >= 0 && total != rows)
      return Invalid("alltoall splits sum to " + std::to_string(total) +
                     " but the tensor's first dimension is " + std::to_string(rows));
  }
  if (send != nullptr) *send = std::move(given);
  return Status::OK();
}

int64_t ScatterRows(int64_t rows, int set_rank, int set_size) {
  return rows / set_size + (set_rank < rows % set_size ? 1 : 0);
}

}  // namespace perseus
