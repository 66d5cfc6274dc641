// NCCL's one-rank reductions, whole.
//
// NCCL short-cuts a communicator of one rank: a reduction is a copy, or, for an
// operator that scales (a PreMulSum; Average of floats, which NCCL turns into one), a
// kernel of bn = min(32, ceil(bytes / 16 KiB)) blocks, block b covering elements
// [b * per, (b + 1) * per) with per = floor(count / bn) rounded up to whole 16-byte
// packs. Before NCCL 2.29.7 nothing covers the rest when that falls short of count
// (NVIDIA/nccl#1950): the last elements of the output are silently left as they were,
// e.g. 3 of 4,194,307 float32 elements. Such a call is made in pieces the kernel
// covers whole (at most two). Pure functions: tests/cpp/nccl_one_rank_test.cc.
#ifndef PERSEUS_CUDA_NCCL_ONE_RANK_H_
#define PERSEUS_CUDA_NCCL_ONE_RANK_H_

#include <cstdint>
#include <vector>

namespace perseus {
namespace gpu {

constexpr int kNcclOneRankFixedVersion = 22907;  // NCCL 2.29.7

// Whether the one-rank kernel writes all `count` elements of `esize` bytes.
bool OneRankKernelCovers(int64_t count, int64_t esize);

// Counts that add up to `count`, each covered by the kernel, in order.
std::vector<int64_t> OneRankPieces(int64_t count, int64_t esize);

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_NCCL_ONE_RANK_H_
