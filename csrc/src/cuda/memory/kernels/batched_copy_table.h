/* The parameter of the pack/unpack kernel (batched_copy.cu): a table of copies passed
 * BY VALUE, so that a launch needs no device memory of its own and no host-to-device
 * copy before it. The one definition of its layout, read by the kernel, by the host
 * code that fills it (cuda/memory/copy_table.cc) and by the fake CUDA runtime that interprets
 * it on machines without a GPU (tests/gpu_fakes/fake_kernel.c). Plain C, so that nvcc,
 * the C++ core and the C fake all compile it.
 *
 * Block b of a launch serves entry i, the last with first_block[i] <= b: it copies
 * bytes [(b - first_block[i]) * CHUNK, + CHUNK) of that entry (clipped to its size);
 * the launch has first_block[count - 1] + ceil(bytes[count - 1] / CHUNK) blocks. */
#ifndef PERSEUS_CUDA_KERNELS_BATCHED_COPY_TABLE_H_
#define PERSEUS_CUDA_KERNELS_BATCHED_COPY_TABLE_H_

/* Entries per launch. 160 x 24 bytes + 4 keeps the parameter under 4 KiB, the limit on
 * every driver and device (CUDA 12.1 allows 32 KiB, but only with a 12.1 driver on
 * Volta or newer); more copies take more launches. */
#define PERSEUS_COPY_MAX_ENTRIES 160
/* Bytes of one entry that one thread block copies: 2,048 16-byte units, 8 per thread.
 * (Overridable only for benchmarks/pack_kernel_sweep.cu, which times other values.) */
#ifndef PERSEUS_COPY_CHUNK_BYTES
#define PERSEUS_COPY_CHUNK_BYTES 32768u
#endif
/* The longest entry (sizes are 32-bit); a longer copy is split into several, at
 * multiples of the chunk, so that every piece keeps the alignment of the whole. */
#define PERSEUS_COPY_MAX_ENTRY_BYTES 0x80000000u
/* Threads per block (the kernel works with any block size; this is what is launched). */
#ifndef PERSEUS_COPY_THREADS
#define PERSEUS_COPY_THREADS 256
#endif

typedef struct PerseusCopyTable {
  const void* src[PERSEUS_COPY_MAX_ENTRIES]; /* NULL: write zeros (a joined rank's slot) */
  void* dst[PERSEUS_COPY_MAX_ENTRIES];
  unsigned int bytes[PERSEUS_COPY_MAX_ENTRIES];       /* each > 0 */
  unsigned int first_block[PERSEUS_COPY_MAX_ENTRIES]; /* ascending, first_block[0] == 0 */
  unsigned int count;                                 /* entries in use, 1..MAX */
} PerseusCopyTable;

#endif /* PERSEUS_CUDA_KERNELS_BATCHED_COPY_TABLE_H_ */
