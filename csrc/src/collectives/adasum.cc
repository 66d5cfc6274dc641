// Adasum over MPI: adaptive summation of gradients (Maleki et al., 2020). Two vectors
// combine as
//     a' = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b
// which adds their orthogonal parts and averages their parallel parts. The dot
// products are taken per tensor (also when several are fused into one batch) and
// accumulated in double; a zero vector leaves the other unchanged (coefficient 1).
//
// Recursive doubling on full vectors, over the process set's communicator:
//   1. ranks r >= p (p: the largest power of two <= size) fold into rank r - p;
//   2. at distance d = 1, 2, 4, ... < p, rank r swaps its vector with r ^ d;
//      both combine them with the lower rank's vector as `a`, so they compute the
//      same expression on the same bits and stay bitwise identical;
//   3. the folded ranks get the result back.
// Every rank thus ends with the same bits. The wire carries the tensor's own
// dtype; each level rounds its result back to that dtype.
#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "collectives/collectives.h"
#include "common/dtype.h"
#include "mpi/wait_policy.h"

namespace perseus {

namespace {

// Lanes run one batch at a time, in the same order on every rank, so one tag suffices.
constexpr int kAdasumTag = 0x41da;

struct Span {
  int64_t begin, count;  // one tensor's elements within the batch buffer
};

// Sends `send` to and/or receives `recv` from `peer` (either may be null), in pieces
// of at most ctx.chunk_bytes. The receive is posted first, so two peers that swap
// never wait on each other.
Status Transfer(ExecContext& ctx, int peer, const char* send, char* recv, int64_t bytes) {
  const int64_t piece = std::min<int64_t>(std::max<int64_t>(1, ctx.chunk_bytes), INT_MAX);
  for (int64_t at = 0; at < bytes; at += piece) {
    const int n = static_cast<int>(std::min(piece, bytes - at));
    MPI_Request receiving = MPI_REQUEST_NULL;
    if (recv) {
      int rc = MPI_Irecv(recv + at, n, MPI_BYTE, peer, kAdasumTag, ctx.comm, &receiving);
      if (rc != MPI_SUCCESS) return MpiStatus(rc, "MPI_Irecv");
    }
    if (send) {
      MPI_Request sending;
      Status status = CompleteRequest(
          MPI_Isend(send + at, n, MPI_BYTE, peer, kAdasumTag, ctx.comm, &sending), &sending,
          "MPI_Isend");
      if (!status.ok()) return status;
    }
    if (recv) {
      Status status = CompleteRequest(MPI_SUCCESS, &receiving, "MPI_Irecv");
      if (!status.ok()) return status;
    }
  }
  return Status::OK();
}

// mine := Adasum(a, b) for one tensor, where (a, b) is (mine, theirs) when this rank
// is the lower of the pair, else (theirs, mine).
template <typename F>
void CombineTensor(typename F::Storage* mine, const typename F::Storage* theirs, int64_t n,
                   bool mine_is_a) {
  const typename F::Storage* a = mine_is_a ? mine : theirs;
  const typename F::Storage* b = mine_is_a ? theirs : mine;
  double dot = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = F::Load(a[i]), y = F::Load(b[i]);
    dot += x * y;
    aa += x * x;
    bb += y * y;
  }
  const double ca = aa == 0 ? 1.0 : 1.0 - dot / (2 * aa);
  const double cb = bb == 0 ? 1.0 : 1.0 - dot / (2 * bb);
  for (int64_t i = 0; i < n; ++i) mine[i] = F::Store(ca * F::Load(a[i]) + cb * F::Load(b[i]));
}

void Combine(int dtype, const std::vector<Span>& spans, char* mine, const char* theirs,
             bool mine_is_a) {
  VisitFloatFormat(dtype, [&](auto format) {
    using F = decltype(format);
    using T = typename F::Storage;
    for (const Span& s : spans)
      CombineTensor<F>(reinterpret_cast<T*>(mine) + s.begin,
                       reinterpret_cast<const T*>(theirs) + s.begin, s.count, mine_is_a);
  });
}

}  // namespace

Status RunAdasum(const Batch& batch, ExecContext& ctx) {
  const TensorMeta& head = batch.items.front().meta;
  const int dtype = head.dtype;
  if (!IsFloatingDtype(dtype))  // MakeEntry refuses these; a guard, not a message path
    return Status::Error(PERSEUS_INTERNAL_ERROR, "Adasum batch of a non-floating dtype");
  const size_t esize = DtypeSize(dtype);
  std::vector<Span> spans;
  int64_t total = 0;
  for (const BatchItem& item : batch.items) {
    spans.push_back({total, item.meta.NumElements()});
    total += item.meta.NumElements();
  }
  const int64_t bytes = total * static_cast<int64_t>(esize);

  // This rank's vector, prescaled: a lone tensor is worked on in its output, fused
  // ones in the first half of the scratch buffer; the peer's goes after it.
  const BatchItem& only = batch.items.front();
  const bool lone = batch.items.size() == 1 && only.entry;
  ctx.scratch->resize(std::max<size_t>(ctx.scratch->size(), (lone ? 1 : 2) * bytes));
  char* mine = lone ? static_cast<char*>(only.entry->output) : ctx.scratch->data();
  char* theirs = lone ? ctx.scratch->data() : ctx.scratch->data() + bytes;
  for (size_t i = 0; i < batch.items.size(); ++i) {
    const BatchItem& item = batch.items[i];
    char* dst = mine + spans[i].begin * esize;
    if (item.entry)  // a joined rank contributes zeros, which Adasum leaves out
      CopyScaled(dtype, dst, item.entry->input, spans[i].count, item.meta.prescale);
    else
      std::memset(dst, 0, spans[i].count * esize);
  }

  const int rank = ctx.rank, size = ctx.size;
  int p = 1;
  while (p * 2 <= size) p *= 2;
  Status status;
  // 1. Fold the ranks beyond p into their partner below p.
  if (rank >= p) {
    status = Transfer(ctx, rank - p, mine, nullptr, bytes);
  } else if (rank + p < size) {
    status = Transfer(ctx, rank + p, nullptr, theirs, bytes);
    if (status.ok()) Combine(dtype, spans, mine, theirs, /*mine_is_a=*/true);
  }
  // 2. Recursive doubling among the first p ranks.
  for (int d = 1; status.ok() && rank < p && d < p; d *= 2) {
    const int peer = rank ^ d;
    status = Transfer(ctx, peer, mine, theirs, bytes);
    if (status.ok()) Combine(dtype, spans, mine, theirs, /*mine_is_a=*/rank < peer);
  }
  // 3. Hand the result back to the folded ranks.
  if (status.ok() && rank >= p) {
    status = Transfer(ctx, rank - p, nullptr, mine, bytes);
  } else if (status.ok() && rank + p < size) {
    status = Transfer(ctx, rank + p, mine, nullptr, bytes);
  }
  if (!status.ok()) return status;

  // Postscale into the outputs (Adasum is never divided by the size).
  for (size_t i = 0; i < batch.items.size(); ++i) {
    const BatchItem& item = batch.items[i];
    if (!item.entry) continue;
    CopyScaled(dtype, item.entry->output, mine + spans[i].begin * esize, spans[i].count,
               item.meta.postscale);
  }
  return Status::OK();
}

}  // namespace perseus
