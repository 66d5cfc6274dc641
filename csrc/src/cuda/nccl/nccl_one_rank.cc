#include "cuda/nccl/nccl_one_rank.h"

#include <algorithm>

namespace perseus {
namespace gpu {

namespace {

constexpr int64_t kPackBytes = 16;
constexpr int64_t kBlockBytes = 16 << 10;
constexpr int64_t kMaxBlocks = 32;

}  // namespace

bool OneRankKernelCovers(int64_t count, int64_t esize) {
  if (count <= 0) return true;  // NCCL discards empty calls
  const int64_t per_pack = kPackBytes / esize;
  const int64_t blocks = std::min(kMaxBlocks, (count * esize + kBlockBytes - 1) / kBlockBytes);
  const int64_t per_block = (count / blocks + per_pack - 1) / per_pack * per_pack;
  return blocks * per_block >= count;
}

std::vector<int64_t> OneRankPieces(int64_t count, int64_t esize) {
  std::vector<int64_t> pieces;
  while (count > 0) {
    // A count the block count divides is covered, so this stops within a few steps;
    // what is left is under 32 elements: one block, covered.
    int64_t take = count;
    while (!OneRankKernelCovers(take, esize)) --take;
    pieces.push_back(take);
    count -= take;
  }
  return pieces;
}

}  // namespace gpu
}  // namespace perseus
