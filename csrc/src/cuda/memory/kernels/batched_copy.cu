// The pack/unpack kernel of the device lanes' fusion buffer: one launch copies, or
// fills with zeros, up to PERSEUS_COPY_MAX_ENTRIES byte ranges described by a table
// passed by value (batched_copy_table.h). Each block copies one chunk of one entry, so
// a large tensor is spread over many blocks and a small one costs a single block.
//
// The core is built without nvcc: it embeds the PTX that scripts/gen_pack_ptx.sh makes
// from this file (batched_copy_ptx.inc) and loads it at run time (cuda/memory/copy_kernel.cc).
// After editing this file, run the script; tests/gpu/test_pack_kernel.py checks that the
// committed PTX is what the script makes, and runs this code on the CPU.
//
// Bandwidth: where source and destination are congruent modulo 16 (the fusion buffer's
// slots start on 16-byte boundaries, and so do tensors from a framework's allocator),
// all but at most 15 bytes at each end of a chunk move as 16-byte vectors, each thread
// keeping four loads in flight; otherwise in the widest unit both addresses allow.
#include "batched_copy_table.h"

namespace {

template <int W>
struct Unit;  // one access of W bytes
template <>
struct Unit<16> { typedef uint4 T; };
template <>
struct Unit<8> { typedef unsigned long long T; };
template <>
struct Unit<4> { typedef unsigned int T; };
template <>
struct Unit<2> { typedef unsigned short T; };
template <>
struct Unit<1> { typedef unsigned char T; };

// n units of W bytes from src to dst, both W-aligned, or zeros when src is null.
// Thread t takes units t, t + T, t + 2T, ... of the block's T threads, four at a time,
// so that each thread has four loads in flight before it stores.
template <int W>
__device__ __forceinline__ void move_units(const char* __restrict__ src, char* __restrict__ dst,
                                           unsigned n) {
  typedef typename Unit<W>::T T;
  const T* s = reinterpret_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(dst);
  const unsigned step = blockDim.x;
  unsigned i = threadIdx.x;
  if (s == nullptr) {
    const T zero = T();
    for (; i < n; i += step) d[i] = zero;
    return;
  }
  for (; i + 3 * step < n; i += 4 * step) {
    const T a = s[i], b = s[i + step], c = s[i + 2 * step], e = s[i + 3 * step];
    d[i] = a;
    d[i + step] = b;
    d[i + 2 * step] = c;
    d[i + 3 * step] = e;
  }
  for (; i < n; i += step) d[i] = s[i];
}

// Bytes [0, n) from src to dst, or zeros when src is null. The widest unit W (16 at
// most) for which src and dst are congruent modulo W moves the middle; the bytes
// before dst's first W-aligned address and after its last whole unit go one by one.
__device__ __forceinline__ void move_range(const char* src, char* dst, unsigned n) {
  const unsigned long long to = reinterpret_cast<unsigned long long>(dst);
  const unsigned long long skew = src ? (reinterpret_cast<unsigned long long>(src) ^ to) & 15 : 0;
  const unsigned width = skew ? static_cast<unsigned>(skew & (~skew + 1)) : 16;  // lowest set bit
  unsigned head = static_cast<unsigned>((width - (to & (width - 1))) & (width - 1));
  if (head > n) head = n;
  const unsigned units = (n - head) / width;
  const unsigned tail = head + units * width;  // where the last partial unit starts
  for (unsigned k = threadIdx.x; k < head; k += blockDim.x) dst[k] = src ? src[k] : 0;
  for (unsigned k = tail + threadIdx.x; k < n; k += blockDim.x) dst[k] = src ? src[k] : 0;
  const char* from = src ? src + head : nullptr;
  switch (width) {
    case 16: move_units<16>(from, dst + head, units); break;
    case 8: move_units<8>(from, dst + head, units); break;
    case 4: move_units<4>(from, dst + head, units); break;
    case 2: move_units<2>(from, dst + head, units); break;
    default: move_units<1>(from, dst + head, units); break;
  }
}

}  // namespace

// One chunk of one entry per block (batched_copy_table.h says which).
extern "C" __global__ void __launch_bounds__(PERSEUS_COPY_THREADS)
    perseus_batched_copy(const __grid_constant__ PerseusCopyTable table) {
  // The entry: the last whose first block is at or before this one (binary search;
  // __grid_constant__ lets the table be indexed where it lies, without a local copy).
  const unsigned block = blockIdx.x;
  unsigned lo = 0, hi = table.count;
  while (hi - lo > 1) {
    const unsigned mid = (lo + hi) / 2;
    if (table.first_block[mid] <= block) lo = mid;
    else hi = mid;
  }
  const unsigned long long begin =
      static_cast<unsigned long long>(block - table.first_block[lo]) * PERSEUS_COPY_CHUNK_BYTES;
  const unsigned size = table.bytes[lo];
  if (begin >= size) return;  // a block past the table's last chunk does nothing
  const unsigned left = size - static_cast<unsigned>(begin);
  const unsigned n = left < PERSEUS_COPY_CHUNK_BYTES ? left : PERSEUS_COPY_CHUNK_BYTES;
  const char* src = static_cast<const char*>(table.src[lo]);
  move_range(src ? src + begin : nullptr, static_cast<char*>(table.dst[lo]) + begin, n);
}
