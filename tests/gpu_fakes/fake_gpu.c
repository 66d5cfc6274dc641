/* A stand-in for the CUDA runtime and NCCL, so that Perseus's device lanes can be
 * tested on machines without a GPU. "Device" memory is host memory and every stream
 * operation runs at once on the calling thread; NCCL operations run over
 * MPI_COMM_WORLD point to point (one tag per communicator). Running everything at once
 * cannot show a missing stream wait by itself: the ordering checker (fake_order.c,
 * model in fake_gpu.h) does, deterministically, from the waits the caller asked for.
 *
 * What it checks, counting each violation as a misuse (fake_gpu_stats):
 *   - every stream operation, NCCL call and test kernel (fake_gpu_kernel) is ordered
 *     after the earlier operations of other streams on the same bytes (races);
 *   - stream work (copies, memsets, stream-ordered allocations) is issued while the
 *     stream's device is current (a missing device switch in Perseus);
 *   - an event is recorded on a stream of the event's own device;
 *   - an NCCL operation's stream belongs to the communicator's device;
 *   - user reduction operators are destroyed before their communicator.
 * It counts live streams, device and pinned buffers and communicators, so a test can
 * see that shutdown frees them. Built by tests/test_gpu_core.py as one library that
 * both libcudart.so.12 and libnccl.so.2 link to.
 *
 * NCCL's one-rank reductions that scale (PreMulSum, Average of floats) leave the last
 * elements unwritten before NCCL 2.29.7, as the real kernel does (one_rank_written);
 * FAKE_NCCL_VERSION (default 22305, i.e. 2.23.5) sets the version reported and modelled.
 *
 * FAKE_GPU_TIMING=1: a timing mode for measuring the host cost of Perseus's GPU path
 * (benchmarks/gpu_host_cost.py): copies, memsets and NCCL calls move no data and return
 * at once, and the ordering checker is off; results are meaningless.
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
 * device); FAKE_NCCL_FAIL_INIT_RANK=<world rank> makes ncclCommInitRank fail there
 * (after the exchange, so nobody hangs); FAKE_NCCL_FAIL_ALLREDUCE_AFTER=<n> makes
 * every ncclAllReduce after the n-th fail on every rank (use at one rank only).
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
#define COMM_MAGIC 0x5eea0003
#define MAX_OPS 64

typedef struct { int magic; int device; OrderAgent* order; } FakeStream;
typedef struct { int magic; int device; OrderSnapshot* recorded; } FakeEvent;
typedef struct {
  int magic, device, rank, nranks, tag;
  int* world; /* comm rank -> world rank */
  int op_used[MAX_OPS];
  double op_scalar[MAX_OPS];
} FakeComm;
typedef struct { char internal[128]; } ncclUniqueId;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static long g_live_device, g_live_host, g_live_streams, g_live_events, g_live_comms, g_misuse;
static long g_allreduces, g_comms_created, g_nccl_calls;
static long g_calls[kCallKinds]; /* by kind (fake_gpu.h) */
static char g_misuse_text[512];
static __thread int t_device = 0;
static __thread int t_group_depth = 0;
static __thread MPI_Request* t_pending = NULL;
static __thread int t_npending = 0, t_cap = 0;

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
  g_misuse++;
  memcpy(g_misuse_text, text, sizeof text);
  pthread_mutex_unlock(&g_mu);
  fprintf(stderr, "fake_gpu MISUSE: %s\n", text);
}
#define misuse fake_misuse

/* out: live device buffers, pinned buffers, streams, events, communicators, misuses,
 * communicators ever created, NCCL data calls ever made. */
void fake_gpu_stats(long* out) {
  pthread_mutex_lock(&g_mu);
  out[6] = g_comms_created;
  out[7] = g_nccl_calls;
  out[0] = g_live_device;
  out[1] = g_live_host;
  out[2] = g_live_streams;
  out[3] = g_live_events;
  out[4] = g_live_comms;
  out[5] = g_misuse;
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
  *s = fs;
  tally(&g_live_streams, 1);
  return 0;
}
int cudaStreamDestroy(void* s) {
  if (stream_device(s) < 0) return 400;
  ((FakeStream*)s)->magic = 0;
  free(s);
  tally(&g_live_streams, -1);
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
int cudaStreamWaitEvent(void* s, void* e, unsigned flags) {
  tally(&g_calls[kCallWait], 1);
  if (stream_device(s) < 0 || ((FakeEvent*)e)->magic != EVENT_MAGIC) return 400;
  order_stream_wait(agent(s), ((FakeEvent*)e)->recorded);
  return 0;
}
int cudaEventCreateWithFlags(void** e, unsigned flags) {
  FakeEvent* fe = (FakeEvent*)malloc(sizeof *fe);
  fe->magic = EVENT_MAGIC;
  fe->device = t_device;
  fe->recorded = NULL;
  *e = fe;
  tally(&g_live_events, 1);
  return 0;
}
int cudaEventDestroy(void* e) {
  order_event_free(((FakeEvent*)e)->recorded);
  ((FakeEvent*)e)->magic = 0;
  free(e);
  tally(&g_live_events, -1);
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
  tally(&g_live_device, 1);
  return 0;
}
int cudaFree(void* p) {
  if (p == NULL) return 0;
  order_forget_allocation(p);
  free(p);
  tally(&g_live_device, -1);
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
  tally(&g_live_host, 1);
  return 0;
}
int cudaFreeHost(void* p) {
  order_forget_allocation(p);
  free(p);
  tally(&g_live_host, -1);
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

/* ---------------------------------------------------------------- NCCL */

enum { kInt8, kUint8, kInt32, kUint32, kInt64, kUint64, kF16, kF32, kF64, kBf16 };
enum { kSum, kProd, kMax, kMin, kAvg };

static size_t type_size(int t) {
  switch (t) {
    case kInt8: case kUint8: return 1;
    case kF16: case kBf16: return 2;
    case kInt32: case kUint32: case kF32: return 4;
    default: return 8;
  }
}

static double half_to_double(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  double v;
  if (exp == 0) v = mant / 1024.0 / 16384.0;
  else if (exp == 31) v = mant ? 0.0 / 0.0 : 1.0 / 0.0;
  else v = (1.0 + mant / 1024.0) * (double)(1 << exp) / 32768.0;
  return sign ? -v : v;
}
static uint16_t double_to_half(double d) { /* round to nearest, via float bits */
  float f = (float)d;
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int exp = (int)((x >> 23) & 255) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (((x >> 23) & 255) == 255) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    mant |= 0x800000;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t h = mant >> shift, rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)exp << 10) | (mant >> 13), rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
  return (uint16_t)(sign | h);
}
static double bf16_to_double(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static uint16_t double_to_bf16(double d) {
  float f = (float)d;
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

static double load_f(const char* p, int t) {
  uint16_t h;
  switch (t) {
    case kF16: memcpy(&h, p, 2); return half_to_double(h);
    case kBf16: memcpy(&h, p, 2); return bf16_to_double(h);
    case kF32: { float f; memcpy(&f, p, 4); return f; }
    default: { double d; memcpy(&d, p, 8); return d; }
  }
}
static void store_f(char* p, int t, double v) {
  uint16_t h;
  switch (t) {
    case kF16: h = double_to_half(v); memcpy(p, &h, 2); break;
    case kBf16: h = double_to_bf16(v); memcpy(p, &h, 2); break;
    case kF32: { float f = (float)v; memcpy(p, &f, 4); break; }
    default: memcpy(p, &v, 8);
  }
}
static int64_t load_i(const char* p, int t) {
  switch (t) {
    case kInt8: return *(const int8_t*)p;
    case kUint8: return *(const uint8_t*)p;
    case kInt32: { int32_t v; memcpy(&v, p, 4); return v; }
    case kUint32: { uint32_t v; memcpy(&v, p, 4); return v; }
    default: { int64_t v; memcpy(&v, p, 8); return v; }
  }
}
static void store_i(char* p, int t, int64_t v) {
  switch (t) {
    case kInt8: case kUint8: *(int8_t*)p = (int8_t)v; break;
    case kInt32: case kUint32: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
    default: memcpy(p, &v, 8);
  }
}
static int is_float(int t) { return t == kF16 || t == kF32 || t == kF64 || t == kBf16; }

/* out[i] = op over ranks of all[r][i], in rank order. */
static void reduce(char* out, char** all, size_t count, int t, int op, FakeComm* c) {
  size_t es = type_size(t);
  double scalar = 1.0;
  int premul = op >= 5;
  if (premul) scalar = c->op_scalar[op - 5];
  for (size_t i = 0; i < count; ++i) {
    if (is_float(t)) {
      double acc = 0;
      for (int r = 0; r < c->nranks; ++r) {
        double x = load_f(all[r] + i * es, t);
        if (premul) x *= scalar;
        if (r == 0) acc = x;
        else if (op == kProd) acc *= x;
        else if (op == kMax) acc = x > acc ? x : acc;
        else if (op == kMin) acc = x < acc ? x : acc;
        else acc += x;
      }
      if (op == kAvg) acc /= c->nranks;
      store_f(out + i * es, t, acc);
    } else {
      int64_t acc = 0;
      for (int r = 0; r < c->nranks; ++r) {
        int64_t x = load_i(all[r] + i * es, t);
        if (premul) misuse("PreMulSum on an integer type");
        if (r == 0) acc = x;
        else if (op == kProd) acc = (int64_t)((uint64_t)acc * (uint64_t)x);
        else if (op == kMax) acc = x > acc ? x : acc;
        else if (op == kMin) acc = x < acc ? x : acc;
        else acc = (int64_t)((uint64_t)acc + (uint64_t)x);
      }
      if (op == kAvg) acc /= c->nranks;
      store_i(out + i * es, t, acc);
    }
  }
}

static int nccl_version(void) { return env_int("FAKE_NCCL_VERSION", 22305); }

/* How many of `count` elements a one-rank reduction writes. NCCL short-cuts one-rank
 * communicators: a copy, or for operators that scale (PreMulSum; Average of floats,
 * which NCCL turns into one) a kernel of bn = min(32, ceil(bytes / 16 KiB)) blocks,
 * block b covering [b * per, (b + 1) * per) with per = floor(count / bn) rounded up to
 * whole 16-byte packs. Before NCCL 2.29.7 nothing covers the rest when count does not
 * split evenly (NVIDIA/nccl#1950: 3 of 4,194,307 float32 elements left unwritten). */
static size_t one_rank_written(size_t count, int t, int op) {
  int scales = op >= 5 || (op == kAvg && is_float(t));
  if (!scales || nccl_version() >= 22907 || count == 0) return count;
  size_t es = type_size(t), per_pack = 16 / es;
  size_t blocks = (count * es + (16 << 10) - 1) / (16 << 10);
  if (blocks > 32) blocks = 32;
  size_t per = (count / blocks + per_pack - 1) / per_pack * per_pack, end = 0;
  for (size_t b = 0; b < blocks; ++b) {
    size_t i1 = (b + 1) * per < count ? (b + 1) * per : count;
    if (i1 > end) end = i1;
  }
  return end;
}

static int check_comm(FakeComm* c, void* stream, const char* what) {
  if (c == NULL || c->magic != COMM_MAGIC) {
    misuse("%s on %p, not a live communicator", what, (void*)c);
    return 4;
  }
  tally(&g_nccl_calls, 1);
  tally(&g_calls[kCallNccl], 1);
  int d = stream_device(stream);
  if (d != c->device) {
    misuse("%s: stream of device %d, communicator of device %d", what, d, c->device);
    return 4;
  }
  return 0;
}

static void post(MPI_Request r) {
  if (t_npending == t_cap) {
    t_cap = t_cap ? 2 * t_cap : 16;
    t_pending = (MPI_Request*)realloc(t_pending, t_cap * sizeof(MPI_Request));
  }
  t_pending[t_npending++] = r;
}
static void isend(FakeComm* c, int peer, const void* p, size_t n) {
  MPI_Request r;
  MPI_Isend(p, (int)n, MPI_BYTE, c->world[peer], c->tag, MPI_COMM_WORLD, &r);
  post(r);
}
static void irecv(FakeComm* c, int peer, void* p, size_t n) {
  MPI_Request r;
  MPI_Irecv(p, (int)n, MPI_BYTE, c->world[peer], c->tag, MPI_COMM_WORLD, &r);
  post(r);
}
static void complete(void) {
  MPI_Waitall(t_npending, t_pending, MPI_STATUSES_IGNORE);
  t_npending = 0;
}
/* Collectives complete at once (they are posted and waited in the same order on every
 * rank); sends and receives in a group wait for ncclGroupEnd. */
static void complete_unless_grouped(void) {
  if (t_group_depth == 0) complete();
}

int ncclGetVersion(int* v) { *v = nccl_version(); return 0; }
const char* ncclGetErrorString(int r) { return r == 0 ? "no error" : "fake NCCL error"; }
const char* ncclGetLastError(void* comm) { return "(fake NCCL)"; }

int ncclGetUniqueId(ncclUniqueId* id) {
  static int counter = 0;
  int world_rank, ids[2];
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  pthread_mutex_lock(&g_mu);
  ids[1] = 100 + world_rank * 1000 + counter++ % 900; /* the communicator's tag */
  pthread_mutex_unlock(&g_mu);
  ids[0] = world_rank;
  memset(id, 0, sizeof *id);
  memcpy(id->internal, ids, sizeof ids);
  return 0;
}

int ncclCommInitRank(void** out, int nranks, ncclUniqueId id, int rank) {
  int ids[2], world_rank;
  memcpy(ids, id.internal, sizeof ids);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  FakeComm* c = (FakeComm*)calloc(1, sizeof *c);
  c->magic = COMM_MAGIC;
  c->device = t_device;
  c->rank = rank;
  c->nranks = nranks;
  c->tag = ids[1];
  c->world = (int*)malloc(nranks * sizeof(int));
  if (rank == 0) { /* the creator learns who is who, then tells everyone */
    c->world[0] = world_rank;
    for (int i = 1; i < nranks; ++i) {
      int msg[2];
      MPI_Recv(msg, 2, MPI_INT, MPI_ANY_SOURCE, c->tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      c->world[msg[0]] = msg[1];
    }
    for (int r = 1; r < nranks; ++r)
      MPI_Send(c->world, nranks, MPI_INT, c->world[r], c->tag, MPI_COMM_WORLD);
  } else {
    int msg[2] = {rank, world_rank};
    MPI_Send(msg, 2, MPI_INT, ids[0], c->tag, MPI_COMM_WORLD);
    MPI_Recv(c->world, nranks, MPI_INT, ids[0], c->tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  if (env_int("FAKE_NCCL_FAIL_INIT_RANK", -1) == world_rank) {
    free(c->world);
    free(c);
    return 2; /* ncclSystemError */
  }
  tally(&g_live_comms, 1);
  tally(&g_comms_created, 1);
  *out = c;
  return 0;
}

static int destroy(FakeComm* c) {
  if (c == NULL || c->magic != COMM_MAGIC) return 4;
  for (int k = 0; k < MAX_OPS; ++k)
    if (c->op_used[k]) misuse("communicator destroyed with reduction operator %d alive", k + 5);
  c->magic = 0;
  free(c->world);
  free(c);
  tally(&g_live_comms, -1);
  return 0;
}
int ncclCommDestroy(void* c) { return destroy((FakeComm*)c); }
int ncclCommAbort(void* c) { return destroy((FakeComm*)c); }
int ncclCommGetAsyncError(void* c, int* err) {
  *err = 0;
  return 0;
}

int ncclRedOpCreatePreMulSum(int* op, void* scalar, int type, int residence, void* comm) {
  FakeComm* c = (FakeComm*)comm;
  if (residence != 1) misuse("PreMulSum scalar residence %d", residence);
  for (int k = 0; k < MAX_OPS; ++k) {
    if (!c->op_used[k]) {
      c->op_used[k] = 1;
      c->op_scalar[k] = is_float(type) ? load_f((const char*)scalar, type)
                                       : (double)load_i((const char*)scalar, type);
      *op = 5 + k;
      return 0;
    }
  }
  return 3;
}
int ncclRedOpDestroy(int op, void* comm) {
  FakeComm* c = (FakeComm*)comm;
  if (op < 5 || !c->op_used[op - 5]) misuse("ncclRedOpDestroy of unknown operator %d", op);
  else c->op_used[op - 5] = 0;
  return 0;
}

int ncclAllReduce(const void* send, void* recv, size_t count, int t, int op, void* comm, void* s) {
  FakeComm* c = (FakeComm*)comm;
  if (check_comm(c, s, "ncclAllReduce")) return 4;
  if (fake_timing_mode()) return 0;
  int fail_after = env_int("FAKE_NCCL_FAIL_ALLREDUCE_AFTER", -1);
  pthread_mutex_lock(&g_mu);
  long nth = ++g_allreduces;
  pthread_mutex_unlock(&g_mu);
  if (fail_after >= 0 && nth > fail_after) return 6; /* ncclRemoteError */
  size_t n = count * type_size(t);
  order_on_stream(agent(s), "ncclAllReduce", send, n, recv, n);
  char** all = (char**)calloc(c->nranks, sizeof(char*));
  for (int r = 0; r < c->nranks; ++r) {
    all[r] = r == c->rank ? (char*)send : (char*)malloc(n ? n : 1);
    if (r != c->rank) {
      irecv(c, r, all[r], n);
      isend(c, r, send, n);
    }
  }
  complete();
  char* result = (char*)malloc(n ? n : 1);
  reduce(result, all, count, t, op, c);
  memcpy(recv, result, c->nranks == 1 ? one_rank_written(count, t, op) * type_size(t) : n);
  for (int r = 0; r < c->nranks; ++r)
    if (r != c->rank) free(all[r]);
  free(all);
  free(result);
  return 0;
}

int ncclReduce(const void* send, void* recv, size_t count, int t, int op, int root, void* comm,
               void* s) {
  FakeComm* c = (FakeComm*)comm;
  if (check_comm(c, s, "ncclReduce")) return 4;
  if (fake_timing_mode()) return 0;
  size_t n = count * type_size(t);
  order_on_stream(agent(s), "ncclReduce", send, n, c->rank == root ? recv : NULL, n);
  if (c->rank != root) {
    isend(c, root, send, n);
    complete();
    return 0;
  }
  if (recv == NULL) misuse("ncclReduce: NULL receive buffer on the root");
  char** all = (char**)calloc(c->nranks, sizeof(char*));
  for (int r = 0; r < c->nranks; ++r) {
    all[r] = r == root ? (char*)send : (char*)malloc(n ? n : 1);
    if (r != root) irecv(c, r, all[r], n);
  }
  complete();
  char* result = (char*)malloc(n ? n : 1);
  reduce(result, all, count, t, op, c);
  memcpy(recv, result, c->nranks == 1 ? one_rank_written(count, t, op) * type_size(t) : n);
  for (int r = 0; r < c->nranks; ++r)
    if (r != root) free(all[r]);
  free(all);
  free(result);
  return 0;
}

int ncclReduceScatter(const void* send, void* recv, size_t recvcount, int t, int op, void* comm,
                      void* s) {
  FakeComm* c = (FakeComm*)comm;
  if (check_comm(c, s, "ncclReduceScatter")) return 4;
  if (fake_timing_mode()) return 0;
  size_t es = type_size(t), total = recvcount * c->nranks;
  order_on_stream(agent(s), "ncclReduceScatter", send, total * es, recv, recvcount * es);
  char* full = (char*)malloc(total * es + 1);
  /* An allreduce of the whole buffer, of which each rank keeps its block. */
  char** all = (char**)calloc(c->nranks, sizeof(char*));
  for (int r = 0; r < c->nranks; ++r) {
    all[r] = r == c->rank ? (char*)send : (char*)malloc(total * es + 1);
    if (r != c->rank) {
      irecv(c, r, all[r], total * es);
      isend(c, r, send, total * es);
    }
  }
  complete();
  reduce(full, all, total, t, op, c);
  size_t written = c->nranks == 1 ? one_rank_written(recvcount, t, op) : recvcount;
  memcpy(recv, full + c->rank * recvcount * es, written * es);
  for (int r = 0; r < c->nranks; ++r)
    if (r != c->rank) free(all[r]);
  free(all);
  free(full);
  return 0;
}

int ncclBroadcast(const void* send, void* recv, size_t count, int t, int root, void* comm, void* s) {
  FakeComm* c = (FakeComm*)comm;
  if (check_comm(c, s, "ncclBroadcast")) return 4;
  if (fake_timing_mode()) return 0;
  size_t n = count * type_size(t);
  order_on_stream(agent(s), "ncclBroadcast", c->rank == root ? send : NULL, n, recv, n);
  if (c->rank == root) {
    for (int r = 0; r < c->nranks; ++r)
      if (r != root) isend(c, r, send, n);
    memmove(recv, send, n);
  } else {
    irecv(c, root, recv, n);
  }
  complete();
  return 0;
}

int ncclAllGather(const void* send, void* recv, size_t count, int t, void* comm, void* s) {
  FakeComm* c = (FakeComm*)comm;
  if (check_comm(c, s, "ncclAllGather")) return 4;
  if (fake_timing_mode()) return 0;
  size_t n = count * type_size(t);
  order_on_stream(agent(s), "ncclAllGather", send, n, recv, n * c->nranks);
  for (int r = 0; r < c->nranks; ++r) {
    if (r == c->rank) continue;
    irecv(c, r, (char*)recv + r * n, n);
    isend(c, r, send, n);
  }
  memmove((char*)recv + c->rank * n, send, n);
  complete();
  return 0;
}

int ncclSend(const void* buf, size_t count, int t, int peer, void* comm, void* s) {
  FakeComm* c = (FakeComm*)comm;
  if (check_comm(c, s, "ncclSend")) return 4;
  if (fake_timing_mode()) return 0;
  order_on_stream(agent(s), "ncclSend", buf, count * type_size(t), NULL, 0);
  isend(c, peer, buf, count * type_size(t));
  complete_unless_grouped();
  return 0;
}

int ncclRecv(void* buf, size_t count, int t, int peer, void* comm, void* s) {
  FakeComm* c = (FakeComm*)comm;
  if (check_comm(c, s, "ncclRecv")) return 4;
  if (fake_timing_mode()) return 0;
  order_on_stream(agent(s), "ncclRecv", NULL, 0, buf, count * type_size(t));
  irecv(c, peer, buf, count * type_size(t));
  complete_unless_grouped();
  return 0;
}

int ncclGroupStart(void) {
  t_group_depth++;
  return 0;
}
int ncclGroupEnd(void) {
  if (t_group_depth <= 0) {
    misuse("ncclGroupEnd without ncclGroupStart");
    return 5;
  }
  if (--t_group_depth == 0) complete();
  return 0;
}
