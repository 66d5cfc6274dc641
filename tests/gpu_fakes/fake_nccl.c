/* The fake NCCL (fake_gpu.c's header describes the fake as a whole). Communicators
 * run over MPI_COMM_WORLD point to point, one tag per communicator; ranks that share
 * a GPU are refused as NCCL refuses them ("Duplicate GPU detected"), unless the version
 * reported is 2.30 or later and NCCL_MULTI_RANK_GPU_ENABLE=1 (and NCCL_NVLS_ENABLE is
 * not 1, an error with it). ncclCommInitRankConfig reads commName and
 * launchOrderImplicit (NCCL 2.31's ncclConfig_t).
 *
 * Every data call is a kernel of the device model (fake_device.c): it waits for a slot
 * of its GPU, then for every rank of its communicator to start the same call (a token
 * from each), and only then moves its data. Calls between ncclGroupStart and
 * ncclGroupEnd are one kernel, launched at ncclGroupEnd, as NCCL launches them. A
 * failed kernel returns ncclInternalError, and ncclGetLastError says why (a deadlock,
 * naming its wait-for cycle).
 *
 * ncclSend and ncclRecv move data between the two ranks as NCCL does, the k-th send
 * from A to B into B's k-th receive from A. Each kernel's token says what it sends to
 * and receives from the token's receiver (calls, bytes); a peer whose sends do not
 * meet this kernel's receives, or the other way round, in number or size, fails the
 * kernel on both ranks as a misuse naming both, before any data moves (real NCCL would
 * hang or write past the buffer). A peer outside the communicator is a misuse. A
 * kernel of sends and receives waits for every rank of its communicator as a
 * collective does: the fake's model (Perseus runs messages on communicators of two).
 *
 * NCCL's one-rank reductions that scale (PreMulSum, Average of floats) leave the last
 * elements unwritten before NCCL 2.29.7, as the real kernel does (one_rank_written);
 * FAKE_NCCL_VERSION (default 22305, i.e. 2.23.5) sets the version reported and modelled.
 *
 * Calls from inside this library to its own exported functions are checked to reach
 * this copy (self_bound): with another NCCL global in the process, as torch's is, a copy
 * opened without RTLD_DEEPBIND would run parts of the other (a misuse).
 *
 * Failure injection (environment): FAKE_NCCL_FAIL_INIT_RANK=<world rank> makes
 * ncclCommInitRank fail there (after the exchange, so nobody hangs);
 * FAKE_NCCL_FAIL_ALLREDUCE_AFTER=<n> makes every ncclAllReduce after the n-th fail on
 * every rank (use at one rank only); FAKE_NCCL_DIE_RANK=<world rank> with
 * FAKE_NCCL_DIE_AT_ALLREDUCE=<n>: that rank's process SIGKILLs itself as its n-th
 * ncclAllReduce starts, before its kernel tells its peers anything;
 * FAKE_NCCL_DIE_AT_INIT=<world rank>:<n> as its n-th communicator creation starts (its
 * peers then inside theirs), FAKE_NCCL_DIE_AT_P2P=<world rank>:<n> as its n-th ncclSend
 * or ncclRecv starts (its peer inside the matching one).
 *
 * Communicator creation waits, as NCCL's bootstrap does, for every rank: a peer that
 * died (or never comes) leaves it waiting for good. ncclCommInitRank, and the config
 * variant with blocking left undefined or 1, block the caller meanwhile; with
 * config.blocking = 0 (NCCL 2.14's nonblocking communicators) it returns at once and the
 * creation runs on a thread of its own: ncclCommGetAsyncError says ncclInProgress until
 * it ends (then ncclSuccess, or its error), and ncclCommAbort ends it and frees the
 * communicator. On a nonblocking communicator every launch (a call outside a group,
 * ncclGroupEnd) returns ncclInProgress and ncclCommGetAsyncError says so once more;
 * a call on a communicator whose creation or last launch is still in progress is a
 * misuse (NCCL would block or queue it; Perseus polls to ncclSuccess first).
 *
 * A peer that dies (its process ends, as under ULFM with mpirun --with-ft ulfm) stops
 * contributing, as on a real GPU: the survivors' kernel that waits for it never
 * completes (MPI's errors about the dead process are noted, ncclCommGetAsyncError then
 * says ncclRemoteError, and the kernel goes on waiting) until its communicator is
 * aborted: ncclCommAbort, from any thread, ends the kernel in flight (its call returns
 * ncclInternalError, ncclGetLastError says it was aborted), waits for it to leave,
 * and frees the communicator. Any later call on an aborted communicator is a misuse,
 * as is ncclCommDestroy of a communicator with a kernel in flight or a lost peer
 * (real NCCL can hang there; PyTorch learned to abort instead). The fake's own traffic
 * is on MPI_COMM_WORLD, which in a job started with ULFM (OMPI_MCA_mpi_ft_enable) it
 * sets to MPI_ERRORS_RETURN at the first communicator, so that a dead peer's errors
 * reach the fake instead of ending the process; the
 * creator of a communicator probes each world rank by name rather than receiving from
 * MPI_ANY_SOURCE, which ULFM refuses after a failure nobody acknowledged.
 */
#include <signal.h>
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_gpu.h"

int cudaDeviceGetPCIBusId(char* id, int length, int d); /* fake_gpu.c */

#define COMM_MAGIC 0x5eea0003
#define COMM_ABORTED 0x5eeaab07 /* kept (not freed) after ncclCommAbort, to name later misuses */
#define MAX_OPS 64
#define BUS_ID_BYTES 64

typedef struct {
  int magic, device, rank, nranks, tag;
  int* world; /* comm rank -> world rank */
  int* pids;  /* comm rank -> process id (the device model reads their GPUs) */
  long kernels; /* launched so far: the next one's place in the device model */
  int failed;   /* a kernel failed: peers' messages may be left unreceived */
  int implicit; /* launch order implicit in effect */
  volatile int aborting; /* ncclCommAbort was called: the kernel in flight ends */
  volatile int peer_lost; /* MPI reported a peer's process dead (ULFM) */
  int active;             /* kernels in flight on it (under g_mu) */
  volatile int init_state; /* 7 (ncclInProgress) while being made, then 0 or the creation's error */
  int nonblocking;         /* config.blocking = 0 */
  int launch_pending;      /* nonblocking: the last launch said ncclInProgress, not yet polled */
  int counted;             /* in the communicator count (made successfully) */
  int has_thread;          /* a creation thread to join */
  pthread_t thread;
  int creator;             /* the world rank of the id's maker */
  char name[96];
  int op_used[MAX_OPS];
  double op_scalar[MAX_OPS];
} FakeComm;
typedef struct { char internal[128]; } ncclUniqueId;
/* NCCL 2.31's ncclConfig_t (ncclConfig_v23100), up to what the fake reads. */
typedef struct {
  size_t size;
  unsigned magic, version;
  int blocking, cgaClusterSize, minCTAs, maxCTAs;
  const char* netName;
  int splitShare, trafficClass;
  const char* commName;
  int collnetEnable, CTAPolicy, shrinkShare, nvlsCTAs, nChannelsPerNetPeer, nvlinkCentricSched,
      graphUsageMode, numRmaCtx, maxP2pPeers, graphStreamOrdering, launchOrderImplicit;
} ncclConfig_t;
#define CONFIG_MAGIC 0xcafebeefu
#define UNDEF_INT (-2147483647 - 1)

static int check_ready(FakeComm* c, const char* what);
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static long g_allreduces, g_inits, g_messages;

/* FAKE_NCCL_DIE_AT_<what>=<world rank>:<n>: SIGKILL this process when it is that rank
 * and `nth` is n. */
static void maybe_die(const char* var, long nth) {
  const char* v = getenv(var);
  int rank = -1, world_rank = -2;
  long n = -1;
  if (v == NULL || sscanf(v, "%d:%ld", &rank, &n) != 2 || n != nth) return;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (world_rank == rank) raise(SIGKILL);
}
static __thread char t_last_error[1200];
static __thread int t_group_depth = 0;
static __thread MPI_Request* t_pending = NULL; /* a kernel's posted sends and receives */
static __thread char* t_receiving = NULL;      /* which of them are receives */
static __thread int t_npending = 0, t_cap = 0;
static __thread int t_slot = -1;   /* the device model's slot of the kernel this thread runs */
static __thread int t_failed = 0;  /* and whether it failed (t_last_error says why) */
static __thread FakeComm* t_comm = NULL; /* the communicator of the kernel this thread runs */

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
        if (premul) fake_misuse("PreMulSum on an integer type");
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

static int nccl_version(void) { return fake_env_int("FAKE_NCCL_VERSION", 22305); }

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


/* ---------------------------------------------------------------- this copy's own calls */

/* This library's own ncclGetVersion, bound inside it whatever else the process loaded. */
int ncclGetVersion(int* v);
extern int own_ncclGetVersion(int* v) __attribute__((alias("ncclGetVersion"), visibility("hidden")));

/* Whether calls to this library's exported functions from inside it reach this copy
 * (they go through its PLT, as the real libnccl's do). Asked at each kernel: cheap. */
static void self_bound(void) {
  static int reported = 0;
  int (*const reached)(int*) = &ncclGetVersion; /* resolved through the GOT */
  if (reached == &own_ncclGetVersion || reported) return;
  reported = 1;
  int theirs = 0;
  reached(&theirs);
  fake_misuse("calls from inside this NCCL (version %d) reach another copy of NCCL loaded in the process "
              "(its ncclGetVersion says %d): this copy was opened without RTLD_DEEPBIND while the other "
              "one is global, so parts of NCCL would run in the other copy", nccl_version(), theirs);
}

/* ---------------------------------------------------------------- errors */

static int fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(t_last_error, sizeof t_last_error, fmt, args);
  va_end(args);
  return 3; /* ncclInternalError */
}

int ncclGetVersion(int* v) { *v = nccl_version(); return 0; }
const char* ncclGetErrorString(int r) { return r == 0 ? "no error" : "fake NCCL error"; }
const char* ncclGetLastError(void* comm) { return t_last_error[0] ? t_last_error : "(fake NCCL)"; }

/* ---------------------------------------------------------------- MPI */

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
/* Spins briefly, then sleeps longer and longer (up to 1 ms): a wait costs little CPU. */
static void back_off(int spins) {
  if (spins < 200) {
    sched_yield();
    return;
  }
  struct timespec t = {0, spins < 1000 ? 50000 : 1000000};
  nanosleep(&t, NULL);
}

static void post(MPI_Request r, int receive) {
  if (t_npending == t_cap) {
    t_cap = t_cap ? 2 * t_cap : 16;
    t_pending = (MPI_Request*)realloc(t_pending, t_cap * sizeof(MPI_Request));
    t_receiving = (char*)realloc(t_receiving, t_cap);
  }
  t_receiving[t_npending] = (char)receive;
  t_pending[t_npending++] = r;
}
/* A peer's process is dead (MPI said so): it contributes nothing more. */
static void lost_peer(FakeComm* c) { c->peer_lost = 1; }
static void isend(FakeComm* c, int peer, const void* p, size_t n) {
  MPI_Request r = MPI_REQUEST_NULL;
  if (MPI_Isend(p, (int)n, MPI_BYTE, c->world[peer], c->tag, MPI_COMM_WORLD, &r) != MPI_SUCCESS) {
    lost_peer(c);
    r = MPI_REQUEST_NULL;
  }
  post(r, 0);
}
static void irecv(FakeComm* c, int peer, void* p, size_t n) {
  MPI_Request r = MPI_REQUEST_NULL;
  if (MPI_Irecv(p, (int)n, MPI_BYTE, c->world[peer], c->tag, MPI_COMM_WORLD, &r) != MPI_SUCCESS) {
    lost_peer(c);
    r = MPI_REQUEST_NULL;
  }
  post(r, 1);
}
/* Waits for what this thread posted; inside a kernel, the device model watches the wait
 * (a deadlock, a peer's failure, the bounded wait end it: t_failed, and the receives are
 * withdrawn; their buffers must then be left alone, never freed). */
static void complete(void) {
  if (t_slot < 0) {
    MPI_Waitall(t_npending, t_pending, MPI_STATUSES_IGNORE);
    t_npending = 0;
    return;
  }
  const double start = now_s();
  char why[sizeof t_last_error];
  for (int spins = 0; !t_failed; ++spins) {
    int done = 0;
    /* An error names a dead peer (ULFM): its part never comes, so the kernel never
     * completes, whatever the other requests do, until the communicator is aborted. */
    if (MPI_Testall(t_npending, t_pending, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) lost_peer(t_comm);
    if (done && !(t_comm != NULL && t_comm->peer_lost)) break;
    int aborted = t_comm != NULL && t_comm->aborting;
    if (aborted)
      snprintf(why, sizeof why, "%s was aborted (ncclCommAbort) while this kernel waited%s", t_comm->name,
               t_comm->peer_lost ? " for a peer whose process is dead" : "");
    if (aborted || device_waiting(t_slot, now_s() - start, why, sizeof why)) {
      fail("%s", why);
      t_failed = aborted ? 2 : 1; /* 2: aborted, which its peers need not hear of */
      for (int i = 0; i < t_npending; ++i) {
        if (t_pending[i] == MPI_REQUEST_NULL) continue;
        if (t_receiving[i]) MPI_Cancel(&t_pending[i]);
        MPI_Request_free(&t_pending[i]);
      }
    }
    back_off(spins);
  }
  t_npending = 0;
}

/* ---------------------------------------------------------------- communicators */

static int nccl_env_on(const char* name) {
  const char* v = getenv(name);
  return v != NULL && strcmp(v, "1") == 0;
}
/* A job started with ULFM on (mpirun --with-ft ulfm sets it), where a process may die
 * and the others go on. */
static int ulfm_run(void) {
  const char* v = getenv("OMPI_MCA_mpi_ft_enable");
  return v != NULL && (strcmp(v, "1") == 0 || strcmp(v, "true") == 0);
}
static int multi_rank_gpu(void) { return nccl_version() >= 23000 && nccl_env_on("NCCL_MULTI_RANK_GPU_ENABLE"); }

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

/* What each rank tells the communicator's creator, and the creator tells everyone. */
typedef struct {
  int rank, world, pid;
  char bus[BUS_ID_BYTES];
} Member;

/* The GPUs of two ranks are one: NCCL's refusal, or (2.30+) its multi-rank mode. */
static int check_devices(FakeComm* c, const Member* all) {
  for (int a = 0; a < c->nranks; ++a)
    for (int b = a + 1; b < c->nranks; ++b) {
      if (strcmp(all[a].bus, all[b].bus) != 0) continue;
      if (!multi_rank_gpu())
        return fail("Duplicate GPU detected: rank %d and rank %d both on GPU %s (NCCL %d%s)", a, b, all[a].bus,
                    nccl_version(), nccl_version() >= 23000 ? "; NCCL_MULTI_RANK_GPU_ENABLE is not 1" : "");
      if (nccl_env_on("NCCL_NVLS_ENABLE"))
        return fail("NCCL_NVLS_ENABLE=1 with several ranks on GPU %s (NCCL_MULTI_RANK_GPU_ENABLE=1) is an error",
                    all[a].bus);
    }
  return 0;
}

/* Waits for a creation's requests: 0 once done, 1 if the communicator was aborted
 * meanwhile (the requests are then withdrawn). A dead peer's error is noted and the
 * wait goes on: its part never comes. */
static int init_wait(FakeComm* c, MPI_Request* r, const char* receiving, int n) {
  for (int spins = 0;; ++spins) {
    int done = 0;
    if (MPI_Testall(n, r, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) lost_peer(c);
    if (done && !c->peer_lost) return 0;
    if (c->aborting) {
      for (int i = 0; i < n; ++i) {
        if (r[i] == MPI_REQUEST_NULL) continue;
        if (receiving[i]) MPI_Cancel(&r[i]);
        MPI_Request_free(&r[i]);
      }
      return 1;
    }
    back_off(spins);
  }
}

/* The creation's exchange (the caller's thread, or its own when nonblocking): every rank
 * tells the creator who it is, the creator tells everyone. 0, an NCCL error, or -1 when
 * aborted. */
static int exchange(FakeComm* c) {
  int world_rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  Member me = {c->rank, world_rank, (int)getpid(), {0}}, *all = (Member*)calloc(c->nranks, sizeof(Member));
  if (cudaDeviceGetPCIBusId(me.bus, BUS_ID_BYTES - 1, c->device) != 0) snprintf(me.bus, BUS_ID_BYTES, "?");
  int aborted = 0;
  if (c->rank == 0) { /* the creator learns who is who, then tells everyone */
    all[0] = me;
    int world_size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    for (int i = 1, spins = 0; i < c->nranks && !aborted; ++spins) { /* by source: see the header */
      int got = 0;
      for (int src = 0; src < world_size && i < c->nranks; ++src) {
        int flag = 0;
        if (src == world_rank || MPI_Iprobe(src, c->tag, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS ||
            !flag)
          continue;
        Member m;
        MPI_Recv(&m, sizeof m, MPI_BYTE, src, c->tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        all[m.rank] = m;
        ++i, got = 1;
      }
      if (!got) back_off(spins);
      aborted = c->aborting;
    }
    if (!aborted && c->nranks > 1) {
      MPI_Request* r = (MPI_Request*)malloc((c->nranks - 1) * sizeof(MPI_Request));
      char* receiving = (char*)calloc(c->nranks, 1);
      for (int k = 1; k < c->nranks; ++k)
        if (MPI_Isend(all, c->nranks * sizeof(Member), MPI_BYTE, all[k].world, c->tag, MPI_COMM_WORLD, &r[k - 1]) !=
            MPI_SUCCESS) {
          lost_peer(c);
          r[k - 1] = MPI_REQUEST_NULL;
        }
      aborted = init_wait(c, r, receiving, c->nranks - 1);
      free(r);
      free(receiving);
    }
  } else {
    MPI_Request r[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    const char receiving[2] = {0, 1};
    if (MPI_Isend(&me, sizeof me, MPI_BYTE, c->creator, c->tag, MPI_COMM_WORLD, &r[0]) != MPI_SUCCESS ||
        MPI_Irecv(all, c->nranks * sizeof(Member), MPI_BYTE, c->creator, c->tag, MPI_COMM_WORLD, &r[1]) !=
            MPI_SUCCESS)
      lost_peer(c);
    aborted = init_wait(c, r, receiving, 2);
  }
  if (aborted) return -1; /* `all` is left: a withdrawn receive may not be done with it */
  for (int r = 0; r < c->nranks; ++r) {
    c->world[r] = all[r].world;
    c->pids[r] = all[r].pid;
  }
  int rc = check_devices(c, all);
  free(all);
  if (rc == 0 && fake_env_int("FAKE_NCCL_FAIL_INIT_RANK", -1) == world_rank) rc = 2; /* ncclSystemError */
  if (rc == 0) {
    fake_stat_add(kStatComms, 1);
    fake_stat_add(kStatCommsCreated, 1);
    c->counted = 1;
  }
  return rc;
}

static void* creation_thread(void* arg) {
  FakeComm* c = (FakeComm*)arg;
  int rc = exchange(c);
  c->init_state = rc < 0 ? 3 : rc; /* aborted: ncclInternalError, never read (the abort frees it) */
  return NULL;
}

static int init_comm(void** out, int nranks, ncclUniqueId id, int rank, const char* name, int implicit,
                     int blocking) {
  int ids[2];
  memcpy(ids, id.internal, sizeof ids);
  if (ulfm_run()) MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN); /* a dead peer: see the header */
  pthread_mutex_lock(&g_mu);
  const long nth = ++g_inits;
  pthread_mutex_unlock(&g_mu);
  maybe_die("FAKE_NCCL_DIE_AT_INIT", nth); /* before it tells its peers anything */
  device_register(); /* before any peer may look at this process's GPU */
  FakeComm* c = (FakeComm*)calloc(1, sizeof *c);
  c->magic = COMM_MAGIC;
  c->device = fake_current_device();
  c->rank = rank;
  c->nranks = nranks;
  c->tag = ids[1];
  c->creator = ids[0];
  c->world = (int*)malloc(nranks * sizeof(int));
  c->pids = (int*)malloc(nranks * sizeof(int));
  if (name != NULL && name[0] != '\0') snprintf(c->name, sizeof c->name, "'%s'", name);
  else snprintf(c->name, sizeof c->name, "communicator %d", c->tag);
  /* Launch order implicit: the environment overrides the configuration (NCCL 2.26; 2.31). */
  const char* env = getenv("NCCL_LAUNCH_ORDER_IMPLICIT");
  if (nccl_version() >= 22600 && env != NULL && env[0] != '\0') c->implicit = atoi(env) == 1;
  else c->implicit = nccl_version() >= 23100 && implicit == 1;
  if (!blocking) { /* the creation runs on; *out can be polled and aborted meanwhile */
    c->nonblocking = 1;
    c->init_state = 7;
    c->has_thread = 1;
    pthread_create(&c->thread, NULL, creation_thread, c);
    *out = c;
    return 0;
  }
  int rc = exchange(c); /* never -1: nobody holds c to abort it */
  if (rc != 0) {
    free(c->world);
    free(c->pids);
    free(c);
    return rc;
  }
  *out = c;
  return 0;
}

int ncclCommInitRank(void** out, int nranks, ncclUniqueId id, int rank) {
  return init_comm(out, nranks, id, rank, NULL, UNDEF_INT, 1);
}

/* Since NCCL 2.14; the fake reads the fields of 2.31's layout (commName, launchOrderImplicit). */
int ncclCommInitRankConfig(void** out, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  if (config == NULL || config->magic != CONFIG_MAGIC || config->size < sizeof(ncclConfig_t) ||
      config->version < 23100 || config->version > (unsigned)nccl_version() + 10000) {
    fake_misuse("ncclCommInitRankConfig: a configuration the fake cannot read (magic %#x, size %zu, version %u)",
                config ? config->magic : 0, config ? config->size : 0, config ? config->version : 0);
    return 4; /* ncclInvalidArgument */
  }
  if (config->blocking != UNDEF_INT && config->blocking != 0 && config->blocking != 1) {
    fake_misuse("ncclCommInitRankConfig: blocking = %d", config->blocking);
    return 4;
  }
  return init_comm(out, nranks, id, rank, config->commName, config->launchOrderImplicit, config->blocking != 0);
}

static int check_live(FakeComm* c, const char* what) {
  if (c != NULL && c->magic == COMM_ABORTED) {
    fake_misuse("%s on %s after ncclCommAbort (the communicator is gone)", what, c->name);
    return 4;
  }
  if (c == NULL || c->magic != COMM_MAGIC) {
    fake_misuse("%s on %p, not a live communicator", what, (void*)c);
    return 4;
  }
  return 0;
}

/* Receives what peers sent to a failed communicator and nobody will receive (their
 * tokens and data), so that MPI_Finalize finds no unmatched message. */
static void drain(FakeComm* c) {
  double quiet_since = now_s();
  while (now_s() - quiet_since < 0.05) {
    int flag = 0, bytes = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, c->tag, MPI_COMM_WORLD, &flag, &st);
    if (!flag) {
      back_off(1000);
      continue;
    }
    MPI_Get_count(&st, MPI_BYTE, &bytes);
    char* sink = (char*)malloc(bytes ? bytes : 1);
    MPI_Recv(sink, bytes, MPI_BYTE, st.MPI_SOURCE, c->tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    free(sink);
    quiet_since = now_s();
  }
}

static int kernels_in_flight(FakeComm* c) {
  pthread_mutex_lock(&g_mu);
  int n = c->active;
  pthread_mutex_unlock(&g_mu);
  return n;
}

static int destroy(FakeComm* c, int abort) {
  if (check_live(c, abort ? "ncclCommAbort" : "ncclCommDestroy")) return 4;
  if (!abort && c->init_state == 7) {
    fake_misuse("ncclCommDestroy of %s while its creation is in progress: real NCCL blocks there until every "
                "rank has come, which a dead peer never does; abort it (ncclCommAbort)", c->name);
    abort = 1;
  }
  if (!abort && (kernels_in_flight(c) || c->peer_lost)) {
    /* Real NCCL can hang here for good; the fake says so and aborts instead. */
    fake_misuse("ncclCommDestroy of %s, which %s: real NCCL can hang there; a broken communicator must be "
                "aborted (ncclCommAbort)", c->name,
                c->peer_lost ? "lost a peer (its process is dead)" : "has a kernel in flight");
    abort = 1;
  }
  if (abort) { /* ends the kernel in flight (complete() sees it) and waits for it to leave */
    c->magic = COMM_ABORTED; /* from now on a call on it is a misuse, even one racing the abort */
    c->aborting = 1;
    for (int spins = 0; kernels_in_flight(c); ++spins) back_off(spins);
  }
  if (c->has_thread) { /* its creation ends (aborted, or it ended already) */
    pthread_join(c->thread, NULL);
    c->has_thread = 0;
  }
  if (c->failed && !c->peer_lost) drain(c);
  if (!abort)
    for (int k = 0; k < MAX_OPS; ++k)
      if (c->op_used[k]) fake_misuse("communicator destroyed with reduction operator %d alive", k + 5);
  device_forget(c->tag);
  free(c->world);
  free(c->pids);
  c->world = c->pids = NULL;
  if (c->counted) fake_stat_add(kStatComms, -1);
  if (abort) {
    c->magic = COMM_ABORTED; /* kept, so that a later call on it is named */
  } else {
    c->magic = 0;
    free(c);
  }
  return 0;
}
int ncclCommDestroy(void* c) { return destroy((FakeComm*)c, 0); }
int ncclCommAbort(void* c) { return destroy((FakeComm*)c, 1); }
int ncclCommGetAsyncError(void* comm, int* err) {
  FakeComm* c = (FakeComm*)comm;
  if (check_live(c, "ncclCommGetAsyncError")) return 4;
  if (c->init_state != 0) { /* being made (ncclInProgress), or its creation failed */
    *err = c->init_state;
    return 0;
  }
  if (c->launch_pending) { /* the last launch is in progress: said once, then done */
    c->launch_pending = 0;
    *err = 7;
    return 0;
  }
  *err = c->peer_lost ? 6 : 0; /* ncclRemoteError: a peer is gone */
  return 0;
}

int ncclRedOpCreatePreMulSum(int* op, void* scalar, int type, int residence, void* comm) {
  FakeComm* c = (FakeComm*)comm;
  if (check_live(c, "ncclRedOpCreatePreMulSum") || check_ready(c, "ncclRedOpCreatePreMulSum")) return 4;
  if (residence != 1) fake_misuse("PreMulSum scalar residence %d", residence);
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
  if (check_live(c, "ncclRedOpDestroy")) return 4; /* after ncclCommAbort: the operator went with it */
  if (op < 5 || !c->op_used[op - 5]) fake_misuse("ncclRedOpDestroy of unknown operator %d", op);
  else c->op_used[op - 5] = 0;
  return 0;
}

/* ---------------------------------------------------------------- operations
 * Each NCCL data call is an Op: checked and declared to the ordering checker when
 * called, run (its data moved) when its kernel has started on every rank. */

typedef enum { kAllReduce, kReduce, kReduceScatter, kBroadcast, kAllGather, kSend, kRecv } OpKind;
static const char* const kOpNames[] = {"ncclAllReduce", "ncclReduce", "ncclReduceScatter", "ncclBroadcast",
                                       "ncclAllGather", "ncclSend", "ncclRecv"};
typedef struct {
  OpKind kind;
  const void* send;
  void* recv;
  size_t count; /* recvcount for ReduceScatter */
  int type, op, root; /* root: the peer for Send and Recv */
  FakeComm* c;
} Op;

static __thread Op* t_group = NULL;
static __thread int t_ngroup = 0, t_group_cap = 0;

/* out = op over every rank's `send` (count elements), exchanged with every peer;
 * 0 if the kernel failed meanwhile (its receive buffers are then left, not freed). */
static int all_reduce_into(char* out, const void* send, size_t count, int t, int op, FakeComm* c) {
  size_t n = count * type_size(t);
  char** all = (char**)calloc(c->nranks, sizeof(char*));
  for (int r = 0; r < c->nranks; ++r) {
    all[r] = r == c->rank ? (char*)send : (char*)malloc(n ? n : 1);
    if (r != c->rank) {
      irecv(c, r, all[r], n);
      isend(c, r, send, n);
    }
  }
  complete();
  if (t_failed) return 0;
  reduce(out, all, count, t, op, c);
  for (int r = 0; r < c->nranks; ++r)
    if (r != c->rank) free(all[r]);
  free(all);
  return 1;
}

/* Moves an operation's data (its peers run the same one). Collectives complete here;
 * sends and receives are posted, completed by the caller (end of the kernel). After a
 * failure in the middle, buffers MPI may still write into are left allocated. */
static void run_op(const Op* o) {
  FakeComm* c = o->c;
  size_t es = type_size(o->type), n = o->count * es;
  switch (o->kind) {
    case kAllReduce: {
      char* result = (char*)malloc(n ? n : 1);
      if (!all_reduce_into(result, o->send, o->count, o->type, o->op, c)) break;
      memcpy(o->recv, result, c->nranks == 1 ? one_rank_written(o->count, o->type, o->op) * es : n);
      free(result);
      break;
    }
    case kReduceScatter: { /* an allreduce of the whole buffer, of which each rank keeps its block */
      size_t total = o->count * c->nranks;
      char* full = (char*)malloc(total * es + 1);
      if (!all_reduce_into(full, o->send, total, o->type, o->op, c)) break;
      size_t written = c->nranks == 1 ? one_rank_written(o->count, o->type, o->op) : o->count;
      memcpy(o->recv, full + c->rank * n, written * es);
      free(full);
      break;
    }
    case kReduce: {
      if (c->rank != o->root) {
        isend(c, o->root, o->send, n);
        complete();
        break;
      }
      if (o->recv == NULL) fake_misuse("ncclReduce: NULL receive buffer on the root");
      char** all = (char**)calloc(c->nranks, sizeof(char*));
      for (int r = 0; r < c->nranks; ++r) {
        all[r] = r == o->root ? (char*)o->send : (char*)malloc(n ? n : 1);
        if (r != o->root) irecv(c, r, all[r], n);
      }
      complete();
      if (t_failed) break;
      char* result = (char*)malloc(n ? n : 1);
      reduce(result, all, o->count, o->type, o->op, c);
      memcpy(o->recv, result, c->nranks == 1 ? one_rank_written(o->count, o->type, o->op) * es : n);
      for (int r = 0; r < c->nranks; ++r)
        if (r != o->root) free(all[r]);
      free(all);
      free(result);
      break;
    }
    case kBroadcast:
      if (c->rank == o->root) {
        for (int r = 0; r < c->nranks; ++r)
          if (r != o->root) isend(c, r, o->send, n);
        memmove(o->recv, o->send, n);
      } else {
        irecv(c, o->root, o->recv, n);
      }
      complete();
      break;
    case kAllGather:
      for (int r = 0; r < c->nranks; ++r) {
        if (r == c->rank) continue;
        irecv(c, r, (char*)o->recv + r * n, n);
        isend(c, r, o->send, n);
      }
      memmove((char*)o->recv + c->rank * n, o->send, n);
      complete();
      break;
    case kSend: isend(c, o->root, o->send, n); break;
    case kRecv: irecv(c, o->root, o->recv, n); break;
  }
}

/* What a kernel tells each peer: which kernel it is, and its sends to and receives from
 * that peer. */
typedef struct {
  long seq;
  long sends, send_bytes; /* to the token's receiver */
  long recvs, recv_bytes; /* from it */
} Token;

/* While the kernel holds its slot: waits for every peer to start the same kernel (a
 * token from each; the tokens of one communicator are in order, before its data), and
 * checks that its sends and receives meet theirs (t_failed if not). */
static void await_peers(FakeComm* c, long seq, const Op* ops, int n) {
  Token* mine = (Token*)calloc(c->nranks, sizeof(Token));
  Token* theirs = (Token*)calloc(c->nranks, sizeof(Token));
  for (int i = 0; i < n; ++i) {
    Token* t = &mine[ops[i].root];
    size_t bytes = ops[i].count * type_size(ops[i].type);
    if (ops[i].kind == kSend) t->sends++, t->send_bytes += (long)bytes;
    if (ops[i].kind == kRecv) t->recvs++, t->recv_bytes += (long)bytes;
  }
  for (int r = 0; r < c->nranks; ++r) {
    if (r == c->rank) continue;
    mine[r].seq = seq;
    MPI_Request req;
    MPI_Irecv(&theirs[r], sizeof(Token), MPI_BYTE, c->world[r], c->tag, MPI_COMM_WORLD, &req);
    post(req, 1);
    MPI_Isend(&mine[r], sizeof(Token), MPI_BYTE, c->world[r], c->tag, MPI_COMM_WORLD, &req);
    post(req, 0);
  }
  complete();
  if (t_failed) return; /* theirs and mine are left: withdrawn calls may not be done with them */
  const Token* self = &mine[c->rank];
  if (self->sends != self->recvs || self->send_bytes != self->recv_bytes) {
    fail("%s kernel #%ld: rank %d sends %ld bytes in %ld call(s) to itself and receives %ld bytes in %ld from "
         "itself",
         c->name, seq, c->rank, self->send_bytes, self->sends, self->recv_bytes, self->recvs);
    fake_misuse("%s", t_last_error);
    t_failed = 1;
  }
  for (int r = 0; r < c->nranks; ++r) {
    if (r == c->rank) continue;
    if (theirs[r].seq != seq)
      fake_misuse("%s: rank %d started its kernel #%ld while this rank started #%ld: calls out of step",
                  c->name, r, theirs[r].seq, seq);
    const Token *a = &mine[r], *b = &theirs[r];
    if (a->sends != b->recvs || a->send_bytes != b->recv_bytes || a->recvs != b->sends ||
        a->recv_bytes != b->send_bytes) {
      fail("%s kernel #%ld: sends and receives do not meet: rank %d sends %ld bytes in %ld call(s) to rank %d, "
           "which receives %ld bytes in %ld; rank %d receives %ld bytes in %ld call(s) from rank %d, which sends "
           "%ld bytes in %ld",
           c->name, seq, c->rank, a->send_bytes, a->sends, r, b->recv_bytes, b->recvs, c->rank, a->recv_bytes,
           a->recvs, r, b->send_bytes, b->sends);
      fake_misuse("%s", t_last_error);
      t_failed = 1;
    }
  }
  free(mine);
  free(theirs);
}

/* One kernel on `ops[0].c`'s GPU: a slot, its peers, then the data of every op. */
static int launch(const Op* ops, int n) {
  FakeComm* c = ops[0].c;
  self_bound();
  const long seq = ++c->kernels;
  char what[256], why[sizeof t_last_error];
  snprintf(what, sizeof what, "%s%s #%ld of %s", kOpNames[ops[0].kind], n > 1 ? " (a group)" : "", seq, c->name);
  KernelInfo info = {c->tag, seq, c->rank, c->nranks, c->pids, c->implicit};
  pthread_mutex_lock(&g_mu);
  c->active++;
  pthread_mutex_unlock(&g_mu);
  t_slot = device_start(&info, what, why, sizeof why);
  if (t_slot < 0) {
    c->failed = 1;
    pthread_mutex_lock(&g_mu);
    c->active--;
    pthread_mutex_unlock(&g_mu);
    return fail("%s", why);
  }
  t_failed = 0;
  t_comm = c;
  await_peers(c, seq, ops, n);
  for (int i = 0; i < n && !t_failed; ++i) run_op(&ops[i]);
  if (!t_failed) complete();
  device_end(t_slot, t_failed == 1); /* an aborted kernel is not a failure its peers hear of */
  t_slot = -1;
  t_comm = NULL;
  c->failed |= t_failed != 0;
  const int failed = t_failed;
  pthread_mutex_lock(&g_mu);
  c->active--; /* last: an abort waiting for it may free c now */
  pthread_mutex_unlock(&g_mu);
  if (failed) return 3; /* ncclInternalError; t_last_error says why */
  if (c->nonblocking) { /* as NCCL may say of any launch on such a communicator */
    c->launch_pending = 1;
    return 7; /* ncclInProgress */
  }
  return 0;
}

/* An operation called: run now, or at ncclGroupEnd inside a group. */
static int submit(const Op* o) {
  if (t_group_depth > 0) {
    if (t_ngroup > 0 && t_group[0].c != o->c) {
      fake_misuse("a group of calls on two communicators: the fake runs one communicator per group");
      return 5;
    }
    if (t_ngroup == t_group_cap) {
      t_group_cap = t_group_cap ? 2 * t_group_cap : 16;
      t_group = (Op*)realloc(t_group, t_group_cap * sizeof(Op));
    }
    t_group[t_ngroup++] = *o;
    return 0;
  }
  return launch(o, 1);
}

/* A call on a nonblocking communicator whose creation or last launch has not been seen
 * to end (ncclCommGetAsyncError's ncclSuccess): a misuse. */
static int check_ready(FakeComm* c, const char* what) {
  if (c->init_state == 7 || c->init_state != 0 || c->launch_pending) {
    fake_misuse("%s on %s while its %s (ncclCommGetAsyncError must say ncclSuccess first)", what, c->name,
                c->init_state == 7 ? "creation is in progress"
                : c->init_state != 0 ? "creation failed"
                                     : "last launch is in progress");
    return 5; /* ncclInvalidUsage */
  }
  return 0;
}

static int check_comm(FakeComm* c, void* stream, const char* what) {
  if (check_live(c, what) || check_ready(c, what)) return 4;
  fake_stat_add(kStatNcclCalls, 1);
  fake_count_call(kCallNccl);
  int d = fake_stream_device(stream);
  if (d != c->device) {
    fake_misuse("%s: stream of device %d, communicator of device %d", what, d, c->device);
    return 4;
  }
  return 0;
}

int ncclAllReduce(const void* send, void* recv, size_t count, int t, int op, void* comm, void* s) {
  FakeComm* c = (FakeComm*)comm;
  if (check_comm(c, s, "ncclAllReduce")) return 4;
  if (fake_timing_mode()) return 0;
  int fail_after = fake_env_int("FAKE_NCCL_FAIL_ALLREDUCE_AFTER", -1);
  pthread_mutex_lock(&g_mu);
  long nth = ++g_allreduces;
  pthread_mutex_unlock(&g_mu);
  if (fail_after >= 0 && nth > fail_after) return 6; /* ncclRemoteError */
  int world_rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (world_rank == fake_env_int("FAKE_NCCL_DIE_RANK", -1) && nth == fake_env_int("FAKE_NCCL_DIE_AT_ALLREDUCE", -1))
    raise(SIGKILL); /* mid-step, its peers inside the same kernel */
  size_t n = count * type_size(t);
  order_on_stream(fake_stream_agent(s), "ncclAllReduce", send, n, recv, n);
  Op o = {kAllReduce, send, recv, count, t, op, 0, c};
  return submit(&o);
}

int ncclReduce(const void* send, void* recv, size_t count, int t, int op, int root, void* comm,
               void* s) {
  FakeComm* c = (FakeComm*)comm;
  if (check_comm(c, s, "ncclReduce")) return 4;
  if (fake_timing_mode()) return 0;
  size_t n = count * type_size(t);
  order_on_stream(fake_stream_agent(s), "ncclReduce", send, n, c->rank == root ? recv : NULL, n);
  Op o = {kReduce, send, recv, count, t, op, root, c};
  return submit(&o);
}

int ncclReduceScatter(const void* send, void* recv, size_t recvcount, int t, int op, void* comm,
                      void* s) {
  FakeComm* c = (FakeComm*)comm;
  if (check_comm(c, s, "ncclReduceScatter")) return 4;
  if (fake_timing_mode()) return 0;
  size_t es = type_size(t);
  order_on_stream(fake_stream_agent(s), "ncclReduceScatter", send, recvcount * c->nranks * es, recv,
                  recvcount * es);
  Op o = {kReduceScatter, send, recv, recvcount, t, op, 0, c};
  return submit(&o);
}

int ncclBroadcast(const void* send, void* recv, size_t count, int t, int root, void* comm, void* s) {
  FakeComm* c = (FakeComm*)comm;
  if (check_comm(c, s, "ncclBroadcast")) return 4;
  if (fake_timing_mode()) return 0;
  size_t n = count * type_size(t);
  order_on_stream(fake_stream_agent(s), "ncclBroadcast", c->rank == root ? send : NULL, n, recv, n);
  Op o = {kBroadcast, send, recv, count, t, 0, root, c};
  return submit(&o);
}

int ncclAllGather(const void* send, void* recv, size_t count, int t, void* comm, void* s) {
  FakeComm* c = (FakeComm*)comm;
  if (check_comm(c, s, "ncclAllGather")) return 4;
  if (fake_timing_mode()) return 0;
  size_t n = count * type_size(t);
  order_on_stream(fake_stream_agent(s), "ncclAllGather", send, n, recv, n * c->nranks);
  Op o = {kAllGather, send, recv, count, t, 0, 0, c};
  return submit(&o);
}

/* A peer outside the communicator: a misuse (NCCL returns ncclInvalidArgument). */
static int check_peer(FakeComm* c, int peer, const char* what) {
  if (peer >= 0 && peer < c->nranks) return 0;
  fake_misuse("%s to peer %d of a communicator of %d ranks", what, peer, c->nranks);
  return 4;
}

int ncclSend(const void* buf, size_t count, int t, int peer, void* comm, void* s) {
  FakeComm* c = (FakeComm*)comm;
  if (check_comm(c, s, "ncclSend") || check_peer(c, peer, "ncclSend")) return 4;
  if (fake_timing_mode()) return 0;
  pthread_mutex_lock(&g_mu);
  const long nth = ++g_messages;
  pthread_mutex_unlock(&g_mu);
  maybe_die("FAKE_NCCL_DIE_AT_P2P", nth); /* its peer inside the matching call */
  order_on_stream(fake_stream_agent(s), "ncclSend", buf, count * type_size(t), NULL, 0);
  Op o = {kSend, buf, NULL, count, t, 0, peer, c};
  return submit(&o);
}

int ncclRecv(void* buf, size_t count, int t, int peer, void* comm, void* s) {
  FakeComm* c = (FakeComm*)comm;
  if (check_comm(c, s, "ncclRecv") || check_peer(c, peer, "ncclRecv")) return 4;
  if (fake_timing_mode()) return 0;
  pthread_mutex_lock(&g_mu);
  const long nth = ++g_messages;
  pthread_mutex_unlock(&g_mu);
  maybe_die("FAKE_NCCL_DIE_AT_P2P", nth); /* its peer inside the matching call */
  order_on_stream(fake_stream_agent(s), "ncclRecv", NULL, 0, buf, count * type_size(t));
  Op o = {kRecv, NULL, buf, count, t, 0, peer, c};
  return submit(&o);
}

int ncclGroupStart(void) {
  t_group_depth++;
  return 0;
}
int ncclGroupEnd(void) {
  if (t_group_depth <= 0) {
    fake_misuse("ncclGroupEnd without ncclGroupStart");
    return 5;
  }
  if (--t_group_depth > 0 || t_ngroup == 0) return 0;
  int n = t_ngroup;
  t_ngroup = 0;
  return launch(t_group, n);
}
