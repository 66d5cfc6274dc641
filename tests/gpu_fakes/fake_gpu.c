/* A stand-in for the CUDA runtime and NCCL, so that Perseus's device lanes can be
 * tested on machines without a GPU. "Device" memory is host memory and every stream
 * operation runs at once on the calling thread. This file is the runtime; NCCL is in
 * fake_nccl.c (collectives over MPI_COMM_WORLD point to point, one tag per
 * communicator), which runs every NCCL call as a kernel of the device model in
 * fake_device.c (a kernel holds one of the GPU's FAKE_GPU_KERNEL_SLOTS until its peers
 * start it; deadlocks are reported, not hung in). Running everything at once cannot
 * show a missing stream wait by itself: the ordering checker (fake_order.c, model in
 * fake_gpu.h) does, deterministically, from the waits the caller asked for.
 *
 * What it checks, counting each violation as a misuse (fake_gpu_stats):
 *   - every stream operation, NCCL call and test kernel (fake_gpu_kernel) is ordered
 *     after the earlier operations of other streams on the same bytes (races);
 *   - stream work (copies, memsets, stream-ordered allocations) is issued while the
 *     stream's device is current (a missing device switch in Perseus);
 *   - an event is recorded on a stream of the event's own device;
 *   - an NCCL operation's stream belongs to the communicator's device;
 *   - user reduction operators are destroyed before their communicator;
 *   - NCCL kernels do not deadlock the GPU, and (with launch order implicit) no two
 *     threads launch NCCL work on one GPU at once (fake_device.c).
 * It counts live streams, device and pinned buffers and communicators, so a test can
 * see that shutdown frees them. Built by tests/support/fake_gpu.py as one library that both
 * libcudart.so.12 and libnccl.so.2 link to.
 *
 * FAKE_GPU_TIMING=1: a timing mode for measuring the host cost of Perseus's GPU path
 * (benchmarks/gpu_host_cost.py): copies, memsets and NCCL calls move no data and return
 * at once, and the ordering checker and the device model are off; results are meaningless.
 *
 * The pack kernel's library (cudaLibrary*, cudaLaunchKernel) and cudaMemcpyBatchAsync
 * are in fake_kernel.c. FAKE_CUDA_RUNTIME_VERSION (default 12080, i.e. 12.8) sets the
 * runtime and driver versions reported, and so which cudaMemcpyBatchAsync there is.
 *
 * cudaDeviceGetPCIBusId names each process's devices apart ("fake-<pid>.<device>"): the
 * fake models one GPU per rank. FAKE_GPU_PCI_BUS_ID=<id> names device d "<id>.<d>" in
 * every process instead, as where ranks share a GPU.
 *
 * Failure injection (environment): FAKE_CUDA_DEVICES (device count, default 1; 0 = no
 * device); the NCCL ones are in fake_nccl.c.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_gpu.h"

#define STREAM_MAGIC 0x5eea0001
#define EVENT_MAGIC 0x5eea0002

typedef struct {
  int magic, device;
  OrderAgent* order;
  long serial; /* created so many streams into this process (for the wait jitter) */
  long waits;  /* cudaStreamWaitEvent calls on it so far */
} FakeStream;
typedef struct { int magic; int device; OrderSnapshot* recorded; } FakeEvent;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static long g_stats[kStats];
static long g_calls[kCallKinds]; /* by kind (fake_gpu.h) */
static char g_misuse_text[512];
static __thread int t_device = 0;
static long g_streams_made;

static void tally(long* counter, long delta) {
  pthread_mutex_lock(&g_mu);
  *counter += delta;
  pthread_mutex_unlock(&g_mu);
}

void fake_misuse(const char* fmt, ...) {
  char text[512];
  va_list args;
  va_start(args, fmt);
  vsnprintf(text, sizeof text, fmt, args);
  va_end(args);
  pthread_mutex_lock(&g_mu);
  g_stats[kStatMisuse]++;
  memcpy(g_misuse_text, text, sizeof text);
  pthread_mutex_unlock(&g_mu);
  fprintf(stderr, "fake_gpu MISUSE: %s\n", text);
}
#define misuse fake_misuse

/* out: live device buffers, pinned buffers, streams, events, communicators, misuses,
 * communicators ever created, NCCL data calls ever made. */
void fake_gpu_stats(long* out) {
  pthread_mutex_lock(&g_mu);
  for (int k = 0; k < kStats; ++k) out[k] = g_stats[k];
  pthread_mutex_unlock(&g_mu);
}
const char* fake_gpu_last_misuse(void) { return g_misuse_text; }

/* out: cudaEventRecord, cudaStreamWaitEvent, copies and memsets, kernel launches and
 * batched copies, NCCL data calls, cudaSetDevice: calls made since the process began. */
void fake_gpu_calls(long* out) {
  pthread_mutex_lock(&g_mu);
  for (int k = 0; k < kCallKinds; ++k) out[k] = g_calls[k];
  pthread_mutex_unlock(&g_mu);
}

static int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

int fake_timing_mode(void) {
  static int timing = -1;
  if (timing < 0) timing = env_int("FAKE_GPU_TIMING", 0) == 1;
  return timing;
}

/* ---------------------------------------------------------------- CUDA runtime */

static int device_count(void) { return env_int("FAKE_CUDA_DEVICES", 1); }

static int stream_device(void* s) {
  if (s == NULL || s == (void*)1 || s == (void*)2) return t_device; /* legacy, per-thread */
  FakeStream* fs = (FakeStream*)s;
  if (fs->magic != STREAM_MAGIC) {
    misuse("%p is not a live stream", s);
    return -1;
  }
  return fs->device;
}

/* The ordering checker's agent for a stream (NULL when the checker is off). */
static OrderAgent* agent(void* s) {
  if (s == NULL || s == (void*)1 || s == (void*)2) return order_legacy_stream(t_device);
  FakeStream* fs = (FakeStream*)s;
  return fs->magic == STREAM_MAGIC ? fs->order : NULL;
}

static int check_current(void* s, const char* what) {
  int d = stream_device(s);
  if (d != t_device) {
    misuse("%s on a stream of device %d while device %d is current", what, d, t_device);
    return 400;
  }
  return 0;
}

int fake_runtime_version(void) { return env_int("FAKE_CUDA_RUNTIME_VERSION", 12080); }
int cudaRuntimeGetVersion(int* v) { *v = fake_runtime_version(); return 0; }
int cudaDriverGetVersion(int* v) { *v = fake_runtime_version(); return 0; }
int cudaGetDeviceCount(int* n) {
  *n = device_count();
  return *n > 0 ? 0 : 100; /* cudaErrorNoDevice */
}
int cudaGetDevice(int* d) { *d = t_device; return 0; }
int cudaSetDevice(int d) {
  tally(&g_calls[kCallSetDevice], 1);
  if (d < 0 || d >= device_count()) return 101; /* cudaErrorInvalidDevice */
  t_device = d;
  return 0;
}
int cudaDeviceGetPCIBusId(char* id, int length, int d) {
  if (d < 0 || d >= device_count()) return 101; /* cudaErrorInvalidDevice */
  const char* shared = getenv("FAKE_GPU_PCI_BUS_ID");
  if (shared != NULL && shared[0] != '\0') snprintf(id, (size_t)length, "%s.%d", shared, d);
  else snprintf(id, (size_t)length, "fake-%ld.%d", (long)getpid(), d);
  return 0;
}
const char* cudaGetErrorString(int e) { return e == 0 ? "no error" : "fake CUDA error"; }
int cudaGetLastError(void) { return 0; }

int cudaStreamCreateWithFlags(void** s, unsigned flags) {
  FakeStream* fs = (FakeStream*)malloc(sizeof *fs);
  fs->magic = STREAM_MAGIC;
  fs->device = t_device;
  fs->order = order_new_stream(t_device);
  fs->waits = 0;
  pthread_mutex_lock(&g_mu);
  fs->serial = g_streams_made++;
  g_stats[kStatStreams]++;
  pthread_mutex_unlock(&g_mu);
  *s = fs;
  return 0;
}
int cudaStreamDestroy(void* s) {
  if (stream_device(s) < 0) return 400;
  ((FakeStream*)s)->magic = 0;
  free(s);
  tally(&g_stats[kStatStreams], -1);
  return 0;
}
/* Work runs at once, so a stream is always idle: what a sync or a successful query
 * adds is the knowledge that its work is done (the checker's host clock). */
static int host_sync(void* s) {
  if (stream_device(s) < 0) return 400;
  order_host_sync(agent(s));
  return 0;
}
int cudaStreamSynchronize(void* s) { return host_sync(s); }
int cudaStreamQuery(void* s) { return host_sync(s); }
/* FAKE_GPU_WAIT_JITTER_US=<n>: a wait on a created stream first sleeps up to n
 * microseconds, by a hash of (world rank, the stream's serial, its count of waits): a
 * device lane waits for its inputs before it takes its launch turn, so lanes (of
 * different process sets too) reach their launches in different orders on different
 * ranks, the same in every run. */
static void wait_jitter(FakeStream* fs) {
  int most = env_int("FAKE_GPU_WAIT_JITTER_US", 0), initialized = 0, world = 0;
  if (most <= 0) return;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &world);
  uint64_t h = ((uint64_t)world * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)fs->serial << 40) ^
               (uint64_t)__sync_fetch_and_add(&fs->waits, 1);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 29;
  usleep((useconds_t)(h % (uint64_t)most));
}
int cudaStreamWaitEvent(void* s, void* e, unsigned flags) {
  tally(&g_calls[kCallWait], 1);
  if (stream_device(s) < 0 || ((FakeEvent*)e)->magic != EVENT_MAGIC) return 400;
  if (s != NULL && s != (void*)1 && s != (void*)2) wait_jitter((FakeStream*)s); /* not legacy, per-thread */
  order_stream_wait(agent(s), ((FakeEvent*)e)->recorded);
  return 0;
}
int cudaEventCreateWithFlags(void** e, unsigned flags) {
  FakeEvent* fe = (FakeEvent*)malloc(sizeof *fe);
  fe->magic = EVENT_MAGIC;
  fe->device = t_device;
  fe->recorded = NULL;
  *e = fe;
  tally(&g_stats[kStatEvents], 1);
  return 0;
}
int cudaEventDestroy(void* e) {
  order_event_free(((FakeEvent*)e)->recorded);
  ((FakeEvent*)e)->magic = 0;
  free(e);
  tally(&g_stats[kStatEvents], -1);
  return 0;
}
int cudaEventRecord(void* e, void* s) {
  tally(&g_calls[kCallRecord], 1);
  FakeEvent* fe = (FakeEvent*)e;
  if (fe->magic != EVENT_MAGIC) {
    misuse("cudaEventRecord of %p, not an event", e);
    return 400;
  }
  int d = stream_device(s);
  if (d != fe->device) {
    misuse("event of device %d recorded on a stream of device %d", fe->device, d);
    return 400;
  }
  order_event_record(&fe->recorded, agent(s));
  return 0;
}
/* New memory holds garbage, as a GPU's may (fresh pages from malloc would be zeros,
 * hiding a zero fill that was never made). */
static void* fake_alloc(size_t n) {
  void* memory = malloc(n ? n : 1);
  if (!fake_timing_mode()) memset(memory, 0xCD, n);
  order_allocated(memory, n);
  return memory;
}
int cudaMalloc(void** p, size_t n) {
  void* memory = fake_alloc(n);
  *p = memory;
  tally(&g_stats[kStatDevice], 1);
  return 0;
}
int cudaFree(void* p) {
  if (p == NULL) return 0;
  order_forget_allocation(p);
  free(p);
  tally(&g_stats[kStatDevice], -1);
  return 0;
}
/* Stream-ordered memory belongs to its stream until other streams are ordered after
 * the allocation; freeing it is a last write, after every use. */
int cudaMallocAsync(void** p, size_t n, void* s) {
  if (check_current(s, "cudaMallocAsync")) return 400;
  cudaMalloc(p, n);
  order_on_stream(agent(s), "cudaMallocAsync", NULL, 0, *p, n);
  return 0;
}
int cudaFreeAsync(void* p, void* s) {
  if (check_current(s, "cudaFreeAsync")) return 400;
  order_on_stream(agent(s), "cudaFreeAsync", NULL, 0, p, order_allocation_size(p));
  return cudaFree(p);
}
int cudaMallocHost(void** p, size_t n) {
  void* memory = fake_alloc(n);
  *p = memory;
  tally(&g_stats[kStatHost], 1);
  return 0;
}
int cudaFreeHost(void* p) {
  order_forget_allocation(p);
  free(p);
  tally(&g_stats[kStatHost], -1);
  return 0;
}
int cudaMemcpyAsync(void* dst, const void* src, size_t n, int kind, void* s) {
  tally(&g_calls[kCallCopy], 1);
  if (check_current(s, "cudaMemcpyAsync")) return 400;
  if (kind < 1 || kind > 4) misuse("cudaMemcpyAsync kind %d", kind);
  if (fake_timing_mode()) return 0;
  order_on_stream(agent(s), "cudaMemcpyAsync", src, n, dst, n);
  memmove(dst, src, n);
  return 0;
}
int cudaMemsetAsync(void* p, int value, size_t n, void* s) {
  tally(&g_calls[kCallCopy], 1);
  if (check_current(s, "cudaMemsetAsync")) return 400;
  if (fake_timing_mode()) return 0;
  order_on_stream(agent(s), "cudaMemsetAsync", NULL, 0, p, n);
  memset(p, value, n);
  return 0;
}

/* ---------------------------------------------------------------- for fake_kernel.c */
void fake_count_call(int kind) { tally(&g_calls[kind], 1); }
int fake_env_int(const char* name, int fallback) { return env_int(name, fallback); }
int fake_check_stream(void* stream, const char* what) { return check_current(stream, what); }
OrderAgent* fake_stream_agent(void* stream) { return agent(stream); }
int fake_is_legacy_stream(void* stream) { return stream == NULL || stream == (void*)1; }

/* ---------------------------------------------------------------- for fake_nccl.c */
int fake_stream_device(void* stream) { return stream_device(stream); }
int fake_current_device(void) { return t_device; }
void fake_stat_add(int stat, long delta) { tally(&g_stats[stat], delta); }

/* ---------------------------------------------------------------- for tests
 * A framework's kernel on `stream` (a producer writing an input, a consumer reading an
 * output): only its accesses, for the ordering checker; the data is the caller's. */
int fake_gpu_kernel(void* stream, const void* read, size_t nread, void* write, size_t nwrite) {
  if (check_current(stream, "fake_gpu_kernel")) return 400;
  order_on_stream(agent(stream), "the framework's kernel", read, nread, write, nwrite);
  return 0;
}
void fake_gpu_name_stream(void* stream, const char* label) { order_name(agent(stream), label); }
/* The host reading (or writing) memory, e.g. a result after synchronising its stream. */
void fake_gpu_host_access(const void* p, size_t n, int write) {
  order_host_access(write ? "a host write" : "a host read", p, n, write);
}
