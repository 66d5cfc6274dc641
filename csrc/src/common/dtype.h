// Everything the core knows about element types: size, name, MPI datatype,
// reduction operators (our own for the float dtypes: identical bits on every rank,
// NaN propagated) and scaling.
#ifndef PERSEUS_DTYPE_H_
#define PERSEUS_DTYPE_H_

#include <mpi.h>

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "perseus/perseus.h"

namespace perseus {

bool ValidDtype(int dtype);
size_t DtypeSize(int dtype);
const char* DtypeName(int dtype);
const char* ReduceOpName(int op);
const char* OpTypeName(int op_type);
bool IsFloatingDtype(int dtype);
// BAND, BOR, BXOR: integer tensors only, never scaled (request_rules).
bool IsBitwiseOp(int op);

// Creates the user-defined MPI operators; call once after MPI is initialised.
void CreateMpiOps();
void FreeMpiOps();

MPI_Datatype MpiDatatype(int dtype);
// The MPI operator reducing `dtype` with `op` (Average reduces as a sum). For float
// dtypes it is commutative to the bit, so every rank ends with the same bits.
Status MpiReduceOp(int dtype, int op, MPI_Op* out);

// inout[i] = in[i] (op) inout[i], as the operator of MpiReduceOp(dtype, op) computes
// it, to the bit (integers wrap as MPI's do); for code that reduces outside MPI's
// own call of an operator.
void ReduceLocal(int dtype, int op, const void* in, void* inout, int64_t count);

// dst[i] = src[i] * factor (dst may equal src). Integers are truncated toward zero.
void CopyScaled(int dtype, void* dst, const void* src, int64_t count, double factor);

// 16-bit floats, converted through float32 (rounding to nearest even).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float Bf16ToFloat(uint16_t b);
uint16_t FloatToBf16(float f);

// Element formats of the floating dtypes, for kernels that compute in double
// (Adasum): Storage is the element as stored, Load widens it, Store rounds back.
struct Float16Format {
  using Storage = uint16_t;
  static double Load(uint16_t v) { return HalfToFloat(v); }
  static uint16_t Store(double v) { return FloatToHalf(static_cast<float>(v)); }
};
struct BFloat16Format {
  using Storage = uint16_t;
  static double Load(uint16_t v) { return Bf16ToFloat(v); }
  static uint16_t Store(double v) { return FloatToBf16(static_cast<float>(v)); }
};
struct Float32Format {
  using Storage = float;
  static double Load(float v) { return v; }
  static float Store(double v) { return static_cast<float>(v); }
};
struct Float64Format {
  using Storage = double;
  static double Load(double v) { return v; }
  static double Store(double v) { return v; }
};

// Calls fn(Format{}) with the format of a floating `dtype`; false for other dtypes.
template <typename Fn>
bool VisitFloatFormat(int dtype, Fn&& fn) {
  switch (dtype) {
    case PERSEUS_FLOAT16: fn(Float16Format{}); return true;
    case PERSEUS_BFLOAT16: fn(BFloat16Format{}); return true;
    case PERSEUS_FLOAT32: fn(Float32Format{}); return true;
    case PERSEUS_FLOAT64: fn(Float64Format{}); return true;
  }
  return false;
}

}  // namespace perseus

#endif  // PERSEUS_DTYPE_H_
