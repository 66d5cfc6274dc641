// The rules a request must meet that its buffers do not decide: the one place each
// lives. MakeEntry applies them to every request perseus_enqueue takes; c_api.cc
// exports them (perseus_check_reduction, perseus_check_rows) to the front ends that
// must know before they enqueue: to size an output, or to refuse at the call a
// request that is enqueued later (MXNet's engine, a graph). Messages name no request;
// MakeEntry puts the request's name in front.
#ifndef PERSEUS_REQUEST_RULES_H_
#define PERSEUS_REQUEST_RULES_H_

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace perseus {

// Requests go to sets this rank (global rank `rank`) is a member of: set_rank >= 0.
Status CheckMember(int rank, int set_rank, int set_id);

// Reductions (allreduce, reducescatter; every other operation passes): a known reduce
// op; Adasum for allreduce only (PERSEUS_UNSUPPORTED) and of floating-point tensors
// only; BAND, BOR and BXOR of integer tensors only; no bool tensors. INVALID_ARGUMENT
// otherwise.
Status CheckReduction(int32_t op_type, int32_t reduce_op, int32_t dtype);

// Operations that split or gather dim 0 (allgather, alltoall, reducescatter) need one.
Status CheckDims(int32_t op_type, int32_t ndim);

// Alltoall's rows sent to each rank of a set of `set_size`, from the caller's
// `splits` (nsplits entries, or none: an even split of `rows`, which must divide).
// Given splits are one per rank and non-negative, and add up to `rows` unless rows
// < 0 (not known yet). Fills *send (may be null).
Status AlltoallSplits(int64_t rows, const int64_t* splits, int32_t nsplits, int set_size,
                      std::vector<int64_t>* send);

// This rank's rows of a reducescatter of `rows` rows: dim 0 split evenly, the first
// (rows % set_size) ranks of the set one more.
int64_t ScatterRows(int64_t rows, int set_rank, int set_size);

}  // namespace perseus

#endif  // PERSEUS_REQUEST_RULES_H_
