/* The fake CUDA runtime's ordering checker (see fake_gpu.h for the model). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_gpu.h"

#define MAX_AGENTS 2048
#define MAX_DEVICES 16

typedef struct {
  uint32_t t[MAX_AGENTS];
} Clock;

struct OrderAgent {
  int id;
  int device; /* -1: a host thread */
  char label[48];
  Clock clock;
};
struct OrderSnapshot {
  Clock clock;
};

/* One recorded access: [lo, hi) read or written by `agent` at its clock `epoch`. */
typedef struct {
  uintptr_t lo, hi;
  int agent;
  uint32_t epoch;
  int write;
  const char* what;
} Access;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_enabled = -1;
static OrderAgent* g_agents[MAX_AGENTS];
static int g_nagents;
static OrderAgent* g_legacy[MAX_DEVICES];
static Access* g_access;
static size_t g_naccess, g_access_cap;
static __thread OrderAgent* t_host;

typedef struct {
  uintptr_t p;
  size_t n;
} Allocation;
static Allocation* g_allocs;
static size_t g_nallocs, g_allocs_cap;

static int enabled(void) {
  if (g_enabled < 0) {
    const char* v = getenv("FAKE_GPU_ORDER_CHECK");
    g_enabled = !(v && strcmp(v, "0") == 0) && !fake_timing_mode();
  }
  return g_enabled;
}

/* ---------------------------------------------------------------- agents and clocks */

static OrderAgent* new_agent(int device, const char* label) {
  if (g_nagents == MAX_AGENTS) {
    fake_misuse("ordering checker: more than %d streams and threads", MAX_AGENTS);
    return NULL;
  }
  OrderAgent* a = (OrderAgent*)calloc(1, sizeof *a);
  a->id = g_nagents;
  a->device = device;
  snprintf(a->label, sizeof a->label, "%s #%d", label, a->id);
  g_agents[g_nagents++] = a;
  return a;
}

static void merge(Clock* into, const Clock* from) {
  for (int i = 0; i < g_nagents; ++i)
    if (from->t[i] > into->t[i]) into->t[i] = from->t[i];
}

/* The calling thread's agent (made at its first use). */
static OrderAgent* host(void) {
  if (t_host == NULL) t_host = new_agent(-1, "host thread");
  return t_host;
}

OrderAgent* order_new_stream(int device) {
  if (!enabled()) return NULL;
  pthread_mutex_lock(&g_mu);
  OrderAgent* a = new_agent(device, "stream");
  pthread_mutex_unlock(&g_mu);
  return a;
}

OrderAgent* order_legacy_stream(int device) {
  if (!enabled() || device < 0 || device >= MAX_DEVICES) return NULL;
  pthread_mutex_lock(&g_mu);
  if (g_legacy[device] == NULL) g_legacy[device] = new_agent(device, "legacy stream");
  OrderAgent* a = g_legacy[device];
  pthread_mutex_unlock(&g_mu);
  return a;
}

void order_name(OrderAgent* a, const char* label) {
  if (a == NULL) return;
  pthread_mutex_lock(&g_mu);
  snprintf(a->label, sizeof a->label, "stream '%s' #%d", label, a->id);
  pthread_mutex_unlock(&g_mu);
}

/* ---------------------------------------------------------------- recorded accesses */

static void push(Access a) {
  if (g_naccess == g_access_cap) {
    g_access_cap = g_access_cap ? 2 * g_access_cap : 256;
    g_access = (Access*)realloc(g_access, g_access_cap * sizeof(Access));
  }
  g_access[g_naccess++] = a;
}

/* Drops the parts of records inside [lo, hi) that `keep` does not keep (keep NULL:
 * drop all), keeping what sticks out on either side. */
static void cut(uintptr_t lo, uintptr_t hi, int (*keep)(const Access*, int), int arg) {
  size_t n = g_naccess, out = 0, nright = 0;
  Access* right = NULL; /* right-hand pieces: appended after the pass */
  for (size_t i = 0; i < n; ++i) {
    Access r = g_access[i];
    if (r.hi <= lo || r.lo >= hi || (keep && keep(&r, arg))) {
      g_access[out++] = r;
      continue;
    }
    if (r.lo < lo) {
      g_access[out] = r;
      g_access[out++].hi = lo;
    }
    if (r.hi > hi) {
      right = (Access*)realloc(right, (nright + 1) * sizeof(Access));
      right[nright] = r;
      right[nright++].lo = hi;
    }
  }
  g_naccess = out;
  for (size_t k = 0; k < nright; ++k) push(right[k]);
  free(right);
}

static int keep_other_agents_and_writes(const Access* r, int agent) {
  return r->agent != agent || r->write;
}

/* Reports the first earlier access to [lo, hi) that `a` is not ordered after. */
static void check(const OrderAgent* a, const char* what, uintptr_t lo, uintptr_t hi, int write) {
  for (size_t i = 0; i < g_naccess; ++i) {
    const Access* r = &g_access[i];
    if (r->hi <= lo || r->lo >= hi || r->agent == a->id) continue;
    if (!write && !r->write) continue;            /* two reads never conflict */
    if (a->clock.t[r->agent] >= r->epoch) continue;  /* ordered after it */
    uintptr_t from = r->lo > lo ? r->lo : lo, to = r->hi < hi ? r->hi : hi;
    fake_misuse("RACE: %s (%s %zu bytes at %p) on %s is not ordered after %s (%s them) on %s: "
                "a missing cudaStreamWaitEvent or synchronisation",
                what, write ? "writes" : "reads", (size_t)(to - from), (void*)from, a->label,
                r->what, r->write ? "wrote" : "read", g_agents[r->agent]->label);
    return;
  }
}

static void access_range(OrderAgent* a, const char* what, const void* p, size_t n, int write) {
  if (p == NULL || n == 0) return;
  uintptr_t lo = (uintptr_t)p, hi = lo + n;
  check(a, what, lo, hi, write);
  if (write) cut(lo, hi, NULL, 0);
  else cut(lo, hi, keep_other_agents_and_writes, a->id); /* this agent's older reads */
  Access r = {lo, hi, a->id, a->clock.t[a->id], write, what};
  push(r);
}

/* ---------------------------------------------------------------- operations */

void order_on_stream(OrderAgent* s, const char* what, const void* read, size_t nread,
                     const void* write, size_t nwrite) {
  if (s == NULL) return;
  pthread_mutex_lock(&g_mu);
  OrderAgent* h = host();
  if (h != NULL) merge(&s->clock, &h->clock); /* queued after what this thread knew done */
  s->clock.t[s->id]++;
  access_range(s, what, read, nread, 0);
  access_range(s, what, write, nwrite, 1);
  pthread_mutex_unlock(&g_mu);
}

void order_event_record(OrderSnapshot** event, OrderAgent* s) {
  if (s == NULL) return;
  pthread_mutex_lock(&g_mu);
  if (*event == NULL) *event = (OrderSnapshot*)calloc(1, sizeof **event);
  OrderAgent* h = host();
  if (h != NULL) merge(&s->clock, &h->clock);
  (*event)->clock = s->clock;
  pthread_mutex_unlock(&g_mu);
}

void order_stream_wait(OrderAgent* s, const OrderSnapshot* event) {
  if (s == NULL) return;
  pthread_mutex_lock(&g_mu);
  OrderAgent* h = host();
  if (h != NULL) merge(&s->clock, &h->clock);
  if (event != NULL) merge(&s->clock, &event->clock);
  pthread_mutex_unlock(&g_mu);
}

void order_event_free(OrderSnapshot* event) { free(event); }

void order_host_sync(OrderAgent* s) {
  if (s == NULL) return;
  pthread_mutex_lock(&g_mu);
  OrderAgent* h = host();
  if (h != NULL) merge(&h->clock, &s->clock);
  pthread_mutex_unlock(&g_mu);
}

void order_host_access(const char* what, const void* p, size_t n, int write) {
  if (!enabled()) return;
  pthread_mutex_lock(&g_mu);
  OrderAgent* h = host();
  if (h != NULL) {
    h->clock.t[h->id]++;
    access_range(h, what, p, n, write);
  }
  pthread_mutex_unlock(&g_mu);
}

/* ---------------------------------------------------------------- allocations */

void order_allocated(void* p, size_t n) {
  if (!enabled() || p == NULL) return;
  pthread_mutex_lock(&g_mu);
  cut((uintptr_t)p, (uintptr_t)p + n, NULL, 0);
  if (g_nallocs == g_allocs_cap) {
    g_allocs_cap = g_allocs_cap ? 2 * g_allocs_cap : 64;
    g_allocs = (Allocation*)realloc(g_allocs, g_allocs_cap * sizeof(Allocation));
  }
  g_allocs[g_nallocs].p = (uintptr_t)p;
  g_allocs[g_nallocs].n = n;
  g_nallocs++;
  pthread_mutex_unlock(&g_mu);
}

size_t order_allocation_size(const void* p) {
  if (!enabled() || p == NULL) return 0;
  size_t n = 0;
  pthread_mutex_lock(&g_mu);
  for (size_t i = 0; i < g_nallocs; ++i)
    if (g_allocs[i].p == (uintptr_t)p) n = g_allocs[i].n;
  pthread_mutex_unlock(&g_mu);
  return n;
}

void order_forget_allocation(const void* p) {
  if (!enabled() || p == NULL) return;
  pthread_mutex_lock(&g_mu);
  for (size_t i = 0; i < g_nallocs; ++i) {
    if (g_allocs[i].p != (uintptr_t)p) continue;
    cut((uintptr_t)p, (uintptr_t)p + g_allocs[i].n, NULL, 0);
    g_allocs[i] = g_allocs[--g_nallocs];
    break;
  }
  pthread_mutex_unlock(&g_mu);
}
