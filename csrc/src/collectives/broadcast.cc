// Broadcast over MPI, byte-wise: one large tensor straight into its output, small
// ones fused window by window.
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/fused_windows.h"
#include "common/dtype.h"
#include "mpi/wait_policy.h"

namespace perseus {

namespace {

// A broadcast batch is treated as bytes, so tensors of any dtype fuse together.
Batch AsBytes(const Batch& batch) {
  Batch bytes = batch;
  for (BatchItem& item : bytes.items) {
    item.meta.shape = {item.meta.NumElements() * static_cast<int64_t>(DtypeSize(item.meta.dtype))};
    item.meta.dtype = PERSEUS_UINT8;
  }
  return bytes;
}

}  // namespace

Status RunBroadcast(const Batch& batch, ExecContext& ctx) {
  const int root = batch.items.front().meta.root_rank;
  const bool is_root = ctx.rank == root;
  const int64_t window = ctx.chunk_bytes;
  auto bcast = [&](char* data, int64_t count) {
    MPI_Request request;
    return CompleteRequest(
        MPI_Ibcast(data, static_cast<int>(count), MPI_BYTE, root, ctx.comm, &request), &request,
        "MPI_Ibcast");
  };
  Batch bytes = AsBytes(batch);

  if (bytes.items.size() == 1) {
    const BatchItem& item = bytes.items.front();
    const int64_t n = item.meta.NumElements();
    char* out = static_cast<char*>(item.entry->output);
    if (is_root && out != item.entry->input && n > 0) std::memcpy(out, item.entry->input, n);
    for (int64_t begin = 0; begin < n; begin += window) {
      Status status = bcast(out + begin, std::min(window, n - begin));
      if (!status.ok()) return status;
    }
    return Status::OK();
  }

  int64_t total = 0;
  for (const BatchItem& item : bytes.items) total += item.meta.NumElements();
  ctx.scratch->resize(std::max<size_t>(ctx.scratch->size(), std::min(total, window)));
  char* buffer = ctx.scratch->data();
  return ForEachWindow(
      bytes, window,
      [&](const BatchItem& item, int64_t from, int64_t to, int64_t count) {
        if (is_root) std::memcpy(buffer + to, static_cast<const char*>(item.entry->input) + from, count);
      },
      [&](int64_t count) { return bcast(buffer, count); },
      [&](const BatchItem& item, int64_t from, int64_t to, int64_t count) {
        char* out = static_cast<char*>(item.entry->output) + from;
        if (!is_root || out != static_cast<const char*>(item.entry->input) + from)
          std::memcpy(out, buffer + to, count);
      });
}

}  // namespace perseus
