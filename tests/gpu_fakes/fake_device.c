/* The device model of the fake NCCL (the model: fake_gpu.h). Each process publishes
 * its GPU's NCCL kernels (queued, running, failed) in a file mapped into memory,
 * FAKE_GPU_DEVICE_DIR/fake-gpu-device.<pid>; a kernel that waits reads its peers'
 * files (found through the process ids of its communicator's ranks, and theirs in
 * turn) and asks whether anything can still move:
 *
 *   a running kernel can finish once every peer's matching kernel runs or can run;
 *   a queued kernel can run once fewer than K kernels launched before it are left.
 *
 * Applied until nothing changes, this leaves the kernels that can never finish. If the
 * waiting kernel is one of them (twice in a row, the same), the deadlock is reported:
 * the wait-for cycle through it, each step naming a rank, the kernel its GPU runs and
 * the one it queued behind that. The report fails the waiting calls of this process,
 * and those of any process waiting on its kernels, with that text (ncclGetLastError).
 * A call a peer has not launched yet is modelled as queued last on its GPU (where that
 * host would launch it), so a cycle through a rank whose host waits to launch is
 * reported too; a kernel whose peer is unknown is assumed to be able to go on, so only
 * a device deadlock is reported; anything else ends with the bounded wait
 * (FAKE_GPU_DEVICE_TIMEOUT_S).
 *
 * FAKE_GPU_LAUNCH_JITTER_US=<n>: each launch waits up to n microseconds first, by a hash
 * of (rank, communicator, kernel): the host timing that makes lanes launch in different
 * orders on different ranks, the same in every run. (FAKE_GPU_WAIT_JITTER_US, fake_gpu.c,
 * delays the stream waits a lane makes before its launch turn, so across process sets.)
 */
#include <fcntl.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fake_gpu.h"

#define DEV_KERNELS 64 /* kernels alive on one GPU at once */
#define DEV_PEERS 64   /* ranks of a communicator the model follows */
#define DEV_PROCS 64   /* processes one check reads */
#define DEV_COMMS 64   /* communicators whose last launch a GPU records */
#define DEV_MAGIC 0x5eea0d01u
#define CHECK_AFTER_S 0.2 /* a wait this long is checked, every CHECK_EVERY_S */
#define CHECK_EVERY_S 0.1

enum { kFree, kQueued, kRunning, kFailed };

typedef struct {
  int state;
  long order; /* launch order on this GPU */
  int tag;
  long seq;
  int rank, nranks;
  int pids[DEV_PEERS];
  char what[160];
} SharedKernel;

typedef struct {
  int tag;
  long seq; /* the communicator's last kernel launched on this GPU */
} Launched;

typedef struct {
  uint32_t magic;
  int pid, world, slots;
  volatile long version; /* odd while this process changes the table */
  char report[1024];     /* why this process's GPU work failed, once it has */
  SharedKernel k[DEV_KERNELS];
  Launched launched[DEV_COMMS];
  int launched_overflow; /* a communicator found no room in `launched` */
} SharedDevice;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static SharedDevice* g_dev; /* this process's, shared */
static char g_path[512];
static long g_order;
static int g_launching;               /* launches in progress of launch-order-implicit communicators */
static char g_implicit[DEV_KERNELS];  /* the kernel counts in g_launching */
static double g_next_check[DEV_KERNELS];
static char g_candidate[DEV_KERNELS][sizeof ((SharedDevice*)0)->report];

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int slots(void) {
  int k = fake_env_int("FAKE_GPU_KERNEL_SLOTS", 1);
  return k < 1 ? 1 : k;
}

static double timeout_s(void) { return fake_env_int("FAKE_GPU_DEVICE_TIMEOUT_S", 60); }

/* Changes to the shared table, bracketed so that a reader can tell a torn copy. */
static void begin_change(void) {
  g_dev->version++;
  __sync_synchronize();
}
static void end_change(void) {
  __sync_synchronize();
  g_dev->version++;
}

static void unlink_own(void) {
  if (g_path[0]) unlink(g_path);
}

void device_register(void) {
  pthread_mutex_lock(&g_mu);
  if (g_dev == NULL) {
    const char* dir = getenv("FAKE_GPU_DEVICE_DIR");
    snprintf(g_path, sizeof g_path, "%s/fake-gpu-device.%ld", dir && *dir ? dir : "/tmp", (long)getpid());
    int fd = open(g_path, O_CREAT | O_RDWR | O_TRUNC, 0600);
    void* p = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, sizeof(SharedDevice)) == 0)
      p = mmap(NULL, sizeof(SharedDevice), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (p == MAP_FAILED) { /* no sharing: deadlocks across processes end in the bounded wait */
      fake_misuse("device model: cannot share %s; set FAKE_GPU_DEVICE_DIR to a writable folder", g_path);
      g_path[0] = '\0';
      p = calloc(1, sizeof(SharedDevice));
    } else {
      atexit(unlink_own);
    }
    g_dev = (SharedDevice*)p;
    memset(g_dev, 0, sizeof *g_dev);
    g_dev->pid = (int)getpid();
    MPI_Comm_rank(MPI_COMM_WORLD, &g_dev->world);
    g_dev->slots = slots();
    __sync_synchronize();
    g_dev->magic = DEV_MAGIC;
  }
  pthread_mutex_unlock(&g_mu);
}

/* ---------------------------------------------------------------- reading the job's GPUs */

typedef struct {
  int pid;
  SharedDevice copy;
} Proc;

/* Another process's table, mapped read-only once (NULL if it has none). */
static const SharedDevice* peer_table(int pid) {
  static int pids[DEV_PROCS];
  static const SharedDevice* maps[DEV_PROCS];
  static int n;
  if (pid == g_dev->pid) return g_dev;
  for (int i = 0; i < n; ++i)
    if (pids[i] == pid) return maps[i];
  char path[512];
  snprintf(path, sizeof path, "%.*s%ld", (int)(strrchr(g_path, '.') - g_path + 1), g_path, (long)pid);
  int fd = g_path[0] ? open(path, O_RDONLY) : -1;
  if (fd < 0) return NULL;
  void* p = mmap(NULL, sizeof(SharedDevice), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return NULL;
  if (n < DEV_PROCS) {
    pids[n] = pid;
    maps[n++] = (const SharedDevice*)p;
  }
  return (const SharedDevice*)p;
}

/* A consistent copy of a table (0 if it could not be had). */
static int copy_table(const SharedDevice* live, SharedDevice* out) {
  for (int tries = 0; tries < 1000; ++tries) {
    long before = live->version;
    __sync_synchronize();
    if (before % 2 == 0 && live->magic == DEV_MAGIC) {
      memcpy(out, (const void*)live, sizeof *out);
      __sync_synchronize();
      if (live->version == before) return 1;
    }
    sched_yield();
  }
  return 0;
}

static int find_proc(const Proc* procs, int n, int pid) {
  for (int i = 0; i < n; ++i)
    if (procs[i].pid == pid) return i;
  return -1;
}

/* This process's table and every one its kernels' peers lead to, transitively. */
static int snapshot(Proc* procs) {
  int n = 0;
  procs[0].pid = g_dev->pid;
  if (!copy_table(g_dev, &procs[0].copy)) return 0;
  n = 1;
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < DEV_KERNELS; ++k) {
      const SharedKernel* kernel = &procs[i].copy.k[k];
      if (kernel->state == kFree) continue;
      for (int r = 0; r < kernel->nranks && r < DEV_PEERS && n < DEV_PROCS; ++r) {
        int pid = kernel->pids[r];
        if (pid <= 0 || find_proc(procs, n, pid) >= 0) continue;
        const SharedDevice* live = peer_table(pid);
        if (live != NULL && copy_table(live, &procs[n].copy)) procs[n++].pid = pid;
      }
    }
  return n;
}

static int live(const SharedKernel* k) { return k->state == kQueued || k->state == kRunning; }

/* The kernel of `tag` and `seq` in a table, or -1. */
static int matching(const SharedDevice* d, int tag, long seq, int any_state) {
  for (int k = 0; k < DEV_KERNELS; ++k)
    if (d->k[k].tag == tag && d->k[k].seq == seq && (any_state ? d->k[k].state != kFree : live(&d->k[k])))
      return k;
  return -1;
}

/* ---------------------------------------------------------------- what can still move */

typedef struct {
  Proc* procs;
  int n;
  char* done; /* [proc * DEV_KERNELS + kernel]: can finish */
} Model;

static int finished(const Model* m, int i, int k) { return m->done[i * DEV_KERNELS + k]; }

/* Whether a live kernel runs (or will, once the finished ones are gone): fewer than its
 * GPU's slots of the unfinished kernels were launched before it. */
static int runs(const Model* m, int i, int k) {
  const SharedDevice* d = &m->procs[i].copy;
  int before = 0;
  for (int j = 0; j < DEV_KERNELS; ++j)
    if (live(&d->k[j]) && !finished(m, i, j) && d->k[j].order < d->k[k].order) before++;
  return before < (d->slots > 0 ? d->slots : 1);
}

/* Whether a table's GPU has not launched kernel `seq` of communicator `tag` yet. */
static int not_launched(const SharedDevice* d, int tag, long seq) {
  for (int c = 0; c < DEV_COMMS; ++c)
    if (d->launched[c].tag == tag) return d->launched[c].seq < seq;
  return !d->launched_overflow; /* no record: none launched, unless there was no room */
}

/* Whether a kernel launched now would run (or will, once the finished ones are gone):
 * it would queue behind every live kernel of the GPU. */
static int would_run(const Model* m, int i) {
  const SharedDevice* d = &m->procs[i].copy;
  int before = 0;
  for (int j = 0; j < DEV_KERNELS; ++j) before += live(&d->k[j]) && !finished(m, i, j);
  return before < (d->slots > 0 ? d->slots : 1);
}

/* The rank (communicator rank) whose matching kernel keeps a running kernel waiting:
 * launched there but not running, or not launched where a launch would not run
 * (*kernel = -1); -1 if none (it can finish, as far as is known). */
static int blocking_peer(const Model* m, int i, int k, int* proc, int* kernel) {
  const SharedKernel* r = &m->procs[i].copy.k[k];
  for (int q = 0; q < r->nranks && q < DEV_PEERS; ++q) {
    if (q == r->rank) continue;
    int j = find_proc(m->procs, m->n, r->pids[q]);
    if (j < 0) continue;
    int mk = matching(&m->procs[j].copy, r->tag, r->seq, 0);
    if (mk < 0 && (!not_launched(&m->procs[j].copy, r->tag, r->seq) || would_run(m, j))) continue;
    if (mk >= 0 && (finished(m, j, mk) || runs(m, j, mk))) continue;
    *proc = j;
    *kernel = mk;
    return q;
  }
  return -1;
}

static void reduce_model(Model* m) {
  for (int changed = 1; changed;) {
    changed = 0;
    for (int i = 0; i < m->n; ++i)
      for (int k = 0; k < DEV_KERNELS; ++k) {
        int j, mk;
        if (!live(&m->procs[i].copy.k[k]) || finished(m, i, k) || !runs(m, i, k)) continue;
        if (blocking_peer(m, i, k, &j, &mk) >= 0) continue;
        m->done[i * DEV_KERNELS + k] = 1;
        changed = 1;
      }
  }
}

/* The first running kernel a queued one (k), or one not launched yet (k = -1), waits behind. */
static int blocker(const Model* m, int i, int k) {
  const SharedDevice* d = &m->procs[i].copy;
  int best = -1;
  for (int j = 0; j < DEV_KERNELS; ++j)
    if (live(&d->k[j]) && !finished(m, i, j) && runs(m, i, j) && (k < 0 || d->k[j].order < d->k[k].order) &&
        (best < 0 || d->k[j].order < d->k[best].order))
      best = j;
  return best;
}

/* The wait-for cycle reached from kernel k of process i, as text. */
static void describe_cycle(const Model* m, int i, int k, char* out, size_t n) {
  int path_i[2 * DEV_PROCS], path_k[2 * DEV_PROCS], len = 0;
  if (!runs(m, i, k)) k = blocker(m, i, k);
  while (k >= 0 && len < 2 * DEV_PROCS) {
    for (int s = 0; s < len; ++s)
      if (path_i[s] == i && path_k[s] == k) { /* closed: the cycle is path[s..len) */
        int cycle = len - s, first = s; /* told from its lowest (rank, launch order), whoever finds it */
        for (int t = s; t < len; ++t) {
          const SharedDevice *a = &m->procs[path_i[t]].copy, *b = &m->procs[path_i[first]].copy;
          if (a->world < b->world || (a->world == b->world && a->k[path_k[t]].order < b->k[path_k[first]].order))
            first = t;
        }
        size_t used = snprintf(out, n, "fake GPU device deadlock (FAKE_GPU_KERNEL_SLOTS=%d), a wait-for cycle:",
                               slots());
        for (int step = 0; step < cycle && used < n; ++step) {
          int t = s + (first - s + step) % cycle, after = s + (first - s + step + 1) % cycle, j, mk;
          const SharedKernel* r = &m->procs[path_i[t]].copy.k[path_k[t]];
          blocking_peer(m, path_i[t], path_k[t], &j, &mk);
          used += snprintf(out + used, n - used,
                           " rank %d runs %s and waits for rank %d to start it, but rank %d %s behind %s;",
                           m->procs[path_i[t]].copy.world, r->what, m->procs[j].copy.world, m->procs[j].copy.world,
                           mk < 0 ? "has not launched it yet, and would queue it" : "queued it",
                           m->procs[path_i[after]].copy.k[path_k[after]].what);
        }
        if (used < n)
          snprintf(out + used, n - used, " the ranks launched these collectives in different orders");
        return;
      }
    path_i[len] = i;
    path_k[len++] = k;
    int j, mk;
    if (blocking_peer(m, i, k, &j, &mk) < 0) break;
    i = j;
    k = blocker(m, j, mk);
  }
  snprintf(out, n, "fake GPU device deadlock (FAKE_GPU_KERNEL_SLOTS=%d): rank %d's %s can never finish", slots(),
           m->procs[0].copy.world, m->procs[0].copy.k[k < 0 ? 0 : k].what);
}

static const char kPeerFailed[] = "the GPU work of rank ";

/* Why kernel `slot` of this process cannot go on: a peer's failure, a deadlock (found
 * twice in a row), or the bounded wait spent. 0 while it may still go on. */
static int check(int slot, double waited, char* why, size_t n) {
  Proc* procs = (Proc*)malloc(DEV_PROCS * sizeof(Proc));
  int found = 0, nprocs = snapshot(procs);
  const SharedKernel* me = nprocs ? &procs[0].copy.k[slot] : NULL;
  for (int q = 0; me != NULL && q < me->nranks && q < DEV_PEERS && !found; ++q) {
    int j = find_proc(procs, nprocs, me->pids[q]);
    if (j <= 0) continue;
    int mk = matching(&procs[j].copy, me->tag, me->seq, 1);
    const char* theirs = procs[j].copy.report;
    if (theirs[0] || (mk >= 0 && procs[j].copy.k[mk].state == kFailed)) {
      if (strncmp(theirs, kPeerFailed, strlen(kPeerFailed)) == 0) snprintf(why, n, "%s", theirs); /* passed on */
      else snprintf(why, n, "%s%d failed: %s", kPeerFailed, procs[j].copy.world, theirs[0] ? theirs : "(no report)");
      found = 1;
    }
  }
  if (!found && me != NULL) {
    Model m = {procs, nprocs, (char*)calloc(nprocs * DEV_KERNELS, 1)};
    reduce_model(&m);
    if (!finished(&m, 0, slot)) {
      char text[sizeof g_candidate[0]];
      describe_cycle(&m, 0, slot, text, sizeof text);
      found = strcmp(text, g_candidate[slot]) == 0; /* the same, twice */
      snprintf(g_candidate[slot], sizeof g_candidate[slot], "%s", text);
      if (found) snprintf(why, n, "%s", text);
    }
    free(m.done);
  }
  if (!found && me != NULL && waited > timeout_s()) {
    snprintf(why, n, "fake GPU: no progress for %.0f s (FAKE_GPU_DEVICE_TIMEOUT_S): rank %d's %s still waits %s",
             waited, procs[0].copy.world, me->what,
             me->state == kQueued ? "for a slot of its GPU" : "for its peers to start it");
    found = 1;
  }
  free(procs);
  if (found) {
    pthread_mutex_lock(&g_mu);
    if (!g_dev->report[0]) {
      begin_change();
      snprintf(g_dev->report, sizeof g_dev->report, "%s", why);
      end_change();
      fake_misuse("%s", why);
    }
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
  }
  return found;
}

/* Called with g_mu held. */
static int due(int slot, double waited) {
  double t = now_s();
  if (waited < CHECK_AFTER_S || t < g_next_check[slot]) return 0;
  g_next_check[slot] = t + CHECK_EVERY_S;
  return 1;
}

/* ---------------------------------------------------------------- kernels */

static int can_run(int slot) {
  int before = 0;
  for (int j = 0; j < DEV_KERNELS; ++j)
    if (live(&g_dev->k[j]) && g_dev->k[j].order < g_dev->k[slot].order) before++;
  return before < g_dev->slots;
}

static void jitter(const KernelInfo* info) {
  int most = fake_env_int("FAKE_GPU_LAUNCH_JITTER_US", 0);
  if (most <= 0) return;
  uint64_t h = ((uint64_t)g_dev->world * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)info->tag << 32) ^ (uint64_t)info->seq;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  usleep((useconds_t)(h % (uint64_t)most));
}

/* Called with g_mu held, inside a change. */
static void note_launch(int tag, long seq) {
  Launched* free_entry = NULL;
  for (int c = 0; c < DEV_COMMS; ++c) {
    Launched* l = &g_dev->launched[c];
    if (l->tag == tag) {
      l->seq = seq;
      return;
    }
    if (l->tag == 0 && free_entry == NULL) free_entry = l;
  }
  if (free_entry == NULL) {
    g_dev->launched_overflow = 1;
    return;
  }
  free_entry->tag = tag;
  free_entry->seq = seq;
}

int device_start(const KernelInfo* info, const char* what, char* why, size_t n) {
  device_register();
  jitter(info);
  pthread_mutex_lock(&g_mu);
  if (info->implicit && g_launching > 0) /* a thread is in at most one launch at a time */
    fake_misuse("launch race: two threads launch NCCL work on one GPU at once (%s) with launch order implicit, "
                "which takes the GPU's order from the order of launches",
                what);
  int slot = -1;
  for (int j = 0; j < DEV_KERNELS && slot < 0; ++j)
    if (g_dev->k[j].state == kFree) slot = j;
  if (slot < 0) {
    pthread_mutex_unlock(&g_mu);
    fake_misuse("device model: more than %d NCCL kernels on one GPU", DEV_KERNELS);
    snprintf(why, n, "fake GPU: more than %d NCCL kernels on one GPU", DEV_KERNELS);
    return -1;
  }
  begin_change();
  SharedKernel* k = &g_dev->k[slot];
  memset(k, 0, sizeof *k);
  k->state = kQueued;
  k->order = ++g_order;
  k->tag = info->tag;
  k->seq = info->seq;
  k->rank = info->rank;
  k->nranks = info->nranks;
  for (int r = 0; r < info->nranks && r < DEV_PEERS; ++r) k->pids[r] = info->pids[r];
  snprintf(k->what, sizeof k->what, "%s", what);
  note_launch(info->tag, info->seq);
  end_change();
  g_next_check[slot] = 0;
  g_candidate[slot][0] = '\0';
  g_implicit[slot] = info->implicit != 0;
  g_launching += g_implicit[slot];
  double start = now_s();
  int failed = 0;
  while (!failed && !can_run(slot)) {
    if (g_dev->report[0]) {
      snprintf(why, n, "%s", g_dev->report);
      failed = 1;
      break;
    }
    if (due(slot, now_s() - start)) {
      pthread_mutex_unlock(&g_mu);
      failed = check(slot, now_s() - start, why, n);
      pthread_mutex_lock(&g_mu);
      continue;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 20 * 1000000;
    if (until.tv_nsec >= 1000000000) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&g_cv, &g_mu, &until);
  }
  if (!failed && g_dev->report[0]) { /* this process's GPU work failed meanwhile */
    snprintf(why, n, "%s", g_dev->report);
    failed = 1;
  }
  begin_change();
  k->state = failed ? kFailed : kRunning;
  end_change();
  if (failed) {
    g_launching -= g_implicit[slot];
    g_implicit[slot] = 0;
  }
  pthread_mutex_unlock(&g_mu);
  return failed ? -1 : slot;
}

int device_waiting(int slot, double waited_s, char* why, size_t n) {
  pthread_mutex_lock(&g_mu);
  if (g_dev->report[0]) {
    snprintf(why, n, "%s", g_dev->report);
    pthread_mutex_unlock(&g_mu);
    return 1;
  }
  int ask = due(slot, waited_s);
  pthread_mutex_unlock(&g_mu);
  return ask ? check(slot, waited_s, why, n) : 0;
}

void device_end(int slot, int failed) {
  pthread_mutex_lock(&g_mu);
  begin_change();
  g_dev->k[slot].state = failed ? kFailed : kFree;
  end_change();
  g_launching -= g_implicit[slot];
  g_implicit[slot] = 0;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
}

void device_forget(int tag) {
  pthread_mutex_lock(&g_mu);
  if (g_dev != NULL) {
    begin_change();
    for (int j = 0; j < DEV_KERNELS; ++j)
      if (g_dev->k[j].tag == tag && g_dev->k[j].state == kFailed) g_dev->k[j].state = kFree;
    for (int c = 0; c < DEV_COMMS; ++c)
      if (g_dev->launched[c].tag == tag) g_dev->launched[c] = (Launched){0, 0};
    end_change();
  }
  pthread_mutex_unlock(&g_mu);
}

/* For tests: NCCL kernels on this process's GPU now, queued or running. */
long fake_gpu_device_kernels(void) {
  long n = 0;
  pthread_mutex_lock(&g_mu);
  for (int j = 0; g_dev != NULL && j < DEV_KERNELS; ++j) n += live(&g_dev->k[j]);
  pthread_mutex_unlock(&g_mu);
  return n;
}
