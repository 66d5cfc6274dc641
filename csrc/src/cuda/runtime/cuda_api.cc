#include "cuda/runtime/cuda_api.h"

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "cuda/runtime/library_loader.h"

namespace perseus {
namespace gpu {

namespace {

// Oldest versions with everything the lanes call: cudaMallocAsync (CUDA 11.2);
// ncclAvg, ncclBfloat16 and ncclRedOpCreatePreMulSum (NCCL 2.11).
constexpr int kMinCudaRuntime = 11020;
constexpr int kMinNccl = 21100;

struct State {
  std::mutex mu;
  std::vector<std::string> dirs;
  std::string dirs_text;
  bool dirs_used = false;  // a load attempt has read them
  bool cuda_tried = false, nccl_tried = false, count_tried = false;
  Status cuda_status, nccl_status, count_status;
  int count = 0;
  CudaApi cuda{};
  NcclApi nccl{};
  std::atomic<const CudaApi*> cuda_ready{nullptr};
  std::atomic<const NcclApi*> nccl_ready{nullptr};
};

// Never destroyed: handles released from static destructors may still return events.
State& S() {
  static State* state = new State;
  return *state;
}

template <typename Fn>
void Bind(void* handle, const char* name, Fn* slot, std::string* missing) {
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + name;
  *slot = reinterpret_cast<Fn>(symbol);
}

// What older runtimes (or a stand-in) may lack: the pack kernel's loader (CUDA 12.0),
// batched copies (12.8; their arity follows the version), the PCI bus id. Missing
// ones stay null.
void BindOptional(void* h, int version, CudaApi* api) {
  std::string absent;  // not an error: the callers choose what there is
  Bind(h, "cudaDeviceGetPCIBusId", &api->DeviceGetPCIBusId, &absent);
  Bind(h, "cudaLibraryLoadData", &api->LibraryLoadData, &absent);
  Bind(h, "cudaLibraryGetKernel", &api->LibraryGetKernel, &absent);
  Bind(h, "cudaLibraryUnload", &api->LibraryUnload, &absent);
  Bind(h, "cudaLaunchKernel", &api->LaunchKernel, &absent);
  if (version >= 13000)
    Bind(h, "cudaMemcpyBatchAsync", &api->MemcpyBatchAsync13, &absent);
  else if (version >= 12080)
    Bind(h, "cudaMemcpyBatchAsync", &api->MemcpyBatchAsync12, &absent);
}

Status Unsupported(const std::string& message) {
  return Status::Error(PERSEUS_UNSUPPORTED, message);
}

Status OpenCuda(const std::string& configured, const std::vector<std::string>& dirs, CudaApi* api) {
  // Newest first: the framework's copy (already loaded) wins in any case.
  LibrarySpec spec{"the CUDA runtime",
                   "PERSEUS_CUDA_LIB",
                   {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"}};
  std::string path, error;
  void* h = OpenLibrary(spec, configured, dirs, &path, &error);
  if (h == nullptr) return Unsupported(error);
  std::string missing;
  Bind(h, "cudaRuntimeGetVersion", &api->RuntimeGetVersion, &missing);
  Bind(h, "cudaDriverGetVersion", &api->DriverGetVersion, &missing);
  Bind(h, "cudaGetDeviceCount", &api->GetDeviceCount, &missing);
  Bind(h, "cudaGetDevice", &api->GetDevice, &missing);
  Bind(h, "cudaSetDevice", &api->SetDevice, &missing);
  Bind(h, "cudaGetErrorString", &api->GetErrorString, &missing);
  Bind(h, "cudaGetLastError", &api->GetLastError, &missing);
  Bind(h, "cudaStreamCreateWithFlags", &api->StreamCreateWithFlags, &missing);
  Bind(h, "cudaStreamDestroy", &api->StreamDestroy, &missing);
  Bind(h, "cudaStreamSynchronize", &api->StreamSynchronize, &missing);
  Bind(h, "cudaStreamQuery", &api->StreamQuery, &missing);
  Bind(h, "cudaStreamWaitEvent", &api->StreamWaitEvent, &missing);
  Bind(h, "cudaEventCreateWithFlags", &api->EventCreateWithFlags, &missing);
  Bind(h, "cudaEventDestroy", &api->EventDestroy, &missing);
  Bind(h, "cudaEventRecord", &api->EventRecord, &missing);
  Bind(h, "cudaMalloc", &api->Malloc, &missing);
  Bind(h, "cudaFree", &api->Free, &missing);
  Bind(h, "cudaMallocAsync", &api->MallocAsync, &missing);
  Bind(h, "cudaFreeAsync", &api->FreeAsync, &missing);
  Bind(h, "cudaMallocHost", &api->MallocHost, &missing);
  Bind(h, "cudaFreeHost", &api->FreeHost, &missing);
  Bind(h, "cudaMemcpyAsync", &api->MemcpyAsync, &missing);
  Bind(h, "cudaMemsetAsync", &api->MemsetAsync, &missing);
  if (!missing.empty()) {
    dlclose(h);
    return Unsupported(path + " is not a usable CUDA runtime: it lacks " + missing);
  }
  int version = 0;
  if (api->RuntimeGetVersion(&version) != kCudaSuccess || version < kMinCudaRuntime) {
    dlclose(h);
    return Unsupported(path + " is CUDA runtime " + std::to_string(version / 1000) + "." +
                       std::to_string(version % 1000 / 10) + "; Perseus needs 11.2 or newer");
  }
  BindOptional(h, version, api);
  api->path = path;
  api->runtime_version = version;
  return Status::OK();
}

Status OpenNccl(const std::string& configured, const std::vector<std::string>& dirs, NcclApi* api) {
  LibrarySpec spec{"NCCL", "PERSEUS_NCCL_LIB", {"libnccl.so.2", "libnccl.so"}, /*deep_bind=*/true};
  std::string path, error;
  void* h = OpenLibrary(spec, configured, dirs, &path, &error);
  if (h == nullptr) return Unsupported(error);
  std::string missing;
  Bind(h, "ncclGetVersion", &api->GetVersion, &missing);
  Bind(h, "ncclGetUniqueId", &api->GetUniqueId, &missing);
  Bind(h, "ncclCommInitRank", &api->CommInitRank, &missing);
  Bind(h, "ncclCommDestroy", &api->CommDestroy, &missing);
  Bind(h, "ncclCommAbort", &api->CommAbort, &missing);
  Bind(h, "ncclCommGetAsyncError", &api->CommGetAsyncError, &missing);
  Bind(h, "ncclGetErrorString", &api->GetErrorString, &missing);
  Bind(h, "ncclRedOpCreatePreMulSum", &api->RedOpCreatePreMulSum, &missing);
  Bind(h, "ncclRedOpDestroy", &api->RedOpDestroy, &missing);
  Bind(h, "ncclAllReduce", &api->AllReduce, &missing);
  Bind(h, "ncclBroadcast", &api->Broadcast, &missing);
  Bind(h, "ncclReduce", &api->Reduce, &missing);
  Bind(h, "ncclAllGather", &api->AllGather, &missing);
  Bind(h, "ncclReduceScatter", &api->ReduceScatter, &missing);
  Bind(h, "ncclSend", &api->Send, &missing);
  Bind(h, "ncclRecv", &api->Recv, &missing);
  Bind(h, "ncclGroupStart", &api->GroupStart, &missing);
  Bind(h, "ncclGroupEnd", &api->GroupEnd, &missing);
  int version = 0;
  if (missing.empty() && api->GetVersion(&version) == kNcclSuccess && version < kMinNccl)
    missing = "a version of 2.11 or newer (it is " + NcclVersionString(version) + ")";
  if (!missing.empty()) {
    dlclose(h);
    return Unsupported(path + " is not a usable NCCL: it lacks " + missing);
  }
  std::string optional;  // ncclGetLastError only adds detail to messages
  Bind(h, "ncclGetLastError", &api->GetLastError, &optional);
  Bind(h, "ncclCommInitRankConfig", &api->CommInitRankConfig, &optional);
  api->path = path;
  api->version = version;
  return Status::OK();
}

}  // namespace

Status SetLibraryDirs(const std::string& colon_separated) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.dirs_used && colon_separated != s.dirs_text)
    return Status::Error(PERSEUS_INVALID_ARGUMENT,
                         "GPU library folders must be set before the CUDA runtime or NCCL is first "
                         "loaded; they were already loaded (or tried) with folders '" +
                             s.dirs_text + "'");
  s.dirs = SplitDirs(colon_separated);
  s.dirs_text = colon_separated;
  return Status::OK();
}

Status LoadCuda(const std::string& configured) {
  State& s = S();
  if (s.cuda_ready.load(std::memory_order_acquire)) return Status::OK();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.cuda_tried) {
    s.cuda_tried = s.dirs_used = true;
    s.cuda_status = OpenCuda(configured, s.dirs, &s.cuda);
    if (s.cuda_status.ok()) s.cuda_ready.store(&s.cuda, std::memory_order_release);
  }
  return s.cuda_status;
}

Status LoadNccl(const std::string& configured) {
  State& s = S();
  if (s.nccl_ready.load(std::memory_order_acquire)) return Status::OK();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.nccl_tried) {
    s.nccl_tried = s.dirs_used = true;
    s.nccl_status = OpenNccl(configured, s.dirs, &s.nccl);
    if (s.nccl_status.ok()) s.nccl_ready.store(&s.nccl, std::memory_order_release);
  }
  return s.nccl_status;
}

const CudaApi* Cuda() { return S().cuda_ready.load(std::memory_order_acquire); }
const NcclApi* Nccl() { return S().nccl_ready.load(std::memory_order_acquire); }

Status DeviceCount(int* count) {
  const CudaApi* cuda = Cuda();
  if (cuda == nullptr) return Unsupported("the CUDA runtime is not loaded");
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.count_tried) {
    s.count_tried = true;
    int n = 0;
    cudaError_t rc = cuda->GetDeviceCount(&n);
    if (rc != kCudaSuccess) {
      cuda->GetLastError();  // clear it, so that it is not reported by a later call
      s.count_status = Unsupported(std::string("no usable CUDA device: cudaGetDeviceCount failed: ") +
                                   cuda->GetErrorString(rc) + " (CUDA error " +
                                   std::to_string(rc) + ")");
    } else if (n == 0) {
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      s.count_status = Unsupported(std::string("no CUDA device is visible to this process") +
                                   (visible ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")"
                                            : ""));
    }
    s.count = n;
  }
  *count = s.count;
  return s.count_status;
}

NcclConfig MakeNcclConfig() {
  constexpr int kUndef = -2147483647 - 1;  // NCCL_CONFIG_UNDEF_INT
  NcclConfig c;
  c.size = sizeof c;
  c.magic = 0xcafebeef;  // NCCL_API_MAGIC
  c.version = 23100;     // the layout's: NCCL 2.31.0
  for (int* field : {&c.blocking, &c.cgaClusterSize, &c.minCTAs, &c.maxCTAs, &c.splitShare, &c.trafficClass,
                     &c.collnetEnable, &c.CTAPolicy, &c.shrinkShare, &c.nvlsCTAs, &c.nChannelsPerNetPeer,
                     &c.nvlinkCentricSched, &c.graphUsageMode, &c.numRmaCtx, &c.maxP2pPeers,
                     &c.graphStreamOrdering, &c.launchOrderImplicit, &c.numRmaSig, &c.rmaEagerInit,
                     &c.hostCftMode, &c.nvlsHostMode})
    *field = kUndef;
  c.netName = nullptr;
  c.commName = nullptr;
  return c;
}

std::string NcclVersionString(int code) {
  // Codes before 2.9 were MAJOR*1000 + MINOR*100 + PATCH; since, MAJOR*10000 + MINOR*100 + PATCH.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code % 10000 / 100 : code % 1000 / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

Status CudaStatus(cudaError_t rc, const char* what) {
  if (rc == kCudaSuccess) return Status::OK();
  const CudaApi* cuda = Cuda();
  return Status::Error(PERSEUS_INTERNAL_ERROR,
                       std::string(what) + " failed: " +
                           (cuda ? cuda->GetErrorString(rc) : "CUDA error") + " (CUDA error " +
                           std::to_string(rc) + ")");
}

Status NcclStatus(ncclResult_t rc, const char* what, ncclComm_t comm) {
  if (rc == kNcclSuccess) return Status::OK();
  const NcclApi* nccl = Nccl();
  std::string message = std::string(what) + " failed: " +
                        (nccl ? nccl->GetErrorString(rc) : "NCCL error") + " (NCCL error " +
                        std::to_string(rc) + ")";
  if (nccl && nccl->GetLastError) {
    const char* last = nccl->GetLastError(comm);
    if (last && last[0]) message += ": " + std::string(last);
  }
  return Status::Error(PERSEUS_INTERNAL_ERROR, message);
}

Status AwaitNcclAsync(ncclComm_t comm, const char* what, std::mutex* guard,
                      const std::function<Status()>& stop, std::chrono::microseconds nap) {
  const NcclApi* nccl = Nccl();
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    {
      std::unique_lock<std::mutex> lock;
      if (guard != nullptr) lock = std::unique_lock<std::mutex>(*guard);
      Status stopped = stop();
      if (!stopped.ok()) return stopped;
      ncclResult_t state = kNcclSuccess;
      Status asked = NcclStatus(nccl->CommGetAsyncError(comm, &state), "ncclCommGetAsyncError", comm);
      if (!asked.ok()) return asked;
      if (state != kNcclInProgress) return NcclStatus(state, what, comm);
    }
    // Spin briefly (a launch is queued within microseconds), then yield the core.
    if (std::chrono::steady_clock::now() - start > std::chrono::microseconds(200))
      std::this_thread::sleep_for(nap);
  }
}

Status NcclLaunched(ncclResult_t rc, const char* what, ncclComm_t comm, const std::atomic<bool>* aborted) {
  if (rc != kNcclInProgress || comm == nullptr) return NcclStatus(rc, what, comm);
  return AwaitNcclAsync(comm, what, nullptr, [aborted, what] {
    return aborted != nullptr && aborted->load()
               ? Status::Error(PERSEUS_INTERNAL_ERROR, std::string(what) + ": its communicator was aborted")
               : Status::OK();
  }, std::chrono::microseconds(50));
}

}  // namespace gpu
}  // namespace perseus
