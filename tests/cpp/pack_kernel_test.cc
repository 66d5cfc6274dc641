// The pack kernel (csrc/src/cuda/memory/kernels/batched_copy.cu) run on the CPU, over tables
// filled by the core's FillCopyTable (cuda/memory/copy_table.cc): the device code itself, not
// a model of it. The kernel has no shared memory and no barrier, so its threads are
// independent and running them one after another is exact. Built with
// -fsanitize=alignment (uint4 is 16-byte aligned here as on the GPU): an access the
// kernel did not align aborts the test. Every destination byte is checked, and the
// guard bytes around each destination, and that sources are unchanged.
// build: -O1 -fsanitize=alignment,undefined -fno-sanitize-recover=all
// build-with: cuda/memory/copy_table.cc
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

// What nvcc provides, for a host compiler.
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct Index {
  unsigned x = 0, y = 0, z = 0;
};
static Index blockIdx, threadIdx, blockDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define __grid_constant__

#include "cuda/memory/kernels/batched_copy.cu"
#include "cuda/memory/copy_table.h"

using perseus::gpu::CopyCursor;
using perseus::gpu::DeviceCopy;
using perseus::gpu::FillCopyTable;

namespace {

int failures = 0;

void Fail(const char* what, size_t a, size_t b) {
  if (++failures <= 10) std::printf("FAIL: %s (%zu, %zu)\n", what, a, b);
}

// Every block of a launch, every thread of each block.
void Launch(const PerseusCopyTable& table, unsigned blocks, unsigned threads) {
  blockDim.x = threads;
  for (unsigned b = 0; b < blocks; ++b) {
    blockIdx.x = b;
    for (unsigned t = 0; t < threads; ++t) {
      threadIdx.x = t;
      perseus_batched_copy(table);
    }
  }
}

void LaunchAll(const std::vector<DeviceCopy>& copies, unsigned threads, int* launches) {
  static PerseusCopyTable table;  // 3.8 KiB: not on the stack of every call
  CopyCursor cursor;
  *launches = 0;
  while (unsigned blocks = FillCopyTable(copies.data(), copies.size(), &cursor, &table)) {
    Launch(table, blocks, threads);
    ++*launches;
  }
}

constexpr size_t kGuard = 32;
constexpr unsigned char kGuardByte = 0xA5;

// One copy (or zero fill) of `bytes` into a destination `dst_skew` bytes past a 16-byte
// boundary, from a source `src_skew` past one, with guard bytes on both sides.
struct Case {
  std::vector<unsigned char> src_buf, dst_buf, expected;
  size_t src_at = 0, dst_at = 0, bytes = 0;
  bool zeros = false;

  Case(size_t n, unsigned src_skew, unsigned dst_skew, bool zero, std::mt19937* rng)
      : src_buf(n + 2 * kGuard + 16), dst_buf(n + 2 * kGuard + 16, kGuardByte), bytes(n), zeros(zero) {
    for (auto& c : src_buf) c = static_cast<unsigned char>((*rng)());
    src_at = At(src_buf.data(), src_skew);
    dst_at = At(dst_buf.data(), dst_skew);
    for (size_t i = 0; i < n; ++i) dst_buf[dst_at + i] = static_cast<unsigned char>(~src_buf[src_at + i]);
    expected = src_buf;
  }
  static size_t At(const unsigned char* base, unsigned skew) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(base) + kGuard;
    return kGuard + (skew - p % 16 + 16) % 16;
  }
  DeviceCopy Copy() {
    return {zeros ? nullptr : src_buf.data() + src_at, dst_buf.data() + dst_at,
            static_cast<int64_t>(bytes)};
  }
  void Check(size_t index) const {
    for (size_t i = 0; i < dst_buf.size(); ++i) {
      const bool inside = i >= dst_at && i < dst_at + bytes;
      const unsigned char want = !inside ? kGuardByte : zeros ? 0 : src_buf[src_at + i - dst_at];
      if (dst_buf[i] != want) {
        Fail(inside ? "destination byte" : "guard byte written", index, i);
        return;
      }
    }
    if (src_buf != expected) Fail("source changed", index, 0);
  }
};

// Copies of many sizes and skews in one go: several launches, each entry checked.
void TestCopies(unsigned threads) {
  std::mt19937 rng(7);
  const size_t sizes[] = {0,     1,     2,     3,     15,    16,    17,     31,
                          33,    255,   4095,  4096,  4097,  32767, 32768,  32769,
                          65536, 65551, 98309, 12345, 100000, 3 * 32768 + 5};
  std::vector<Case> cases;
  size_t k = 0;
  for (size_t n : sizes)
    for (unsigned src_skew = 0; src_skew < 16; src_skew += 1)
      for (unsigned dst_skew : {0u, src_skew, (src_skew + 4) % 16, (src_skew + 8) % 16, 15u}) {
        if (n > 4096 && (src_skew % 5 != 0)) continue;  // big ones: a sample of skews
        cases.emplace_back(n, src_skew, dst_skew, ++k % 7 == 0, &rng);
      }
  std::vector<DeviceCopy> copies;
  for (Case& c : cases) copies.push_back(c.Copy());
  int launches = 0;
  LaunchAll(copies, threads, &launches);
  size_t nonempty = 0;
  for (const Case& c : cases) nonempty += c.bytes > 0;
  const int want = static_cast<int>((nonempty + PERSEUS_COPY_MAX_ENTRIES - 1) / PERSEUS_COPY_MAX_ENTRIES);
  if (launches != want) Fail("launches", launches, want);
  for (size_t i = 0; i < cases.size(); ++i) cases[i].Check(i);
}

// The tables alone (no data moves): splitting, counts, first blocks, cursor.
void TestTables() {
  PerseusCopyTable table;
  // 161 copies: 160 in the first table, 1 in the second, then nothing.
  std::vector<DeviceCopy> many(161, DeviceCopy{nullptr, reinterpret_cast<void*>(0x1000), 40000});
  CopyCursor cursor;
  unsigned blocks = FillCopyTable(many.data(), many.size(), &cursor, &table);
  if (table.count != 160 || blocks != 320) Fail("first table of 161", table.count, blocks);
  for (unsigned i = 0; i < table.count; ++i)
    if (table.first_block[i] != 2 * i) Fail("first block", i, table.first_block[i]);
  blocks = FillCopyTable(many.data(), many.size(), &cursor, &table);
  if (table.count != 1 || blocks != 2) Fail("second table of 161", table.count, blocks);
  if (FillCopyTable(many.data(), many.size(), &cursor, &table) != 0) Fail("third table", 0, 0);
  // 5 GiB + 3 bytes: split into 2 GiB, 2 GiB and 1 GiB + 3 at 2 GiB boundaries.
  char* const base = reinterpret_cast<char*>(uintptr_t{1} << 40);
  const int64_t huge = (int64_t{5} << 30) + 3;
  std::vector<DeviceCopy> one = {{base, base + (int64_t{8} << 30), huge}, {nullptr, base, 0}};
  cursor = CopyCursor();
  blocks = FillCopyTable(one.data(), one.size(), &cursor, &table);
  const uint64_t chunk = PERSEUS_COPY_CHUNK_BYTES, piece = PERSEUS_COPY_MAX_ENTRY_BYTES;
  if (table.count != 3 || blocks != (huge + chunk - 1) / chunk) Fail("split of 5 GiB", table.count, blocks);
  for (unsigned i = 0; i < 3; ++i) {
    if (table.src[i] != base + i * piece || table.dst[i] != base + (int64_t{8} << 30) + i * piece)
      Fail("piece address", i, 0);
    if (table.bytes[i] != (i < 2 ? piece : huge - 2 * piece)) Fail("piece size", i, table.bytes[i]);
    if (table.first_block[i] != i * (piece / chunk)) Fail("piece first block", i, table.first_block[i]);
  }
  if (FillCopyTable(one.data(), one.size(), &cursor, &table) != 0) Fail("after the split", 0, 0);
}

}  // namespace

int main() {
  TestTables();
  TestCopies(PERSEUS_COPY_THREADS);
  TestCopies(96);  // the kernel does not depend on the block size it is launched with
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
