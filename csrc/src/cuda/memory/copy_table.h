// The tables of the pack kernel (kernels/batched_copy_table.h), filled from a batch's
// copies. Arithmetic only, no CUDA call, so that it is tested on its own
// (tests/cpp/pack_kernel_test.cc).
#ifndef PERSEUS_CUDA_COPY_TABLE_H_
#define PERSEUS_CUDA_COPY_TABLE_H_

#include <cstddef>
#include <cstdint>

#include "cuda/memory/kernels/batched_copy_table.h"

namespace perseus {
namespace gpu {

// One copy of a fused batch on the device: `bytes` from `src` to `dst`, or zeros into
// `dst` when `src` is null (a joined rank's slot).
struct DeviceCopy {
  const void* src;
  void* dst;
  int64_t bytes;
};

// Where the next table starts: a copy, and how many of its bytes earlier tables hold.
struct CopyCursor {
  size_t index = 0;
  uint64_t done = 0;
};

// Fills `table` with the copies from `cursor` on, until it is full or they end: empty
// copies are left out, and one longer than PERSEUS_COPY_MAX_ENTRY_BYTES becomes
// several entries. Advances the cursor; returns the blocks to launch the table with,
// 0 when nothing was left to copy.
unsigned FillCopyTable(const DeviceCopy* copies, size_t count, CopyCursor* cursor,
                       PerseusCopyTable* table);

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_COPY_TABLE_H_
