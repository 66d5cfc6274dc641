#include "collectives/wire_dtype.h"

#include "common/dtype.h"

namespace perseus {

namespace {

template <typename Wide>
void Narrow(uint16_t (*store)(float), uint16_t* dst, const Wide* src, int64_t n, double factor) {
  const Wide f = static_cast<Wide>(factor);
  for (int64_t i = 0; i < n; ++i) dst[i] = store(static_cast<float>(src[i] * f));
}

template <typename Wide>
void Widen(float (*load)(uint16_t), Wide* dst, const uint16_t* src, int64_t n, double factor) {
  const Wide f = static_cast<Wide>(factor);
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<Wide>(load(src[i])) * f;
}

bool IsWide(int dtype) { return dtype == PERSEUS_FLOAT32 || dtype == PERSEUS_FLOAT64; }

}  // namespace

int WireDtypeSetting(const std::string& setting) {
  if (setting == "fp16") return PERSEUS_FLOAT16;
  if (setting == "bf16") return PERSEUS_BFLOAT16;
  return -1;
}

int WireDtype(int dtype, int reduce_op, int wire) {
  return wire >= 0 && IsWide(dtype) && reduce_op != PERSEUS_ADASUM ? wire : dtype;
}

void ConvertScaled(int from, int to, void* dst, const void* src, int64_t count, double factor) {
  if (IsWide(from)) {
    auto store = to == PERSEUS_FLOAT16 ? &FloatToHalf : &FloatToBf16;
    uint16_t* out = static_cast<uint16_t*>(dst);
    if (from == PERSEUS_FLOAT32)
      Narrow(store, out, static_cast<const float*>(src), count, factor);
    else
      Narrow(store, out, static_cast<const double*>(src), count, factor);
  } else {
    auto load = from == PERSEUS_FLOAT16 ? &HalfToFloat : &Bf16ToFloat;
    const uint16_t* in = static_cast<const uint16_t*>(src);
    if (to == PERSEUS_FLOAT32)
      Widen(load, static_cast<float*>(dst), in, count, factor);
    else
      Widen(load, static_cast<double*>(dst), in, count, factor);
  }
}

}  // namespace perseus
