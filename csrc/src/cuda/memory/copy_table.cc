#include "cuda/memory/copy_table.h"

#include <algorithm>

namespace perseus {
namespace gpu {

// The limit on kernel parameters that every driver and device accepts.
static_assert(sizeof(PerseusCopyTable) <= 4096, "the pack kernel's table must fit in 4 KiB");
// Pieces of a split copy must start where the whole was aligned.
static_assert(PERSEUS_COPY_MAX_ENTRY_BYTES % PERSEUS_COPY_CHUNK_BYTES == 0 &&
                  PERSEUS_COPY_CHUNK_BYTES % 16 == 0,
              "split points must keep 16-byte alignment");

unsigned FillCopyTable(const DeviceCopy* copies, size_t count, CopyCursor* cursor,
                       PerseusCopyTable* table) {
  unsigned entries = 0, blocks = 0;
  while (cursor->index < count && entries < PERSEUS_COPY_MAX_ENTRIES) {
    const DeviceCopy& copy = copies[cursor->index];
    const uint64_t total = copy.bytes > 0 ? static_cast<uint64_t>(copy.bytes) : 0;
    if (cursor->done >= total) {  // this copy is in tables already (or empty): the next
      ++cursor->index;
      cursor->done = 0;
      continue;
    }
    const uint64_t piece =
        std::min<uint64_t>(total - cursor->done, PERSEUS_COPY_MAX_ENTRY_BYTES);
    table->src[entries] = copy.src ? static_cast<const char*>(copy.src) + cursor->done : nullptr;
    table->dst[entries] = static_cast<char*>(copy.dst) + cursor->done;
    table->bytes[entries] = static_cast<unsigned>(piece);
    table->first_block[entries] = blocks;
    blocks += static_cast<unsigned>((piece + PERSEUS_COPY_CHUNK_BYTES - 1) / PERSEUS_COPY_CHUNK_BYTES);
    ++entries;
    cursor->done += piece;
  }
  table->count = entries;
  return blocks;
}

}  // namespace gpu
}  // namespace perseus
