// Allreduce over MPI. A tensor alone in its batch, or large, is reduced in place in
// chunks; the small ones of a batch, or any buffer that travels in another dtype
// (PERSEUS_ALLREDUCE_DTYPE), are fused window by window through the lane's scratch
// buffer.
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/fused_windows.h"
#include "collectives/hierarchical.h"
#include "collectives/wire_dtype.h"
#include "common/dtype.h"
#include "mpi/wait_policy.h"

namespace perseus {

namespace {
// From this size a fused tensor skips the fusion buffer: below it, the MPI call
// that a tensor of its own costs is dearer than copying it in and out.
constexpr int64_t kDirectAllreduceBytes = 256 << 10;
}  // namespace

Status RunAllreduce(const Batch& batch, ExecContext& ctx) {
  const TensorMeta& head = batch.items.front().meta;
  const int dtype = head.dtype;
  const int wire = WireDtype(dtype, head.reduce_op, ctx.wire_dtype);
  const size_t esize = DtypeSize(dtype), wire_size = DtypeSize(wire);
  const MPI_Datatype mpi_type = MpiDatatype(wire);
  MPI_Op op;
  Status status = MpiReduceOp(wire, head.reduce_op, &op);
  if (!status.ok()) return status;
  const double average = head.reduce_op == PERSEUS_AVERAGE ? 1.0 / ctx.size : 1.0;
  const int64_t window = std::max<int64_t>(1, ctx.chunk_bytes / wire_size);

  auto reduce_in_place = [&](char* data, int64_t count) {
    if (ctx.nodes) return HierarchicalAllreduce(data, count, mpi_type, wire_size, op, *ctx.nodes);
    MPI_Request request;
    return CompleteRequest(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), mpi_type,
                                          op, ctx.comm, &request),
                           &request, "MPI_Iallreduce");
  };

  // Tensors large enough (or alone) are reduced where they lie, each window scaled
  // right after its reduction while it is still in cache. Packing them would cost two
  // more passes over memory, about as much as the reduction itself on a shared-memory
  // node. The rest share fused windows. Chosen from agreed metadata only, so every
  // rank makes the same MPI calls in the same order.
  const bool alone = batch.items.size() == 1;
  std::vector<const BatchItem*> packed;
  for (const BatchItem& item : batch.items) {
    const bool direct =
        wire == dtype && (alone || PayloadBytes(item.meta) >= kDirectAllreduceBytes);
    if (!direct) {
      packed.push_back(&item);
      continue;
    }
    const int64_t n = item.meta.NumElements();
    char* out = nullptr;
    const char* in = nullptr;
    if (item.entry) {
      out = static_cast<char*>(item.entry->output);
      in = static_cast<const char*>(item.entry->input);
    } else {  // a joined rank contributes zeros, window by window, in the scratch buffer
      ctx.scratch->resize(std::max<size_t>(ctx.scratch->size(), std::min(n, window) * esize));
    }
    for (int64_t begin = 0; begin < n; begin += window) {
      const int64_t count = std::min(window, n - begin);
      char* data = out ? out + begin * esize : ctx.scratch->data();
      if (out) {
        CopyScaled(dtype, data, in + begin * esize, count, item.meta.prescale);
      } else {
        std::memset(data, 0, count * esize);  // +0 in every float format
      }
      status = reduce_in_place(data, count);
      if (!status.ok()) return status;
      if (out) CopyScaled(dtype, data, data, count, item.meta.postscale * average);
    }
  }
  if (packed.empty()) return Status::OK();

  // Pack and unpack scale (and convert, where the wire dtype differs) in one pass.
  auto copy_in = [&](char* dst, const char* src, int64_t count, double factor) {
    if (wire == dtype)
      CopyScaled(dtype, dst, src, count, factor);
    else
      ConvertScaled(dtype, wire, dst, src, count, factor);
  };
  auto copy_out = [&](char* dst, const char* src, int64_t count, double factor) {
    if (wire == dtype)
      CopyScaled(dtype, dst, src, count, factor);
    else
      ConvertScaled(wire, dtype, dst, src, count, factor);
  };

  int64_t total = 0;
  for (const BatchItem* item : packed) total += item->meta.NumElements();
  ctx.scratch->resize(std::max<size_t>(ctx.scratch->size(), std::min(total, window) * wire_size));
  char* buffer = ctx.scratch->data();
  return ForEachWindow(
      packed, window,
      [&](const BatchItem& item, int64_t from, int64_t to, int64_t count) {
        char* dst = buffer + to * wire_size;
        if (item.entry) {  // a joined rank contributes zeros
          const char* src = static_cast<const char*>(item.entry->input) + from * esize;
          copy_in(dst, src, count, item.meta.prescale);
        } else {
          std::memset(dst, 0, count * wire_size);  // +0 in every float format
        }
      },
      [&](int64_t count) { return reduce_in_place(buffer, count); },
      [&](const BatchItem& item, int64_t from, int64_t to, int64_t count) {
        if (!item.entry) return;
        char* dst = static_cast<char*>(item.entry->output) + from * esize;
        copy_out(dst, buffer + to * wire_size, count, item.meta.postscale * average);
      });
}

}  // namespace perseus
