#include "engine/round_payload.h"

#include "common/dtype.h"

namespace perseus {

namespace {

int64_t PayloadWords(int64_t bytes) { return (bytes + 7) / 8; }

// inout = in (op) inout over a round: AND of the bit words, the header's reduction of
// the payload (zeros in the padding stay zeros under every operator). The header is
// the same on every rank and stays as it is.
void ReduceRound(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint64_t* a = static_cast<const uint64_t*>(in);
  uint64_t* b = static_cast<uint64_t*>(inout);
  for (int element = 0; element < *len; ++element) {
    const int bit_words = static_cast<int>(b[0]);
    const int64_t payload_words = static_cast<int64_t>(b[1] & 0xffffffffu);
    const int dtype = static_cast<int>((b[1] >> 32) & 0xff), op = static_cast<int>(b[1] >> 40);
    const int header = RoundPayloadOps::kHeaderWords;
    for (int i = header; i < header + bit_words; ++i) b[i] &= a[i];
    ReduceLocal(dtype, op, a + header + bit_words, b + header + bit_words,
                payload_words * 8 / static_cast<int64_t>(DtypeSize(dtype)));
    const int words = header + bit_words + static_cast<int>(payload_words);
    a += words;
    b += words;
  }
}

}  // namespace

bool CarriesPayloads(const Config& config) {
  return config.allreduce_dtype == "none" && config.allreduce_mode == "flat" &&
         !config.nan_check && !config.autotune && !config.lanes_auto;
}

bool MayRideInRound(const TensorMeta& meta) {
  return meta.op_type == PERSEUS_ALLREDUCE && meta.device == PERSEUS_CPU_DEVICE &&
         meta.reduce_op != PERSEUS_ADASUM && meta.dtype != PERSEUS_BOOL && meta.group_size == 0 &&
         !meta.anonymous && PayloadBytes(meta) > 0 && PayloadBytes(meta) <= kMaxRoundPayloadBytes;
}

RoundPayloadOps::RoundPayloadOps() { MPI_Op_create(&ReduceRound, 1, &op_); }

RoundPayloadOps::~RoundPayloadOps() {
  for (auto& kv : types_) MPI_Type_free(&kv.second);
  if (op_ != MPI_OP_NULL) MPI_Op_free(&op_);
}

MPI_Datatype RoundPayloadOps::TypeOf(int words) {
  auto it = types_.find(words);
  if (it != types_.end()) return it->second;
  MPI_Datatype type;
  MPI_Type_contiguous(words, MPI_UINT64_T, &type);
  MPI_Type_commit(&type);
  types_.emplace(words, type);
  return type;
}

int RoundPayloadOps::Words(int bit_words, int64_t payload_bytes) {
  return kHeaderWords + bit_words + static_cast<int>(PayloadWords(payload_bytes));
}

void RoundPayloadOps::WriteHeader(uint64_t* round, int bit_words, int64_t payload_bytes,
                                  int dtype, int op) {
  round[0] = static_cast<uint64_t>(bit_words);
  round[1] = static_cast<uint64_t>(PayloadWords(payload_bytes)) |
             (static_cast<uint64_t>(dtype) << 32) | (static_cast<uint64_t>(op) << 40);
}

}  // namespace perseus
