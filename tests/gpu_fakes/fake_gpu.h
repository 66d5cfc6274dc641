/* What the parts of the fake CUDA runtime and NCCL share: fake_gpu.c (the runtime),
 * fake_nccl.c (NCCL), fake_device.c (the device model of NCCL kernels), fake_order.c
 * (the ordering checker) and fake_kernel.c (the pack kernel and batched copies). */
#ifndef FAKE_GPU_H_
#define FAKE_GPU_H_

#include <stddef.h>

/* Counts a misuse of the fake (a bug in its caller) and prints it. */
void fake_misuse(const char* fmt, ...);
/* FAKE_GPU_TIMING=1: no data moves, no ordering checks (fake_gpu.c's header). */
int fake_timing_mode(void);

/* ---------------------------------------------------------------- fake_gpu.c's streams
 * and counters, for the kernel and batched copies of fake_kernel.c. */
typedef struct OrderAgent OrderAgent;
/* Calls that cost host time on a real GPU, by kind (fake_gpu_calls). */
enum { kCallRecord, kCallWait, kCallCopy, kCallLaunch, kCallNccl, kCallSetDevice, kCallKinds };
void fake_count_call(int kind);
int fake_env_int(const char* name, int fallback);
int fake_runtime_version(void); /* FAKE_CUDA_RUNTIME_VERSION, default 12080 (12.8) */
/* Nonzero (and a misuse counted) unless `stream` is live and its device is current. */
int fake_check_stream(void* stream, const char* what);
OrderAgent* fake_stream_agent(void* stream); /* the checker's agent; NULL when it is off */
int fake_is_legacy_stream(void* stream);
/* The device of a live stream; -1 (and a misuse counted) if it is not one. */
int fake_stream_device(void* stream);
int fake_current_device(void); /* cudaSetDevice's, on this thread */
/* The counters of fake_gpu_stats, in the order tests/support/fake_gpu.py's STAT_KEYS names them. */
enum { kStatDevice, kStatHost, kStatStreams, kStatEvents, kStatComms, kStatMisuse, kStatCommsCreated,
       kStatNcclCalls, kStats };
void fake_stat_add(int stat, long delta);

/* ---------------------------------------------------------------- the device model
 * (fake_device.c) A launched NCCL kernel occupies its GPU until every rank of its
 * communicator has started the matching kernel (the same call of that communicator);
 * a GPU runs at most FAKE_GPU_KERNEL_SLOTS (K, default 1: kernels that fill it) such
 * kernels at once, started in launch order, as NCCL's launch-order-implicit mode runs
 * them. A kernel that waits for a slot or for its peers is checked for a deadlock
 * across the job's processes (each publishes its GPU's kernels in a file of its own
 * under FAKE_GPU_DEVICE_DIR, default /tmp); a deadlock is reported, naming the wait-for
 * cycle, and fails the calls involved on every rank instead of hanging, as does a wait
 * longer than FAKE_GPU_DEVICE_TIMEOUT_S (default 60). One GPU per process, as Perseus
 * drives (ranks that share a GPU are modelled as K slots each). */
typedef struct {
  int tag;           /* the communicator, the same number in every process */
  long seq;          /* this kernel's place among the communicator's kernels */
  int rank, nranks;  /* in the communicator */
  const int* pids;   /* its ranks' processes, by communicator rank */
  int implicit;      /* launch order implicit in effect (NCCL_LAUNCH_ORDER_IMPLICIT, launchOrderImplicit) */
} KernelInfo;
/* Publishes this process's GPU for its peers to read (call before they may look). */
void device_register(void);
/* Queues a kernel and waits for a slot: its slot (>= 0), or -1 with the report in `why`. */
int device_start(const KernelInfo* info, const char* what, char* why, size_t n);
/* Called while a started kernel waits for its peers, `waited_s` so far: 0 to wait on,
 * else 1 with the report in `why` (a deadlock, a peer's failure, the bounded wait). */
int device_waiting(int slot, double waited_s, char* why, size_t n);
void device_end(int slot, int failed); /* failed: kept, so that its peers learn of it */
void device_forget(int tag);           /* the communicator is gone */

/* ---------------------------------------------------------------- ordering checker
 * Vector clocks, as PyTorch's CUDA sanitizer keeps them: every stream and every host
 * thread is an agent with a clock; an operation on a stream ticks the stream's own
 * entry; cudaEventRecord snapshots the stream's clock, cudaStreamWaitEvent merges a
 * snapshot into the waiting stream, a host synchronisation merges a stream's clock
 * into the host thread's, and work a host thread queues starts after what that thread
 * already knew to be done (its clock is merged into the stream's). Each operation
 * declares the bytes it reads and writes; one that touches bytes an earlier operation
 * of another agent wrote (or, for a write, read) without being ordered after it is a
 * race, reported as a misuse naming both. Everything runs at once all the same: the
 * checker judges the order the program asked for, not the order things happened in,
 * so a missing wait fails every time.
 *
 * FAKE_GPU_ORDER_CHECK=0, or the timing mode, turns it off (then every function below
 * does nothing). */
typedef struct OrderSnapshot OrderSnapshot;

OrderAgent* order_new_stream(int device);
OrderAgent* order_legacy_stream(int device); /* the device's NULL stream, made once */
void order_name(OrderAgent* stream, const char* label);

/* One operation on `stream`: reads [read, read + nread), writes [write, write + nwrite). */
void order_on_stream(OrderAgent* stream, const char* what, const void* read, size_t nread,
                     const void* write, size_t nwrite);
void order_event_record(OrderSnapshot** event, OrderAgent* stream);
void order_stream_wait(OrderAgent* stream, const OrderSnapshot* event); /* NULL: never recorded */
void order_event_free(OrderSnapshot* event);
void order_host_sync(OrderAgent* stream); /* the calling thread saw `stream` finish */
void order_host_access(const char* what, const void* p, size_t n, int write);

/* Memory that starts or ends a life: what was recorded of its bytes is forgotten. */
void order_allocated(void* p, size_t n);
size_t order_allocation_size(const void* p); /* 0 if order_allocated never saw it */
void order_forget_allocation(const void* p);

#endif /* FAKE_GPU_H_ */
