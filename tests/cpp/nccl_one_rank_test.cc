// The pieces a one-rank NCCL reduction is split into (cuda/nccl/nccl_one_rank.h), checked
// against a literal re-enactment of the kernel's blocks: every piece is written whole,
// the pieces add up, and no call needs more than two. Run by tests/unit/test_cpp.py;
// prints "ok" or what went wrong.
// build: -O2
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/nccl/nccl_one_rank.h"

using namespace perseus::gpu;

namespace {

int failures = 0;

// How many of `count` elements NCCL's one-rank kernel (before 2.29.7) writes: each
// block's range as the kernel computes it, clamped to count.
int64_t KernelWrites(int64_t count, int64_t esize) {
  int64_t blocks = (count * esize + (16 << 10) - 1) / (16 << 10);
  if (blocks > 32) blocks = 32;
  const int64_t pack = 16 / esize;
  int64_t written = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t i0 = b * ((count / blocks + pack - 1) / pack * pack);
    int64_t i1 = (b + 1) * ((count / blocks + pack - 1) / pack * pack);
    if (i0 > count) i0 = count;
    if (i1 > count) i1 = count;
    written += i1 - i0;
  }
  return written;
}

void Check(int64_t count, int64_t esize) {
  const bool covered = KernelWrites(count, esize) == count;
  if (OneRankKernelCovers(count, esize) != covered) {
    std::printf("FAILED: covers(%lld, %lld) says %d, the kernel %d\n", (long long)count,
                (long long)esize, !covered, covered);
    ++failures;
  }
  const std::vector<int64_t> pieces = OneRankPieces(count, esize);
  int64_t sum = 0;
  for (int64_t piece : pieces) {
    sum += piece;
    if (piece <= 0 || KernelWrites(piece, esize) != piece) {
      std::printf("FAILED: piece %lld of %lld (esize %lld) is not written whole\n",
                  (long long)piece, (long long)count, (long long)esize);
      ++failures;
    }
  }
  if (sum != count || pieces.size() > 2 || (covered && pieces.size() != 1)) {
    std::printf("FAILED: %lld (esize %lld) split into %zu pieces adding up to %lld\n",
                (long long)count, (long long)esize, pieces.size(), (long long)sum);
    ++failures;
  }
}

}  // namespace

int main() {
  // The sizes that came out wrong on an H100 with NCCL 2.28.9 (float32).
  if (OneRankKernelCovers((1 << 22) + 3, 4) || OneRankKernelCovers((1 << 22) + 5, 4) ||
      !OneRankKernelCovers((1 << 22) - 1, 4)) {
    std::printf("FAILED: the H100 cases\n");
    ++failures;
  }
  for (int64_t esize : {1, 2, 4, 8}) {
    for (int64_t count = 1; count <= 300000 && failures < 20; ++count) Check(count, esize);
    for (int64_t base : {int64_t(1) << 22, int64_t(1) << 24, int64_t(1) << 27})
      for (int64_t count = base - 2000; count <= base + 2000 && failures < 20; ++count)
        Check(count, esize);
  }
  if (failures) return 1;
  std::printf("ok\n");
  return 0;
}
