#include "cuda/device_runner.h"

#include <atomic>
#include <sstream>

#include "common/list_string.h"
#include "common/logging.h"
#include "cuda/memory/batched_copy.h"
#include "cuda/runtime/device_guard.h"
#include "cuda/runtime/event_pool.h"
#include "cuda/runtime/nccl_features.h"
#include "cuda/nccl/nccl_comm.h"
#include "cuda/nccl/nccl_ops.h"
#include "cuda/process_device.h"
#include "cuda/shared_device.h"
#include "cuda/staged/staged_ops.h"
#include "mpi/mpi_lock.h"
#include "mpi/mpi_status.h"

namespace perseus {

namespace gpu {

namespace {

// What each rank tells the set at opening, in its exchange's first byte.
constexpr char kCanNccl = 1;      // it loaded NCCL and GPU operations are NCCL's
constexpr char kCanShareGpu = 2;  // its NCCL runs several ranks on one GPU (nccl_features.h)

// The device of this process: bound by its first GPU request, else (a rank that has
// joined before submitting any GPU request) this thread's current device.
Status ChooseDevice(int count, int* device) {
  int chosen = BoundDevice();
  if (chosen < 0) {
    int current = 0;
    PERSEUS_RETURN_IF_ERROR(CudaStatus(Cuda()->GetDevice(&current), "cudaGetDevice"));
    chosen = BindDevice(current);
  }
  if (chosen >= count)
    return Status::Error(PERSEUS_INVALID_ARGUMENT, "device cuda:" + std::to_string(chosen) +
                                                       " does not exist; this process sees " +
                                                       std::to_string(count) + " CUDA device(s)");
  *device = chosen;
  return Status::OK();
}

// The entries whose ready events the lane must wait for: one per producer stream, the
// one recorded last there. A stream runs in order, so that event covers the earlier
// ones; handles are made in the order events are recorded (both under the engine's
// lock at enqueue). cudaStreamPerThread names another stream on each thread: its
// events are each waited for (once per event: requests of one call share one).
constexpr uintptr_t kPerThreadStream = 0x2;

Status LastReadyPerStream(const Batch& batch, std::vector<const Entry*>* out) {
  for (const BatchItem& item : batch.items) {
    const Entry* entry = item.entry.get();
    if (entry == nullptr) continue;  // a joined rank's slot
    if (!entry->ready_event)
      return Status::Error(PERSEUS_INTERNAL_ERROR, "request '" + item.meta.name + "' has no ready event");
    const bool per_thread = reinterpret_cast<uintptr_t>(entry->stream) == kPerThreadStream;
    bool covered = false;
    for (const Entry*& seen : *out) {
      if (seen->ready_event == entry->ready_event ||
          (!per_thread && seen->stream == entry->stream)) {
        if (entry->handle > seen->handle) seen = entry;
        covered = true;
        break;
      }
    }
    if (!covered) out->push_back(entry);
  }
  return Status::OK();
}

// How long an abort waits for a batch being run to leave on its own (a real NCCL's
// calls return at once, the kernel queued); past it, the batch's thread is blocked in
// an NCCL call waiting for the dead peer, and only the abort ends that call.
constexpr std::chrono::milliseconds kAbortGrace(100);

}  // namespace

DeviceRunner::DeviceRunner(DeviceRunnerArgs args) : args_(std::move(args)) {}

void DeviceRunner::Abort(const Status& why) {
  std::unique_lock<std::mutex> lock(abort_mu_);
  if (aborted_) return;
  aborted_ = true;
  aborted_why_ = why;
  if (running_) left_.wait_for(lock, kAbortGrace, [this] { return !running_; });
  AbortCommLocked();  // done already where the batch left in time
}

void DeviceRunner::AbortCommLocked() {
  if (comm_ == nullptr || comm_aborted_.load()) return;
  // Marked first: a call of the batch in NCCL returns while the abort runs, and what
  // it does next must leave the communicator alone (DeviceContext::CommAborted).
  comm_aborted_.store(true);
  Status ignored;
  DeviceGuard guard(device_, &ignored);
  Nccl()->CommAbort(comm_);  // never ncclCommDestroy: on a broken communicator it can hang
  PERSEUS_LOG(kDebug) << "GPU lane " << args_.index << " of set " << args_.set_id
                      << " aborted its NCCL communicator (the world failed)";
}


DeviceRunner::~DeviceRunner() { Close(); }

Status DeviceRunner::Execute(const Batch& batch, std::vector<Result>* results) {
  LaunchTurn turn(args_.turns.get(), batch.launch_turn, batch.launch_gated);  // passed on however this ends
  Status status;
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_) return aborted_why_;
    running_ = true;
  }
  if (mode_ == Mode::kClosed) status = Open();
  if (status.ok() && mode_ == Mode::kBroken) status = broken_;
  if (status.ok()) status = Run(batch, &turn, results);
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    running_ = false;
    if (aborted_) {  // the world failed meanwhile: whatever this batch did fails with it
      AbortCommLocked();
      status = aborted_why_;
    }
  }
  left_.notify_all();
  return status;
}

Status DeviceRunner::Open() {
  const GpuSettings& settings = args_.settings;
  if (!args_.thread_multiple)  // every rank of a job has the same thread level: no exchange
    return Status::Error(PERSEUS_UNSUPPORTED,
                         "GPU tensors need MPI initialized with MPI_THREAD_MULTIPLE (the device "
                         "lanes call MPI from their own threads)");
  // 1. What this rank can do.
  Status local = LoadCuda(settings.cuda_lib);
  int count = 0, device = 0;
  if (local.ok()) local = DeviceCount(&count);
  if (local.ok()) local = ChooseDevice(count, &device);
  if (local.ok()) {
    device_ = device;
    DeviceGuard guard(device, &local);
    if (local.ok())
      local = CudaStatus(Cuda()->StreamCreateWithFlags(&stream_, kStreamNonBlocking),
                         "cudaStreamCreateWithFlags");
  }
  Status nccl = settings.use_nccl && local.ok() ? LoadNccl(settings.nccl_lib) : Status::OK();
  // 2. What every rank can do, and so which path the set takes, the same on every rank
  // (PERSEUS_GPU_OPERATIONS itself is agreed at init: the config table marks it so).
  // Each rank's byte 0: whether it can use NCCL; then its GPU's identity (NCCL needs
  // one GPU per rank).
  std::vector<char> mine(1 + kDeviceIdentityBytes, 0);
  const bool can_nccl = settings.use_nccl && nccl.ok();  // (not loaded when `local` failed: agreed below)
  const bool can_share = can_nccl && Nccl() != nullptr && MultiRankGpu(Nccl()->version).yes;
  mine[0] = static_cast<char>((can_nccl ? kCanNccl : 0) | (can_share ? kCanShareGpu : 0));
  if (local.ok()) DeviceIdentity(*Cuda(), device_).copy(&mine[1], kDeviceIdentityBytes - 1);
  std::vector<char> all(mine.size() * args_.size);
  Status agreed;
  {
    auto mpi = LockMpi();
    agreed = MpiStatus(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, all.data(),
                                     static_cast<int>(mine.size()), MPI_CHAR, args_.comm),
                       "MPI_Allgather (GPU lane setup)");
    if (agreed.ok()) agreed = AgreeOnStatus(args_.comm, local);
  }
  if (!agreed.ok()) {
    DropStream();
    return agreed;
  }
  std::vector<int> lack_nccl;
  std::vector<std::string> identities;
  for (int r = 0; r < args_.size; ++r) {
    const char* theirs = &all[r * mine.size()];
    if (!(theirs[0] & kCanNccl)) lack_nccl.push_back((*args_.global_ranks)[r]);
    identities.emplace_back(theirs + 1);
  }
  if (!settings.use_nccl) {
    mode_ = Mode::kStaged;
    return Status::OK();
  }
  const std::vector<std::vector<int>> shared = SharedDevices(identities);
  if (lack_nccl.empty() && !shared.empty()) {
    std::vector<int> cannot;  // ranks on a shared GPU whose NCCL cannot share it
    for (const std::vector<int>& group : shared)
      for (int r : group)
        if (!(all[r * mine.size()] & kCanShareGpu)) cannot.push_back((*args_.global_ranks)[r]);
    static std::atomic<bool> told{false};  // every rank knows it: the set's rank 0 says it
    const bool tell = args_.rank == 0 && !told.exchange(true);
    std::vector<int> ranks;
    for (int r : shared[0]) ranks.push_back((*args_.global_ranks)[r]);
    if (cannot.empty()) {
      if (tell) {
        PERSEUS_LOG(kInfo) << "ranks " << ListString(ranks) << " share one GPU (" << identities[shared[0][0]]
                           << "): " << MultiRankGpu(Nccl()->version).why << ", so their GPU collectives use NCCL";
      }
    } else {
      if (tell) {
        const NcclChoice here = MultiRankGpu(nccl.ok() ? Nccl()->version : 0);
        PERSEUS_LOG(kWarning) << "ranks " << ListString(ranks) << " share one GPU (" << identities[shared[0][0]]
                              << ") and NCCL needs a GPU per rank here ("
                              << (here.yes ? "not so on rank(s) " + ListString(cannot) : here.why)
                              << "), so GPU collectives run host-staged through MPI instead (slower). Give each "
                                 "rank its own GPU (torch.cuda.set_device(hvd.local_rank())), or set "
                                 "PERSEUS_GPU_OPERATIONS=mpi to choose this mode without this warning";
      }
      mode_ = Mode::kStaged;
      return Status::OK();
    }
  }
  if (!lack_nccl.empty()) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      PERSEUS_LOG(kWarning) << "NCCL could not be loaded on rank(s) " << ListString(lack_nccl)
                            << (nccl.ok() ? "" : " (here: " + nccl.message + ")")
                            << "; GPU collectives run host-staged through MPI instead (slower)";
    }
    mode_ = Mode::kStaged;
    return Status::OK();
  }
  Status opened = OpenNccl();
  if (!opened.ok()) {
    DropStream();
    return opened;
  }
  PreparePacking(Context());  // before this lane's first NCCL kernel (cuda/memory/batched_copy.h)
  mode_ = Mode::kNccl;
  return Status::OK();
}

Status DeviceRunner::OpenNccl() {
  const NcclApi& nccl = *Nccl();
  ncclUniqueId id{};
  Status made = args_.rank == 0 ? NcclStatus(nccl.GetUniqueId(&id), "ncclGetUniqueId") : Status::OK();
  {
    auto mpi = LockMpi();
    PERSEUS_RETURN_IF_ERROR(AgreeOnStatus(args_.comm, made));
    PERSEUS_RETURN_IF_ERROR(MpiStatus(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, args_.comm),
                                      "MPI_Bcast (NCCL unique id)"));
  }
  // Collective over the set; no MPI lock held meanwhile. Where NCCL takes it per
  // communicator, launch order implicit: the launch order (cuda/context/launch_order.h) is
  // then the order the GPU starts kernels of different communicators in. Made
  // nonblocking where the job outlives a rank (cuda/nccl/nccl_comm.h) and published to
  // Abort at once, so that a peer that dies meanwhile cannot leave the lane inside the
  // creation for good.
  Status local;
  ncclComm_t new_comm = nullptr;
  bool world_failed = false;
  {
    DeviceGuard guard(device_, &local);
    NcclCommOptions options;
    options.launch_order_implicit = LaunchOrderPerCommunicator(nccl.version).yes;
    comm_name_ = "perseus set " + std::to_string(args_.set_id) + " lane " + std::to_string(args_.index);
    options.name = comm_name_.c_str();
    if (local.ok()) local = StartNcclComm(args_.size, id, args_.rank, options, &new_comm);
    {
      std::lock_guard<std::mutex> lock(abort_mu_);  // an abort from now on reaches it
      comm_ = new_comm;
    }
    if (local.ok())
      local = AwaitNcclComm(new_comm, &abort_mu_, [this] { return aborted_ ? aborted_why_ : Status::OK(); });
    std::lock_guard<std::mutex> lock(abort_mu_);
    world_failed = aborted_;
  }
  Status agreed = local;
  if (world_failed) {  // the creation was ended: no agreement to wait for
    agreed = aborted_why_;
  } else {
    if (!local.ok())
      local.message += " (PERSEUS_GPU_OPERATIONS=mpi runs GPU collectives host-staged through MPI, without NCCL)";
    auto mpi = LockMpi();
    agreed = AgreeOnStatus(args_.comm, local);
  }
  if (!agreed.ok()) {
    std::lock_guard<std::mutex> lock(abort_mu_);
    AbortCommLocked();  // half-made, or a peer failed: nothing to wait for
    comm_ = nullptr;
    comm_aborted_.store(false);
  }
  return agreed;
}

Status DeviceRunner::Run(const Batch& batch, LaunchTurn* turn, std::vector<Result>* results) {
  Status status;
  DeviceGuard guard(device_, &status);
  if (!status.ok()) return status;
  DeviceContext ctx = Context();
  if (comm_ != nullptr && !comm_aborted_.load()) {  // a peer's failure in an earlier batch may show here first
    ncclResult_t async = kNcclSuccess;
    status = ctx.Nc(ctx.nccl->CommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
    if (status.ok() && async != kNcclSuccess && async != kNcclInProgress)
      status = ctx.Nc(async, "NCCL (asynchronous error from an earlier batch)");
    if (!status.ok()) {
      Break(status);
      return broken_;
    }
  }
  // The lane's stream waits on the device for the inputs' producers.
  std::vector<const Entry*> producers;
  status = LastReadyPerStream(batch, &producers);
  for (const Entry* entry : producers) {
    if (!status.ok()) break;
    status = ctx.Cu(ctx.cuda.StreamWaitEvent(stream_, AsEvent(entry->ready_event), 0),
                    "cudaStreamWaitEvent (input ready)");
  }
  if (status.ok()) {
    const bool staged = mode_ == Mode::kStaged || !NcclServes(batch.items.front().meta);
    if (staged) {
      turn->Pass();  // no NCCL kernel: the next batch may launch at once
      status = RunStaged(batch, ctx, results);
    } else {
      ctx.turn = turn;  // taken around the NCCL calls (LaunchScope), passed however this ends
      status = RunNcclBatch(batch, ctx, results);
    }
    // A CUDA or NCCL call that failed mid-batch may leave the peers inside the
    // collective and this communicator out of step with theirs.
    if (!staged && status.code == PERSEUS_INTERNAL_ERROR) Break(status);
  }
  // Recorded even after a failure: work queued before it may still use the tensors.
  std::shared_ptr<void> done;
  Status recorded = AcquireEvent(device_, &done);
  if (recorded.ok())
    recorded = ctx.Cu(ctx.cuda.EventRecord(AsEvent(done), stream_), "cudaEventRecord (completion)");
  if (recorded.ok())
    for (size_t i = 0; i < batch.items.size(); ++i)
      if (batch.items[i].entry) (*results)[i].done_event = done;
  return status.ok() ? recorded : status;
}

void DeviceRunner::Break(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    AbortCommLocked();
    comm_ = nullptr;
    comm_aborted_.store(false);
  }
  mode_ = Mode::kBroken;
  broken_ = Status::Error(why.code, "GPU lane " + std::to_string(args_.index) +
                                        " stopped after a CUDA/NCCL failure and aborted its NCCL "
                                        "communicator; its later GPU work fails: " +
                                        why.message);
}

void DeviceRunner::Close() {
  if (stream_ == nullptr) return;
  Status status;
  DeviceGuard guard(device_, &status);
  // The batches every rank agreed on have been queued: let them finish (a peer's
  // NCCL failure ends the wait), then free everything.
  // An aborted communicator (the world failed) is gone already: its kernels ended.
  Status drained = DrainStream(Context());
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (drained.ok() && comm_ != nullptr && !comm_aborted_.load()) Nccl()->CommDestroy(comm_);
    else AbortCommLocked();
    comm_ = nullptr;
  }
  fusion_.Release(stream_);
  if (drained.ok()) host_.Release();  // else copies may still use it: leak rather than corrupt
  DropStream();
}

void DeviceRunner::DropStream() {
  if (stream_ != nullptr) {
    Status status;
    DeviceGuard guard(device_, &status);
    Cuda()->StreamDestroy(stream_);
  }
  stream_ = nullptr;
}

DeviceContext DeviceRunner::Context() {
  return DeviceContext{*Cuda(),
                       comm_ && !comm_aborted_.load() ? Nccl() : nullptr,
                       comm_aborted_.load() ? nullptr : comm_,
                       stream_,
                       device_,
                       args_.comm,
                       args_.rank,
                       args_.size,
                       args_.global_ranks,
                       args_.settings.chunk_bytes,
                       args_.settings.nan_check,
                       &fusion_,
                       &host_,
                       &scratch_,
                       nullptr,
                       &comm_aborted_};
}

}  // namespace gpu
}  // namespace perseus
