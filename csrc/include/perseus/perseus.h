/* libperseus: the one C ABI of the Perseus core.
 *
 * Every front end (Python via ctypes, C++ framework patches) reaches the engine
 * through these functions only. Each call returns a perseus_status_t; on failure
 * perseus_last_error() holds a human-readable message for the calling thread.
 * The core knows buffers only: pointer, shape, dtype, device. No framework types.
 */
#ifndef PERSEUS_PERSEUS_H_
#define PERSEUS_PERSEUS_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#pragma GCC visibility push(default) /* the ABI stays exported under -fvisibility=hidden */
#endif

#define PERSEUS_MAX_DIMS 16

typedef enum {
  PERSEUS_SUCCESS = 0,
  PERSEUS_INVALID_ARGUMENT = 1, /* bad input from the caller (Python: ValueError) */
  PERSEUS_NOT_INITIALIZED = 2,  /* init() was not called (or shutdown() was) */
  PERSEUS_MISMATCH = 3,         /* ranks disagree on a request (RuntimeError on every rank) */
  PERSEUS_SHUT_DOWN = 4,        /* the engine stopped before the request completed */
  PERSEUS_MPI_ERROR = 5,        /* MPI reported a failure */
  PERSEUS_CONFIG_ERROR = 6,     /* a PERSEUS_* / HOROVOD_* variable has a bad value */
  PERSEUS_UNSUPPORTED = 7,      /* valid request the core cannot serve (NotImplementedError) */
  PERSEUS_TIMEOUT = 8,          /* perseus_wait() ran out of time; the request is still pending */
  PERSEUS_INTERNAL_ERROR = 9,
  PERSEUS_NON_FINITE = 10,      /* NaN/Inf in an allreduce input (PERSEUS_ALLREDUCE_NANCHECK) */
  PERSEUS_WITHDRAWN = 11,       /* the caller withdrew the request (perseus_withdraw) before
                                   every member of its set had submitted it */
  PERSEUS_RANK_FAILED = 12      /* a rank of the job failed (its process ended) under ULFM:
                                   nothing more runs in this world; perseus_shutdown then
                                   perseus_init go on with the survivors */
} perseus_status_t;

typedef enum {
  PERSEUS_UINT8 = 0,
  PERSEUS_INT8 = 1,
  PERSEUS_INT32 = 2,
  PERSEUS_INT64 = 3,
  PERSEUS_FLOAT16 = 4,
  PERSEUS_BFLOAT16 = 5,
  PERSEUS_FLOAT32 = 6,
  PERSEUS_FLOAT64 = 7,
  PERSEUS_BOOL = 8,
  PERSEUS_INT16 = 9,
  PERSEUS_NUM_DTYPES = 10
} perseus_dtype_t;

typedef enum {
  PERSEUS_ALLREDUCE = 0,
  PERSEUS_ALLGATHER = 1,
  PERSEUS_BROADCAST = 2,
  PERSEUS_ALLTOALL = 3,
  PERSEUS_REDUCESCATTER = 4,
  PERSEUS_BARRIER = 5,
  PERSEUS_JOIN = 6
} perseus_op_type_t;

/* Horovod's values (its ReduceOp enum, which hvd.Average ... hvd.Product are), so a
 * script that passes or stores the number gets the same operation. */
typedef enum {
  PERSEUS_AVERAGE = 0,
  PERSEUS_SUM = 1,
  PERSEUS_ADASUM = 2, /* allreduce of float tensors only: pairwise adaptive summation over
                         the set, per tensor, bitwise identical on every rank; not divided
                         by the size (reducescatter: PERSEUS_UNSUPPORTED) */
  PERSEUS_MIN = 3,
  PERSEUS_MAX = 4,
  PERSEUS_PRODUCT = 5,
  /* Not Horovod's (torch.distributed's BAND, BOR, BXOR): integer tensors only, without
     scale factors. GPU tensors take the host-staged path (NCCL has no bitwise ops). */
  PERSEUS_BAND = 6,
  PERSEUS_BOR = 7,
  PERSEUS_BXOR = 8
} perseus_reduce_op_t;
#define PERSEUS_NUM_REDUCE_OPS 9

#define PERSEUS_CPU_DEVICE (-1)
#define PERSEUS_GLOBAL_PROCESS_SET 0

/* One collective request. The caller keeps every pointer valid until the handle
 * completes. `output` may equal `input` (in place). Ops whose output size depends
 * on other ranks (allgather, alltoall) leave output NULL: the core allocates it and
 * perseus_handle_output() hands it over. */
typedef struct {
  const char* name;          /* identical on every rank; NUL-terminated */
  int32_t op_type;           /* perseus_op_type_t */
  int32_t reduce_op;         /* perseus_reduce_op_t (allreduce, reducescatter) */
  int32_t dtype;             /* perseus_dtype_t */
  int32_t device;            /* PERSEUS_CPU_DEVICE or a GPU ordinal */
  int32_t ndim;
  const int64_t* shape;      /* ndim entries */
  const void* input;
  void* output;
  double prescale;           /* multiplied into the input before reducing */
  double postscale;          /* multiplied into the result */
  int32_t root_rank;         /* broadcast: rank within the process set */
  int32_t process_set;       /* id from perseus_add_process_set, 0 = global */
  const int64_t* splits;     /* alltoall: rows sent to each rank, or NULL for even */
  int32_t nsplits;
  int32_t anonymous;         /* 1 when the front end generated the name (never cached) */
  void* stream;              /* GPU: the framework's stream, else NULL */
  int32_t group_size;        /* grouped calls (grouped_allreduce, ...): the number of
                                requests of the group, all in one perseus_enqueue call;
                                0 otherwise. Ranks must agree on it. */
} perseus_request_t;

/* ---- lifecycle ---------------------------------------------------------- */
/* comm_f2c: a Fortran handle of an MPI communicator (mpi4py: comm.py2f()), or -1 for
 * MPI_COMM_WORLD. MPI is initialised here unless the application already did it.
 * Runs perseus_check_mpi_library() first and fails as it does, touching no MPI. */
perseus_status_t perseus_init(int64_t comm_f2c);
/* Compares the MPI whose mpi.h libperseus was compiled with against the MPI library
 * loaded in this process (MPI_Get_library_version, callable before MPI_Init).
 * PERSEUS_MPI_ERROR, with a message naming both and how to rebuild, when they are of
 * incompatible kinds (e.g. MPICH's header, Open MPI's libmpi: MPI would hang or
 * crash); PERSEUS_SUCCESS when they match, are of one ABI family (MPICH, Intel MPI,
 * MVAPICH2, Cray MPICH), or either is of a kind it does not know. Never initialises
 * MPI; works before perseus_init. */
perseus_status_t perseus_check_mpi_library(void);
/* The MPI whose mpi.h libperseus was compiled with, e.g. "MPICH 4.3.0" or
 * "Open MPI 4.1.4". Static storage. */
const char* perseus_mpi_header_version(void);
perseus_status_t perseus_shutdown(void);
/* perseus_shutdown for exit paths (atexit, signal handlers): gives up after timeout_s
 * (PERSEUS_TIMEOUT), e.g. when a thread is stuck in a failed MPI call, leaving the
 * engine to the process's exit. */
perseus_status_t perseus_shutdown_within(double timeout_s);
/* perseus_shutdown_within for a process that is ending, saying how to the other ranks
 * (e.g. "called os._exit(3)"): each warns with it at once, naming this rank, and their
 * requests fail naming it. */
perseus_status_t perseus_leave(const char* how, double timeout_s);
int perseus_is_initialized(void);
/* 1 when a rank of the running engine's world failed (PERSEUS_RANK_FAILED): the next
 * perseus_shutdown and perseus_init form the world of the survivors. */
int perseus_world_failed(void);
/* Growing in place (Open MPI 5): the next perseus_init (every rank calls both, with
 * the same count) first starts `count` new processes, running `command` with `nargs`
 * arguments (`args`: each NUL-terminated, one after the other) in the folder `wdir`
 * (NULL: MPI's choice), with MPI_Comm_spawn, and merges them into the job after its
 * ranks, whose ranks stay the low ones; their own first perseus_init joins it. 0
 * cancels a request. `hosts` (NULL or "": MPI's choice) places them, in rank order,
 * "host:n,host:n" (the n summing to count), each host's with MPI_Comm_spawn_multiple;
 * `add_hosts` ("host:slots,..." of hosts in `hosts`, NULL: none) are added to the job's
 * hosts first (PMIX_ADD_HOST). Only rank 0's request is used. */
perseus_status_t perseus_grow(int32_t count, const char* command, const char* args,
                              int32_t nargs, const char* wdir, const char* hosts,
                              const char* add_hosts);
/* 1 when this process was started by perseus_grow in a running job and its first
 * perseus_init joined that job. */
int perseus_joined_job(void);
/* Shrinking in place (ULFM): collective over the job's processes between
 * perseus_shutdown and perseus_init. Those with keep=0 leave the job (the caller ends
 * the process next, without MPI_Finalize); the others, in their rank order, form the
 * next perseus_init's world. */
perseus_status_t perseus_keep_in_job(int32_t keep);
/* Whether this job outlives a failed rank (ULFM: the core's MPI has it, *built_out,
 * and the job was started with it, mpirun --with-ft ulfm, *enabled_out): 1 or 0 each.
 * Returns why, as text. Works before init. */
const char* perseus_fault_tolerance(int32_t* built_out, int32_t* enabled_out);
const char* perseus_last_error(void);
const char* perseus_status_string(perseus_status_t status);

/* ---- topology ----------------------------------------------------------- */
perseus_status_t perseus_rank(int32_t* out);
perseus_status_t perseus_size(int32_t* out);
perseus_status_t perseus_local_rank(int32_t* out);
perseus_status_t perseus_local_size(int32_t* out);
perseus_status_t perseus_cross_rank(int32_t* out);
perseus_status_t perseus_cross_size(int32_t* out);
/* Each rank's node into out[0 .. n-1] (n: the size), the nodes numbered from 0 by their
 * lowest rank, and whether every node holds as many ranks (1 or 0): the same answers on
 * every rank, found once at init. */
perseus_status_t perseus_rank_nodes(int32_t* out, int32_t n);
perseus_status_t perseus_is_homogeneous(int32_t* out);
perseus_status_t perseus_mpi_threads_supported(int32_t* out);
/* The number of lanes actually in use (after the MPI_THREAD_MULTIPLE check). */
perseus_status_t perseus_lane_count(int32_t* out);
/* How long a collective control call (perseus_add_process_set, perseus_start_timeline,
 * a front end's new_group) waits for every rank before it fails naming the absent
 * ones: the stall check time, or 60 s where that check is off. */
perseus_status_t perseus_meeting_seconds(double* out);
/* The validated configuration as "NAME=value\n" lines. Valid until the next call. */
const char* perseus_config_string(void);
/* What the core has asked of MPI since the process started, for tests that hold a
 * call's cost to a budget: out[i] for i < n of, in order, negotiation rounds (one
 * MPI_Iallreduce each), metadata gathers (MPI_Iallgather and MPI_Iallgatherv), rounds
 * that carried a request's data, requests completed by such a round, and the lanes'
 * collectives. Works before init. */
#define PERSEUS_NUM_COUNTERS 5
perseus_status_t perseus_counters(int64_t* out, int32_t n);

/* ---- timeline ----------------------------------------------------------- */
/* Starts writing a Chrome-trace JSON timeline to `path` (truncated), as
 * PERSEUS_TIMELINE does at init. Collective, like perseus_add_process_set: every rank
 * calls it; rank 0 opens and writes the file (the other ranks' paths are not used)
 * and every rank returns rank 0's outcome. A rank that does not call it within the
 * stall check time fails the others' call, naming it.
 * mark_cycles != 0 adds an instant event per negotiation round. A running timeline
 * is closed first. The file stays loadable while written (an unterminated JSON
 * array, which trace viewers accept); perseus_stop_timeline and perseus_shutdown
 * close the array. A write error later stops the timeline with one warning.
 * perseus_stop_timeline is local: a no-op except on rank 0. */
perseus_status_t perseus_start_timeline(const char* path, int32_t mark_cycles);
perseus_status_t perseus_stop_timeline(void);

/* ---- process sets (collective over all ranks, in the same order) -------- */
perseus_status_t perseus_add_process_set(const int32_t* ranks, int32_t nranks, int32_t* id_out);
perseus_status_t perseus_remove_process_set(int32_t id);
/* rank_out = -1 when this process is not a member. */
perseus_status_t perseus_process_set_rank(int32_t id, int32_t* rank_out);
perseus_status_t perseus_process_set_size(int32_t id, int32_t* size_out);
/* While no thread waits, the engine holds the set's CPU requests (gpu = 0) or GPU
 * requests (gpu = 1) until bytes_out bytes are pending or the oldest is ms_out old
 * (bytes_out = 0: it does not hold). A front end that gathers requests before
 * enqueueing them (DistributedOptimizer's gradients) gathers no longer than that, so
 * it schedules as the engine would. */
perseus_status_t perseus_process_set_hold(int32_t id, int32_t gpu, int64_t* bytes_out,
                                          double* ms_out);
/* Writes up to `capacity` global ranks of the set; size_out gets the full count. */
perseus_status_t perseus_process_set_ranks(int32_t id, int32_t* ranks, int32_t capacity,
                                           int32_t* size_out);

/* ---- request rules ------------------------------------------------------ */
/* The rules perseus_enqueue applies to a request that its buffers do not decide, for
 * a front end that must know before it enqueues: to size an output, or to refuse a
 * call at once whose request is enqueued later (an engine's queue, a graph). Each
 * refuses with the status and message perseus_enqueue would give (there after
 * "request '<name>': "), so the rules have one owner, the core. */
/* Reductions (allreduce, reducescatter; other operations pass): a known reduce op;
 * Adasum only for allreduce (PERSEUS_UNSUPPORTED) and only of float16, bfloat16,
 * float32 or float64 tensors; BAND, BOR and BXOR only of integer tensors; no bool
 * tensors. Works before perseus_init. (Scale factors on BAND/BOR/BXOR are refused at
 * perseus_enqueue.) */
perseus_status_t perseus_check_reduction(int32_t op_type, int32_t reduce_op, int32_t dtype);
/* The rules on dim 0 of a tensor of `ndim` dimensions whose dim 0 is `rows` (< 0: not
 * known yet, then not checked against), after the one on the set (this rank must be a
 * member), in perseus_enqueue's order: allgather, alltoall and reducescatter need
 * ndim >= 1; alltoall's splits (nsplits entries, or NULL: an even split, which `rows`
 * must allow) are one per rank of the process set, non-negative, and add up to rows.
 * rows_out (may be NULL) gets this rank's rows of a reducescatter's output (dim 0
 * split evenly over the set, the first rows % size ranks one more), else -1. */
perseus_status_t perseus_check_rows(int32_t op_type, int32_t process_set, int32_t ndim,
                                    int64_t rows, const int64_t* splits, int32_t nsplits,
                                    int64_t* rows_out);

/* ---- requests ----------------------------------------------------------- */
/* Enqueues n requests atomically (they reach the engine together, so a group is
 * negotiated as one unit). handles_out receives n handles. On failure nothing is
 * enqueued. */
perseus_status_t perseus_enqueue(const perseus_request_t* requests, int32_t n,
                                 int64_t* handles_out);
/* perseus_enqueue for a caller that will wait at once: the calling thread then runs
 * the engine itself until these requests complete (or max_drive_s passes), so the
 * latency path has no thread hand-off. Collect results with perseus_wait as usual. */
perseus_status_t perseus_enqueue_and_drive(const perseus_request_t* requests, int32_t n,
                                           int64_t* handles_out, double max_drive_s);
/* perseus_enqueue for a caller that will wait for these requests soon, and drive the
 * engine then (perseus_wait and the like): the engine thread is not woken for them
 * (with no idle core, it would take the caller's core), and what the caller enqueues
 * meanwhile goes out with them, in one round. Until a thread waits for or polls them,
 * they wait for the engine thread's next look (another enqueue, its hold's end, its
 * next probe of the set's peers: perseus_process_set_probe). */
perseus_status_t perseus_enqueue_deferred(const perseus_request_t* requests, int32_t n,
                                          int64_t* handles_out);
/* perseus_enqueue_and_drive, perseus_wait_all and perseus_release of every handle in
 * one call, for a caller that waits at once and reads no core-allocated output (an
 * in-place allreduce or broadcast, a barrier): the latency path of a repeated small
 * call. Returns PERSEUS_SUCCESS, or the first failed request's status with its
 * message; either way every handle is released. If a request is still pending after
 * timeout_s (<0: forever), returns PERSEUS_TIMEOUT and releases nothing: the caller
 * goes on with handles_out as after perseus_enqueue. handles_out is written only once
 * the requests are enqueued: a caller that zeroed it tells a request refused (nothing
 * enqueued, every entry still 0; handles are never 0) from one that failed. */
perseus_status_t perseus_run(const perseus_request_t* requests, int32_t n, int64_t* handles_out,
                             double timeout_s);
/* 1 when done (successfully or not), 0 while pending. */
perseus_status_t perseus_poll(int64_t handle, int32_t* done_out);
/* Blocks until the handle completes or timeout_s passes (<0: forever). Returns the
 * request's own status; its message is in perseus_last_error(). */
perseus_status_t perseus_wait(int64_t handle, double timeout_s);
/* perseus_wait for n handles in one call (a framework's step waiting for all its
 * gradients): the caller drives the engine for all of them at once, then waits for
 * each in list order, stopping at the first that failed. Returns that handle's
 * status (message in perseus_last_error()) with *index_out = its index, or
 * PERSEUS_SUCCESS with *index_out = -1 when all succeeded. timeout_s bounds the
 * whole call (<0: forever); on expiry PERSEUS_TIMEOUT, *index_out = the first handle
 * still pending, and the handles stay pending. An unknown handle is
 * PERSEUS_INVALID_ARGUMENT with *index_out = its index. Releases nothing. */
perseus_status_t perseus_wait_all(const int64_t* handles, int32_t n, double timeout_s,
                                  int32_t* index_out);
/* Called once when a set of handles has completed: status is the first failed
 * handle's (in list order) with its message, else PERSEUS_SUCCESS and "". */
typedef void (*perseus_callback_t)(void* arg, perseus_status_t status, const char* message);
/* Calls cb(arg, ...) exactly once, when all n handles have completed (n = 0: at
 * once). It runs on the thread that completes the last handle: the engine thread, a
 * lane's worker thread, a thread running the engine inside perseus_wait or
 * perseus_enqueue_and_drive, or the one in perseus_shutdown (PERSEUS_SHUT_DOWN for
 * requests it cancels); when every handle is complete already, on the calling
 * thread before this returns. So cb must be quick and must not block: no
 * perseus_wait, no perseus_shutdown (perseus_poll, perseus_handle_output,
 * perseus_release and perseus_enqueue are fine). Like a poll that finds them
 * pending, it tells the engine that someone waits for these requests, so they are
 * not held back. The handles stay valid until released. An unknown handle is
 * PERSEUS_INVALID_ARGUMENT, and cb is then never called. */
perseus_status_t perseus_on_complete(const int64_t* handles, int32_t n, perseus_callback_t cb,
                                     void* arg);
/* After completion: the core-allocated output (allgather, alltoall) and its shape.
 * Ownership of *data passes to the caller: for a CPU request it is host memory (free
 * with perseus_free_buffer); for a GPU request it is device memory on the request's
 * device (free with perseus_free_device_buffer, never perseus_free_buffer). For
 * alltoall, recv_splits gets the rows received from each rank (nsplits entries,
 * valid until perseus_release). For join, shape[0] carries the last rank to join. */
perseus_status_t perseus_handle_output(int64_t handle, void** data, int64_t* shape,
                                       int32_t* ndim, const int64_t** recv_splits,
                                       int32_t* nsplits);
/* Gives up on a request that not every member of its set has submitted (a front end's
 * timeout, e.g. a torch process group's): the engine takes it back at its next step
 * between negotiation rounds, and it completes with PERSEUS_WITHDRAWN, its message
 * naming the members that had not submitted it and ending with `reason`. A request
 * already agreed by every member is not withdrawn: it completes as usual. The other
 * members' copies of the request stay pending (their own timeouts, or the stall
 * check, end them). Returns at once; wait on the handle for the outcome. */
perseus_status_t perseus_withdraw(int64_t handle, const char* reason);
/* Makes this rank look for the messages of process set `id`'s peers at least every
 * `interval_s` seconds, even while it has nothing to do; by default it follows the
 * stall check times (at most every 5 s). A front end whose requests may be withdrawn
 * sooner than that (perseus_withdraw) calls it on every member, so that a member with
 * nothing pending still joins the round that tells the others who is missing. Local;
 * the shortest interval asked for stays. */
perseus_status_t perseus_process_set_probe(int32_t id, double interval_s);
/* ---- point-to-point (torch's send and recv) -------------------------------------
 * Not negotiated: a send is matched with a receive of the same process set by source
 * and tag, in the order each was posted, apart from collectives. Host memory (device
 * -1) goes over MPI, on a communicator of the set's own. Device memory goes over NCCL,
 * on a communicator of two ranks per pair (made at the pair's first message), matched
 * first over MPI: `stream` is the framework's stream the data is ready on, and once
 * the handle completes the NCCL call is queued, not done: perseus_stream_wait orders a
 * stream after it. A device receive needs a named source (NCCL has no wildcard). The
 * data is kept valid by the caller until the handle completes (device memory: until
 * the stream waited on has passed it); a receive fails, naming both sizes, unless the
 * message has exactly `bytes` bytes (a device send then fails too). After a receive
 * completes, perseus_handle_output's shape[0] is the source's rank in the set (its data
 * is NULL). perseus_withdraw cancels a receive; a send it fails at once, though MPI may
 * still deliver a host one (a device one is not sent once withdrawn). */
typedef struct {
  int32_t recv;         /* 1: receive into data; 0: send data */
  void* data;
  int64_t bytes;        /* host memory: at most 2^31 - 1 */
  int32_t peer;         /* rank within the process set; a host receive: -1 for any rank */
  int32_t tag;          /* >= 0 */
  int32_t process_set;  /* 0 = global */
  int32_t device;       /* -1: host memory; else the CUDA device holding data */
  void* stream;         /* device memory: the framework's cudaStream_t (NULL = legacy default) */
} perseus_p2p_t;
perseus_status_t perseus_point_to_point(const perseus_p2p_t* message, int64_t* handle_out);
/* Forgets a completed handle. */
perseus_status_t perseus_release(int64_t handle);
void perseus_free_buffer(void* data);

/* ---- GPU tensors -------------------------------------------------------------
 * A request with device >= 0 is a CUDA tensor on that device ordinal: input and
 * output are device pointers, and `stream` is the cudaStream_t that produces the
 * input and will consume the output (NULL = the legacy default stream). One GPU per
 * process: every GPU request of a process names the same ordinal (ordinals may differ
 * between ranks). No CUDA is needed at build time: the CUDA runtime and NCCL are
 * loaded at run time, at the first GPU request or perseus_gpu_load(), from
 * PERSEUS_CUDA_LIB / PERSEUS_NCCL_LIB if set (a file or a folder; if set and not
 * loadable, that is the error), else an already-loaded copy (libcudart.so.13/.12/
 * .11.0, libnccl.so.2), else the folders of perseus_set_gpu_library_dirs(), else the
 * system loader path. If they cannot be loaded, or there is no device, GPU requests
 * fail on every rank with a message naming each path tried; CPU requests keep working.
 *
 * Ordering, with no host synchronisation on the hot path: perseus_enqueue records an
 * event on the request's stream; the lane's stream waits for it before reading the
 * input. A GPU handle completes once the request's device work is QUEUED on the
 * lane's stream; the result is ready on the device only after perseus_stream_wait().
 *
 * Paths: with PERSEUS_GPU_OPERATIONS=nccl (default) the collectives run with NCCL
 * (allreduce Sum/Average/Min/Max/Product; broadcast; allgather, uneven first
 * dimensions too; alltoall with splits; reducescatter), scale factors of Sum and
 * Average folded into one NCCL pre-multiply-sum operator. These run host-staged
 * (pinned copies, the MPI algorithms) instead: Adasum; BAND, BOR and BXOR; reductions
 * of int16; integer reductions with scale factors; Min/Max/Product with scale
 * factors; and every GPU batch when PERSEUS_GPU_OPERATIONS=mpi or NCCL cannot be
 * loaded (one warning). With PERSEUS_ALLREDUCE_NANCHECK, NCCL allreduce inputs are
 * copied to host and checked first. GPU tensors need MPI_THREAD_MULTIPLE. */

/* ':'-separated folders searched for the CUDA runtime and NCCL after
 * PERSEUS_*_LIB and before the system loader path (the torch front end passes torch's
 * lib/ and the nvidia/<package>/lib folders). Call before the first GPU request; once
 * a library was loaded (or tried), other folders are PERSEUS_INVALID_ARGUMENT and the
 * same folders again are accepted. Works before perseus_init. */
perseus_status_t perseus_set_gpu_library_dirs(const char* dirs);
/* Loads the CUDA runtime and NCCL now (else the first GPU request does), once per
 * process; the outcome, failure included, is kept. Sets *cuda_ok and *nccl_ok (either
 * may be NULL) to 1 for each library that loaded. PERSEUS_SUCCESS when the CUDA
 * runtime loaded, even if NCCL did not (see perseus_gpu_describe); else
 * PERSEUS_UNSUPPORTED naming every path tried. Does not initialise the CUDA driver.
 * Works before perseus_init. */
perseus_status_t perseus_gpu_load(int32_t* cuda_ok, int32_t* nccl_ok);
/* Human-readable, one line per library: its path and version (CUDA runtime and
 * driver versions and the device count, NCCL as X.Y.Z), or why it did not load with
 * the paths tried. Loads them (as perseus_gpu_load) and asks cudaGetDeviceCount, which
 * initialises the CUDA driver. Works before perseus_init. Valid until the next call
 * on the same thread. */
const char* perseus_gpu_describe(void);
/* After a GPU request's handle completed: makes `stream` (a cudaStream_t; NULL =
 * legacy default) wait on the device until the request's device work is done
 * (cudaStreamWaitEvent; the host does not wait). Call it for the stream that will
 * read the output, or free or overwrite the input, before doing so. A request that
 * failed after some of its device work was queued is waited for the same way; one
 * that failed before is a no-op, as are CPU handles. PERSEUS_INVALID_ARGUMENT while
 * pending or for an unknown handle. */
perseus_status_t perseus_stream_wait(int64_t handle, void* stream);
/* perseus_stream_wait for n handles, one cudaStreamWaitEvent per distinct completion
 * event (the requests of one batch share one). Every handle is looked at; the status
 * is the first failing handle's (in list order). */
perseus_status_t perseus_stream_wait_all(const int64_t* handles, int32_t n, void* stream);
/* Frees a core-allocated device output (GPU allgather/alltoall, from
 * perseus_handle_output) stream-ordered on `stream` (cudaFreeAsync), so a framework
 * tensor viewing it may be dropped while kernels reading it are still queued there.
 * `stream` must have waited for the handle (perseus_stream_wait). NULL data: no-op. */
perseus_status_t perseus_free_device_buffer(void* data, void* stream);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* PERSEUS_PERSEUS_H_ */
