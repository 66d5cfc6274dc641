/* What the two halves of the fake CUDA runtime share: fake_gpu.c (the runtime and
 * NCCL) and fake_order.c (the ordering checker). */
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
