/* The fake CUDA runtime's kernel library and batched copies: what Perseus packs and
 * unpacks fusion buffers with (csrc/src/cuda/memory/batched_copy.h).
 *
 * cudaLibraryLoadData takes the pack kernel's PTX; cudaLaunchKernel runs it as the GPU
 * would, block by block from its table (csrc/src/cuda/memory/kernels/batched_copy_table.h, the
 * layout the real kernel reads): each block's chunk is copied or zero-filled and
 * declared to the ordering checker (consecutive chunks of an entry as one range), and a
 * launch whose blocks would write the same bytes twice, or read bytes it writes, is a
 * misuse (on a GPU, a race between its blocks). cudaMemcpyBatchAsync has the arity of
 * the runtime version reported (9 arguments before CUDA 13, 8 since) and refuses the
 * legacy stream, as the real one does. Launches and batched copies count as kCallLaunch.
 * In the timing mode nothing moves.
 *
 * Environment: FAKE_CUDA_NO_LIBRARY=1 makes cudaLibraryLoadData fail as a driver that
 * cannot compile the PTX does (cudaErrorUnsupportedPtxVersion); =launch makes every
 * launch fail so instead, as lazy loading reports it. FAKE_CUDA_NO_BATCH_COPY=1 makes
 * cudaMemcpyBatchAsync fail as on a driver older than the runtime
 * (cudaErrorCallRequiresNewerDriver); =capture as on a stream being captured into a
 * CUDA graph (cudaErrorStreamCaptureUnsupported); a runtime version below 12080 hides
 * it (calling it anyway is a misuse).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batched_copy_table.h"
#include "fake_gpu.h"

#define LIBRARY_MAGIC 0x5eea0004
#define KERNEL_MAGIC 0x5eea0005
#define KERNEL_NAME "perseus_batched_copy"

typedef struct { unsigned x, y, z; } dim3;
typedef struct { int magic; } FakeLibrary;
typedef struct { int magic; FakeLibrary* library; } FakeKernel;
typedef struct { int order; struct { int type, id; } src_hint, dst_hint; unsigned flags; } MemcpyAttributes;

enum {
  kErrInvalidValue = 1, kErrRequiresNewerDriver = 36, kErrInvalidDeviceFunction = 98,
  kErrInvalidConfiguration = 9, kErrUnsupportedPtxVersion = 222, kErrSymbolNotFound = 500,
  kErrStreamCaptureUnsupported = 900
};

static long g_libraries; /* loaded and not unloaded (fake_gpu_libraries) */
/* Table entries run, and those copies among them whose source and destination are not
 * congruent modulo 16, which the kernel cannot move as 16-byte vectors. */
static long g_entries, g_narrow;

long fake_gpu_libraries(void) { return g_libraries; }
void fake_gpu_kernel_entries(long* out) {
  out[0] = __sync_fetch_and_add(&g_entries, 0);
  out[1] = __sync_fetch_and_add(&g_narrow, 0);
}

static int no_library(const char* when) {
  const char* v = getenv("FAKE_CUDA_NO_LIBRARY");
  return v != NULL && strcmp(v, when) == 0;
}

/* ---------------------------------------------------------------- the library */

int cudaLibraryLoadData(void** library, const void* code, void* jit_options, void** jit_values,
                        unsigned num_jit, void* options, void** values, unsigned num_options) {
  if (no_library("1")) return kErrUnsupportedPtxVersion;
  const char* ptx = (const char*)code;
  /* The PTX's parameter must be the table the host fills: a stale PTX shows here. */
  char expected[96];
  snprintf(expected, sizeof expected, ".entry %s(\n\t.param .align 8 .b8 %s_param_0[%zu]",
           KERNEL_NAME, KERNEL_NAME, sizeof(PerseusCopyTable));
  if (ptx == NULL || strstr(ptx, ".version ") == NULL || strstr(ptx, expected) == NULL) {
    fake_misuse("cudaLibraryLoadData: not the pack kernel's PTX with a %zu-byte table",
                sizeof(PerseusCopyTable));
    return 218; /* cudaErrorInvalidPtx */
  }
  FakeLibrary* lib = (FakeLibrary*)malloc(sizeof *lib);
  lib->magic = LIBRARY_MAGIC;
  *library = lib;
  __sync_fetch_and_add(&g_libraries, 1);
  return 0;
}

int cudaLibraryGetKernel(void** kernel, void* library, const char* name) {
  FakeLibrary* lib = (FakeLibrary*)library;
  if (lib == NULL || lib->magic != LIBRARY_MAGIC) {
    fake_misuse("cudaLibraryGetKernel on %p, not a loaded library", library);
    return 400;
  }
  if (strcmp(name, KERNEL_NAME) != 0) return kErrSymbolNotFound;
  FakeKernel* k = (FakeKernel*)malloc(sizeof *k);
  k->magic = KERNEL_MAGIC;
  k->library = lib;
  *kernel = k;
  return 0;
}

int cudaLibraryUnload(void* library) {
  FakeLibrary* lib = (FakeLibrary*)library;
  if (lib == NULL || lib->magic != LIBRARY_MAGIC) {
    fake_misuse("cudaLibraryUnload of %p, not a loaded library", library);
    return 400;
  }
  lib->magic = 0; /* its kernels now fail the magic check; both are leaked on purpose */
  __sync_fetch_and_sub(&g_libraries, 1);
  return 0;
}

/* ---------------------------------------------------------------- the kernel */

/* What one launch touches: [lo, hi) of entry `entry`, from consecutive blocks. */
typedef struct { unsigned entry; uint64_t lo, hi; } Run;

/* The entry block b serves, as the kernel finds it: the last whose first block <= b. */
static unsigned entry_of(const PerseusCopyTable* t, unsigned b) {
  unsigned i = 0;
  while (i + 1 < t->count && t->first_block[i + 1] <= b) ++i;
  return i;
}

static int overlap(uintptr_t a, uint64_t an, uintptr_t b, uint64_t bn) {
  return a < b + bn && b < a + an;
}

/* Two runs of one launch may not write the same bytes, nor one write what another
 * reads: the blocks of a launch run in no set order. */
static void check_disjoint(const PerseusCopyTable* t, const Run* runs, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uintptr_t di = (uintptr_t)t->dst[runs[i].entry] + runs[i].lo;
    uint64_t len = runs[i].hi - runs[i].lo;
    for (size_t j = 0; j < n; ++j) {
      uintptr_t dj = (uintptr_t)t->dst[runs[j].entry] + runs[j].lo;
      const char* sj = (const char*)t->src[runs[j].entry];
      uint64_t lj = runs[j].hi - runs[j].lo;
      if (j > i && overlap(di, len, dj, lj))
        fake_misuse("the pack kernel: entries %u and %u write the same bytes at %p", runs[i].entry,
                    runs[j].entry, (void*)(di > dj ? di : dj));
      if (sj != NULL && overlap(di, len, (uintptr_t)sj + runs[j].lo, lj))
        fake_misuse("the pack kernel: entry %u writes bytes that entry %u reads", runs[i].entry,
                    runs[j].entry);
    }
  }
}

static void run_table(const PerseusCopyTable* t, unsigned blocks, OrderAgent* stream) {
  if (t->count < 1 || t->count > PERSEUS_COPY_MAX_ENTRIES || t->first_block[0] != 0) {
    fake_misuse("the pack kernel's table: %u entries, first block %u", t->count, t->first_block[0]);
    return;
  }
  for (unsigned i = 0; i < t->count; ++i) {
    __sync_fetch_and_add(&g_entries, 1);
    if (t->src[i] != NULL && (((uintptr_t)t->src[i] ^ (uintptr_t)t->dst[i]) & 15) != 0)
      __sync_fetch_and_add(&g_narrow, 1);
  }
  Run* runs = (Run*)malloc(((size_t)blocks + 1) * sizeof(Run));
  size_t n = 0;
  for (unsigned b = 0; b < blocks; ++b) {
    unsigned e = entry_of(t, b);
    uint64_t lo = (uint64_t)(b - t->first_block[e]) * PERSEUS_COPY_CHUNK_BYTES;
    if (lo >= t->bytes[e]) continue; /* past its entry: the kernel returns */
    uint64_t hi = lo + PERSEUS_COPY_CHUNK_BYTES < t->bytes[e] ? lo + PERSEUS_COPY_CHUNK_BYTES : t->bytes[e];
    if (n > 0 && runs[n - 1].entry == e && runs[n - 1].hi == lo) {
      runs[n - 1].hi = hi;
    } else {
      runs[n].entry = e;
      runs[n].lo = lo;
      runs[n++].hi = hi;
    }
  }
  check_disjoint(t, runs, n);
  for (size_t i = 0; i < n; ++i) {
    const char* src = (const char*)t->src[runs[i].entry];
    char* dst = (char*)t->dst[runs[i].entry] + runs[i].lo;
    size_t len = runs[i].hi - runs[i].lo;
    order_on_stream(stream, "the pack kernel", src ? src + runs[i].lo : NULL, src ? len : 0, dst, len);
    if (src) memmove(dst, src + runs[i].lo, len);
    else memset(dst, 0, len);
  }
  free(runs);
}

int cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t shared, void* stream) {
  const FakeKernel* k = (const FakeKernel*)func;
  if (k == NULL || k->magic != KERNEL_MAGIC || k->library->magic != LIBRARY_MAGIC) {
    fake_misuse("cudaLaunchKernel of %p, not a kernel of a loaded library", func);
    return kErrInvalidDeviceFunction;
  }
  if (fake_check_stream(stream, "cudaLaunchKernel")) return 400;
  if (grid.x == 0 || grid.y != 1 || grid.z != 1 || block.x == 0 || block.x > PERSEUS_COPY_THREADS ||
      block.y != 1 || block.z != 1 || shared != 0) {
    fake_misuse("cudaLaunchKernel: grid %ux%ux%u, block %ux%ux%u, %zu bytes shared (the pack "
                "kernel is one-dimensional, at most %d threads a block, no shared memory)",
                grid.x, grid.y, grid.z, block.x, block.y, block.z, shared, PERSEUS_COPY_THREADS);
    return kErrInvalidConfiguration;
  }
  if (no_library("launch")) return kErrUnsupportedPtxVersion; /* every time: it never compiles */
  fake_count_call(kCallLaunch);
  if (fake_timing_mode()) return 0;
  run_table((const PerseusCopyTable*)args[0], grid.x, fake_stream_agent(stream));
  return 0;
}

/* ---------------------------------------------------------------- batched copies */

/* CUDA 12.8 and 12.9: (..., numAttrs, size_t* failIdx, stream); CUDA 13: (..., numAttrs,
 * stream). Declared with nine arguments: under 13 the ninth is never read. */
int cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* sizes,
                         size_t count, MemcpyAttributes* attrs, size_t* attr_indices,
                         size_t num_attrs, void* eighth, void* ninth) {
  const int version = fake_runtime_version();
  if (version < 12080) {
    fake_misuse("cudaMemcpyBatchAsync called though the runtime (%d) is older than 12.8", version);
    return kErrInvalidValue;
  }
  void* stream = version >= 13000 ? eighth : ninth;
  size_t* fail_index = version >= 13000 ? NULL : (size_t*)eighth;
  if (fake_is_legacy_stream(stream)) {
    fake_misuse("cudaMemcpyBatchAsync on the legacy stream, which it refuses");
    return kErrInvalidValue;
  }
  if (fake_check_stream(stream, "cudaMemcpyBatchAsync")) return 400;
  const char* no_batch = getenv("FAKE_CUDA_NO_BATCH_COPY");
  if (no_batch && strcmp(no_batch, "1") == 0) return kErrRequiresNewerDriver;
  if (no_batch && strcmp(no_batch, "capture") == 0) return kErrStreamCaptureUnsupported;
  if (count == 0 || num_attrs == 0 || num_attrs > count || attr_indices[0] != 0) {
    fake_misuse("cudaMemcpyBatchAsync: %zu copies, %zu attributes", count, num_attrs);
    return kErrInvalidValue;
  }
  for (size_t a = 0; a < num_attrs; ++a) {
    if (attrs[a].order < 1 || attrs[a].order > 3) {
      fake_misuse("cudaMemcpyBatchAsync: attribute %zu has source access order %d", a, attrs[a].order);
      if (fail_index) *fail_index = attr_indices[a];
      return kErrInvalidValue;
    }
  }
  fake_count_call(kCallLaunch);
  if (fake_timing_mode()) return 0;
  OrderAgent* agent = fake_stream_agent(stream);
  for (size_t i = 0; i < count; ++i) {
    order_on_stream(agent, "cudaMemcpyBatchAsync", srcs[i], sizes[i], dsts[i], sizes[i]);
    memmove(dsts[i], srcs[i], sizes[i]);
  }
  return 0;
}
