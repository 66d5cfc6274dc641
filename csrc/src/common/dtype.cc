#include "common/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace perseus {

// ---- 16-bit floats, converted through float32 ------------------------------
float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: renormalise
    int shift = 0;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      ++shift;
    }
    bits = sign | ((113 - shift) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0);
  if (absx >= 0x477ff000u) return sign | 0x7c00u;  // rounds to inf
  if (absx < 0x38800000u) {                        // subnormal or zero in half
    if (absx < 0x33000000u) return sign;
    uint32_t e = absx >> 23, m = (absx & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14..24
    uint32_t half = m >> shift, rest = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rest > mid || (rest == mid && (half & 1))) ++half;
    return sign | half;
  }
  uint32_t half = ((absx - 0x38000000u) >> 13);
  uint32_t rest = absx & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1))) ++half;  // round to nearest even
  return sign | half;
}

float Bf16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
}

namespace {

struct DtypeInfo {
  const char* name;
  size_t size;
  bool floating;
};

const DtypeInfo kDtypes[PERSEUS_NUM_DTYPES] = {
    {"uint8", 1, false},   {"int8", 1, false},    {"int32", 4, false},
    {"int64", 8, false},   {"float16", 2, true},  {"bfloat16", 2, true},
    {"float32", 4, true},  {"float64", 8, true},  {"bool", 1, false},
    {"int16", 2, false},
};

// ---- reduction operators ----------------------------------------------------
// MPI applies an operator as `inout = in (op) inout` with the operands in an order
// that differs by rank (each rank's own data is `inout`), so a result is the same
// bits on every rank only if each operator is commutative to the bit. IEEE + and *
// are, except for which NaN payload comes out; MPI's own MAX/MIN are not (they keep
// `inout` when either side is NaN, or for -0 against +0). So every float operator
// here returns one canonical NaN for any NaN result, propagates NaN through Max/Min
// (as numpy and torch do), and orders -0 below +0.
template <typename T>
struct Sum {
  static T Apply(T a, T b) {
    T r = a + b;
    return r == r ? r : std::numeric_limits<T>::quiet_NaN();
  }
};
template <typename T>
struct Prod {
  static T Apply(T a, T b) {
    T r = a * b;
    return r == r ? r : std::numeric_limits<T>::quiet_NaN();
  }
};
template <typename T>
struct Max {
  static T Apply(T a, T b) {
    if (a != a || b != b) return std::numeric_limits<T>::quiet_NaN();
    if (a == b) return std::signbit(a) ? b : a;  // equal: the same bits, or -0 and +0
    return a > b ? a : b;
  }
};
template <typename T>
struct Min {
  static T Apply(T a, T b) {
    if (a != a || b != b) return std::numeric_limits<T>::quiet_NaN();
    if (a == b) return std::signbit(a) ? a : b;
    return a < b ? a : b;
  }
};

// Element formats as the operators see them: 16-bit floats compute in float32 and
// round back (a function of the float32 result, so the operator stays commutative
// to the bit).
template <typename T>
struct Native {
  using Storage = T;
  using Compute = T;
  static T Load(T v) { return v; }
  static T Store(T v) { return v; }
};
struct Half {
  using Storage = uint16_t;
  using Compute = float;
  static float Load(uint16_t v) { return HalfToFloat(v); }
  static uint16_t Store(float v) { return FloatToHalf(v); }
};
struct BFloat {
  using Storage = uint16_t;
  using Compute = float;
  static float Load(uint16_t v) { return Bf16ToFloat(v); }
  static uint16_t Store(float v) { return FloatToBf16(v); }
};

// MPI user function: inout[i] = in[i] (op) inout[i].
template <typename Format, template <typename> class Op>
void ReduceFloats(void* in, void* inout, int* len, MPI_Datatype*) {
  using S = typename Format::Storage;
  using C = typename Format::Compute;
  const S* a = static_cast<const S*>(in);
  S* b = static_cast<S*>(inout);
  const int n = *len;
  for (int i = 0; i < n; ++i)
    b[i] = Format::Store(Op<C>::Apply(Format::Load(a[i]), Format::Load(b[i])));
}

// [format: half, bfloat, float, double][op: sum, min, max, product]
MPI_Op g_float_ops[4][4];
bool g_ops_created = false;

template <typename Format>
void CreateFloatOps(MPI_Op* ops) {
  MPI_Op_create(&ReduceFloats<Format, Sum>, 1, &ops[0]);
  MPI_Op_create(&ReduceFloats<Format, Min>, 1, &ops[1]);
  MPI_Op_create(&ReduceFloats<Format, Max>, 1, &ops[2]);
  MPI_Op_create(&ReduceFloats<Format, Prod>, 1, &ops[3]);
}

// The row of g_float_ops for a floating dtype.
int FloatFormatIndex(int dtype) {
  switch (dtype) {
    case PERSEUS_FLOAT16: return 0;
    case PERSEUS_BFLOAT16: return 1;
    case PERSEUS_FLOAT32: return 2;
    default: return 3;
  }
}

// Integers as MPI's SUM, MIN, MAX, PROD, BAND, BOR and BXOR: two's complement, wrapping.
template <typename T>
void ReduceInts(int op, const T* a, T* b, int64_t n) {
  using U = typename std::make_unsigned<T>::type;
  for (int64_t i = 0; i < n; ++i) {
    switch (op) {
      case PERSEUS_MIN: b[i] = std::min(a[i], b[i]); break;
      case PERSEUS_MAX: b[i] = std::max(a[i], b[i]); break;
      case PERSEUS_PRODUCT: b[i] = static_cast<T>(static_cast<U>(a[i]) * static_cast<U>(b[i])); break;
      case PERSEUS_BAND: b[i] = a[i] & b[i]; break;
      case PERSEUS_BOR: b[i] = a[i] | b[i]; break;
      case PERSEUS_BXOR: b[i] = a[i] ^ b[i]; break;
      default: b[i] = static_cast<T>(static_cast<U>(a[i]) + static_cast<U>(b[i])); break;
    }
  }
}

template <typename T>
void ScaleInts(T* dst, const T* src, int64_t n, double factor) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(static_cast<double>(src[i]) * factor);
}

template <typename Format>
void Scale16(uint16_t* dst, const uint16_t* src, int64_t n, double factor) {
  float f = static_cast<float>(factor);
  for (int64_t i = 0; i < n; ++i) dst[i] = Format::Store(Format::Load(src[i]) * f);
}

}  // namespace

bool ValidDtype(int dtype) { return dtype >= 0 && dtype < PERSEUS_NUM_DTYPES; }
size_t DtypeSize(int dtype) { return kDtypes[dtype].size; }
const char* DtypeName(int dtype) { return ValidDtype(dtype) ? kDtypes[dtype].name : "invalid"; }
bool IsFloatingDtype(int dtype) { return kDtypes[dtype].floating; }
bool IsBitwiseOp(int op) { return op == PERSEUS_BAND || op == PERSEUS_BOR || op == PERSEUS_BXOR; }

const char* ReduceOpName(int op) {
  static const char* const names[] = {"Average", "Sum", "Adasum", "Min", "Max", "Product",
                                       "BAND", "BOR", "BXOR"};
  return (op >= 0 && op < PERSEUS_NUM_REDUCE_OPS) ? names[op] : "invalid";
}

const char* OpTypeName(int op_type) {
  static const char* const names[] = {"allreduce", "allgather",     "broadcast", "alltoall",
                                      "reducescatter", "barrier", "join"};
  return (op_type >= 0 && op_type <= PERSEUS_JOIN) ? names[op_type] : "invalid";
}

void CreateMpiOps() {
  if (g_ops_created) return;
  CreateFloatOps<Half>(g_float_ops[0]);
  CreateFloatOps<BFloat>(g_float_ops[1]);
  CreateFloatOps<Native<float>>(g_float_ops[2]);
  CreateFloatOps<Native<double>>(g_float_ops[3]);
  g_ops_created = true;
}

void FreeMpiOps() {
  if (!g_ops_created) return;
  for (auto& format : g_float_ops)
    for (auto& op : format) MPI_Op_free(&op);
  g_ops_created = false;
}

MPI_Datatype MpiDatatype(int dtype) {
  switch (dtype) {
    case PERSEUS_UINT8: return MPI_UINT8_T;
    case PERSEUS_INT8: return MPI_INT8_T;
    case PERSEUS_INT16: return MPI_INT16_T;
    case PERSEUS_INT32: return MPI_INT32_T;
    case PERSEUS_INT64: return MPI_INT64_T;
    case PERSEUS_FLOAT16:
    case PERSEUS_BFLOAT16: return MPI_UINT16_T;  // reduced by our own operators
    case PERSEUS_FLOAT32: return MPI_FLOAT;
    case PERSEUS_FLOAT64: return MPI_DOUBLE;
    case PERSEUS_BOOL: return MPI_C_BOOL;
  }
  return MPI_DATATYPE_NULL;
}

Status MpiReduceOp(int dtype, int op, MPI_Op* out) {
  int index;
  switch (op) {
    case PERSEUS_SUM:
    case PERSEUS_AVERAGE: index = 0; break;
    case PERSEUS_MIN: index = 1; break;
    case PERSEUS_MAX: index = 2; break;
    case PERSEUS_PRODUCT: index = 3; break;
    case PERSEUS_BAND: index = 4; break;
    case PERSEUS_BOR: index = 5; break;
    case PERSEUS_BXOR: index = 6; break;
    default:
      return Status::Error(PERSEUS_UNSUPPORTED,
                           std::string("reduce op ") + ReduceOpName(op) + " is not supported");
  }
  if (dtype == PERSEUS_BOOL) {  // refused at enqueue (CheckReduction): not reached
    return Status::Error(PERSEUS_INTERNAL_ERROR, "MPI has no reduce operator for bool");
  }
  if (IsFloatingDtype(dtype) && IsBitwiseOp(op)) {  // refused at enqueue (CheckReduction)
    return Status::Error(PERSEUS_INTERNAL_ERROR, "MPI has no bitwise operator for floats");
  }
  if (IsFloatingDtype(dtype)) {  // ours, for results identical on every rank (see above)
    *out = g_float_ops[FloatFormatIndex(dtype)][index];
    return Status::OK();
  }
  // Integer operations are exact, hence the same in any order.
  static const MPI_Op builtin[] = {MPI_SUM,  MPI_MIN, MPI_MAX, MPI_PROD,
                                   MPI_BAND, MPI_BOR, MPI_BXOR};
  *out = builtin[index];
  return Status::OK();
}

void ReduceLocal(int dtype, int op, const void* in, void* inout, int64_t count) {
  switch (dtype) {
    case PERSEUS_UINT8: return ReduceInts(op, (const uint8_t*)in, (uint8_t*)inout, count);
    case PERSEUS_INT8: return ReduceInts(op, (const int8_t*)in, (int8_t*)inout, count);
    case PERSEUS_INT16: return ReduceInts(op, (const int16_t*)in, (int16_t*)inout, count);
    case PERSEUS_INT32: return ReduceInts(op, (const int32_t*)in, (int32_t*)inout, count);
    case PERSEUS_INT64: return ReduceInts(op, (const int64_t*)in, (int64_t*)inout, count);
  }
  if (!IsFloatingDtype(dtype)) return;
  static void (*const kFloat[4][4])(void*, void*, int*, MPI_Datatype*) = {
      {&ReduceFloats<Half, Sum>, &ReduceFloats<Half, Min>, &ReduceFloats<Half, Max>,
       &ReduceFloats<Half, Prod>},
      {&ReduceFloats<BFloat, Sum>, &ReduceFloats<BFloat, Min>, &ReduceFloats<BFloat, Max>,
       &ReduceFloats<BFloat, Prod>},
      {&ReduceFloats<Native<float>, Sum>, &ReduceFloats<Native<float>, Min>,
       &ReduceFloats<Native<float>, Max>, &ReduceFloats<Native<float>, Prod>},
      {&ReduceFloats<Native<double>, Sum>, &ReduceFloats<Native<double>, Min>,
       &ReduceFloats<Native<double>, Max>, &ReduceFloats<Native<double>, Prod>}};
  const int index = op == PERSEUS_MIN ? 1 : op == PERSEUS_MAX ? 2 : op == PERSEUS_PRODUCT ? 3 : 0;
  int n = static_cast<int>(count);
  kFloat[FloatFormatIndex(dtype)][index](const_cast<void*>(in), inout, &n, nullptr);
}

void CopyScaled(int dtype, void* dst, const void* src, int64_t n, double factor) {
  if (factor == 1.0) {
    if (dst != src) std::memcpy(dst, src, n * DtypeSize(dtype));
    return;
  }
  switch (dtype) {
    case PERSEUS_UINT8: ScaleInts((uint8_t*)dst, (const uint8_t*)src, n, factor); break;
    case PERSEUS_INT8: ScaleInts((int8_t*)dst, (const int8_t*)src, n, factor); break;
    case PERSEUS_INT16: ScaleInts((int16_t*)dst, (const int16_t*)src, n, factor); break;
    case PERSEUS_INT32: ScaleInts((int32_t*)dst, (const int32_t*)src, n, factor); break;
    case PERSEUS_INT64: ScaleInts((int64_t*)dst, (const int64_t*)src, n, factor); break;
    case PERSEUS_FLOAT16: Scale16<Half>((uint16_t*)dst, (const uint16_t*)src, n, factor); break;
    case PERSEUS_BFLOAT16: Scale16<BFloat>((uint16_t*)dst, (const uint16_t*)src, n, factor); break;
    case PERSEUS_FLOAT32: {
      float f = static_cast<float>(factor);
      float* d = static_cast<float*>(dst);
      const float* s = static_cast<const float*>(src);
      for (int64_t i = 0; i < n; ++i) d[i] = s[i] * f;
      break;
    }
    case PERSEUS_FLOAT64: {
      double* d = static_cast<double*>(dst);
      const double* s = static_cast<const double*>(src);
      for (int64_t i = 0; i < n; ++i) d[i] = s[i] * factor;
      break;
    }
    default:  // bool is never scaled (requests with scales on bool are rejected)
      if (dst != src) std::memcpy(dst, src, n * DtypeSize(dtype));
  }
}

}  // namespace perseus
