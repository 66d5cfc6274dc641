#include "collectives/nan_check.h"

#include <cstring>
#include <sstream>
#include <vector>

#include "mpi/wait_policy.h"

namespace perseus {

namespace {

constexpr size_t kMaxNamesShown = 10;
constexpr char kNonFinite[] = "NaN or Inf found before reducing (PERSEUS_ALLREDUCE_NANCHECK): ";

// An IEEE value is NaN or infinite exactly when its exponent bits are all ones. Testing
// the bits (no branches, no float compares) lets the compiler vectorise the loop.
template <typename Bits>
bool AnyExponentAllOnes(const void* data, int64_t count, Bits mask) {
  const char* p = static_cast<const char*>(data);
  bool bad = false;
  for (int64_t i = 0; i < count; ++i) {
    Bits v;
    std::memcpy(&v, p + i * sizeof(Bits), sizeof(Bits));
    bad |= (v & mask) == mask;
  }
  return bad;
}

}  // namespace

bool HasNonFinite(int dtype, const void* data, int64_t count) {
  switch (dtype) {
    case PERSEUS_FLOAT16: return AnyExponentAllOnes<uint16_t>(data, count, 0x7C00u);
    case PERSEUS_BFLOAT16: return AnyExponentAllOnes<uint16_t>(data, count, 0x7F80u);
    case PERSEUS_FLOAT32: return AnyExponentAllOnes<uint32_t>(data, count, 0x7F800000u);
    case PERSEUS_FLOAT64:
      return AnyExponentAllOnes<uint64_t>(data, count, 0x7FF0000000000000ull);
    default: return false;
  }
}

Status FindNonFinite(const Batch& batch, ExecContext& ctx, std::vector<Status>* verdicts) {
  const size_t n = batch.items.size();
  std::vector<char> mine(n, 0), all(n * ctx.size, 0);
  for (size_t i = 0; i < n; ++i) {
    const BatchItem& item = batch.items[i];
    if (item.entry)  // a joined rank adds zeros
      mine[i] = HasNonFinite(item.meta.dtype, item.entry->input, item.meta.NumElements());
  }
  MPI_Request request;
  Status status = CompleteRequest(MPI_Iallgather(mine.data(), static_cast<int>(n), MPI_CHAR,
                                                 all.data(), static_cast<int>(n), MPI_CHAR,
                                                 ctx.comm, &request),
                                  &request, "MPI_Iallgather (NaN check)");
  if (!status.ok()) return status;
  verdicts->assign(n, Status::OK());
  for (size_t i = 0; i < n; ++i) {
    std::vector<int> ranks;
    for (int r = 0; r < ctx.size; ++r)
      if (all[r * n + i]) ranks.push_back(ctx.global_ranks ? (*ctx.global_ranks)[r] : r);
    if (ranks.empty()) continue;
    std::ostringstream msg;
    msg << kNonFinite << "tensor '" << batch.items[i].meta.name << "' on rank(s) [";
    for (size_t k = 0; k < ranks.size(); ++k) msg << (k ? ", " : "") << ranks[k];
    msg << "]";
    (*verdicts)[i] = Status::Error(PERSEUS_NON_FINITE, msg.str());
  }
  return Status::OK();
}

Status CheckFinite(const Batch& batch, ExecContext& ctx) {
  std::vector<Status> verdicts;
  Status exchanged = FindNonFinite(batch, ctx, &verdicts);
  if (!exchanged.ok()) return exchanged;
  const size_t head = sizeof(kNonFinite) - 1;
  std::string names;
  size_t bad = 0;
  for (const Status& v : verdicts) {
    if (v.ok()) continue;
    if (bad++ < kMaxNamesShown) names += (bad > 1 ? "; " : "") + v.message.substr(head);
  }
  if (bad == 0) return Status::OK();
  if (bad > kMaxNamesShown) names += "; and " + std::to_string(bad - kMaxNamesShown) + " more";
  return Status::Error(PERSEUS_NON_FINITE, kNonFinite + names);
}

}  // namespace perseus
