// PERSEUS_ALLREDUCE_DTYPE: float32/float64 allreduce buffers travel and are reduced
// as float16 or bfloat16. The fused window is converted once on the way in and once
// on the way out; the reduction itself uses the 16-bit operators of common/dtype.h,
// so every rank still ends with the same bits.
#ifndef PERSEUS_WIRE_DTYPE_H_
#define PERSEUS_WIRE_DTYPE_H_

#include <cstdint>
#include <string>

namespace perseus {

// The dtype PERSEUS_ALLREDUCE_DTYPE names (none, fp16, bf16), -1 for none.
int WireDtypeSetting(const std::string& setting);

// The dtype a `dtype` buffer travels in: `wire` (a 16-bit float dtype, or -1 for
// none) for float32/float64 and any reduction but Adasum; `dtype` itself otherwise
// (integers and 16-bit floats are never converted).
int WireDtype(int dtype, int reduce_op, int wire);

// dst[i] = to(src[i] * factor): between float32/float64 and float16/bfloat16, either
// way. The product is taken in float32 (float64 for a float64 target).
void ConvertScaled(int from, int to, void* dst, const void* src, int64_t count, double factor);

}  // namespace perseus

#endif  // PERSEUS_WIRE_DTYPE_H_
