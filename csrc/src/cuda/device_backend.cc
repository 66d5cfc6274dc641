// The enqueue-side hooks and the C ABI services of the GPU backend.
#include "cuda/device_backend.h"

#include <atomic>
#include <sstream>

#include "cuda/runtime/cuda_api.h"
#include "cuda/runtime/device_guard.h"
#include "cuda/runtime/event_pool.h"
#include "cuda/runtime/nccl_features.h"
#include "cuda/process_device.h"

namespace perseus {

namespace gpu {

namespace {
std::atomic<int> g_bound_device{-1};
}  // namespace

int BindDevice(int device) {
  int expected = -1;
  g_bound_device.compare_exchange_strong(expected, device);
  return g_bound_device.load();
}

int BoundDevice() { return g_bound_device.load(); }

}  // namespace gpu

using namespace gpu;

void WarmGpu(const GpuSettings& settings) {
  int count = 0;
  if (LoadCuda(settings.cuda_lib).ok()) DeviceCount(&count);  // the driver starts here, unlocked
}

bool CudaLoads(const GpuSettings& settings) { return LoadCuda(settings.cuda_lib).ok(); }

Status PrepareGpuEntry(Entry* entry, const GpuSettings& settings, ReadyEvents* call) {
  int count = 0;
  if (!LoadCuda(settings.cuda_lib).ok() || !DeviceCount(&count).ok())
    return Status::OK();  // no GPU here at all: the lane reports it on every rank
  const int device = entry->meta.device;
  auto who = [&] { return "request '" + entry->meta.name + "': "; };
  if (device >= count)
    return Status::Error(PERSEUS_INVALID_ARGUMENT,
                         who() + "device cuda:" + std::to_string(device) + " does not exist; " +
                             "this process sees " + std::to_string(count) + " CUDA device(s)");
  const int bound = BindDevice(device);
  if (bound != device)
    return Status::Error(PERSEUS_INVALID_ARGUMENT,
                         who() + "the tensor is on cuda:" + std::to_string(device) +
                             " but this process already uses cuda:" + std::to_string(bound) +
                             "; Perseus drives one GPU per process");
  for (const ReadyEvents::Recorded& r : call->recorded) {
    if (r.device == device && r.stream == entry->stream) {
      entry->ready_event = r.event;
      return Status::OK();
    }
  }
  Status status;
  DeviceGuard guard(device, &status);
  std::shared_ptr<void> event;
  if (status.ok()) status = AcquireEvent(device, &event);
  if (status.ok())
    status = CudaStatus(Cuda()->EventRecord(AsEvent(event), static_cast<cudaStream_t>(entry->stream)),
                        "cudaEventRecord on the request's stream");
  if (!status.ok()) return Status::Error(status.code, who() + status.message);
  call->recorded.push_back({device, entry->stream, event});
  entry->ready_event = std::move(event);
  return Status::OK();
}

Status PrepareDeviceMessage(int device, void* stream, const GpuSettings& settings,
                            std::shared_ptr<void>* ready) {
  const std::string fallback = "; send a CPU copy (tensor.cpu()) instead";
  if (!settings.use_nccl)
    return Status::Error(PERSEUS_UNSUPPORTED,
                         "point-to-point messages of GPU memory go over NCCL, which "
                         "PERSEUS_GPU_OPERATIONS=mpi turns off" + fallback);
  int count = 0;
  Status status = LoadCuda(settings.cuda_lib);
  if (status.ok()) status = DeviceCount(&count);
  if (status.ok()) status = LoadNccl(settings.nccl_lib);
  if (!status.ok())
    return Status::Error(PERSEUS_UNSUPPORTED, "point-to-point messages of GPU memory need CUDA and NCCL: " +
                                                  status.message + fallback);
  if (device >= count)
    return Status::Error(PERSEUS_INVALID_ARGUMENT, "device cuda:" + std::to_string(device) +
                                                       " does not exist; this process sees " +
                                                       std::to_string(count) + " CUDA device(s)");
  const int bound = BindDevice(device);
  if (bound != device)
    return Status::Error(PERSEUS_INVALID_ARGUMENT,
                         "the tensor is on cuda:" + std::to_string(device) + " but this process already uses cuda:" +
                             std::to_string(bound) + "; Perseus drives one GPU per process");
  DeviceGuard guard(device, &status);
  if (status.ok()) status = AcquireEvent(device, ready);
  if (status.ok())
    status = CudaStatus(Cuda()->EventRecord(AsEvent(*ready), static_cast<cudaStream_t>(stream)),
                        "cudaEventRecord on the message's stream");
  return status;
}

Status SetGpuLibraryDirs(const std::string& colon_separated) {
  return SetLibraryDirs(colon_separated);
}

Status LoadGpu(const GpuSettings& settings, bool* cuda_ok, bool* nccl_ok) {
  Status cuda = LoadCuda(settings.cuda_lib);
  Status nccl = LoadNccl(settings.nccl_lib);
  *cuda_ok = cuda.ok();
  *nccl_ok = nccl.ok();
  return cuda;
}

std::string DescribeGpu(const GpuSettings& settings) {
  std::ostringstream out;
  Status cuda = LoadCuda(settings.cuda_lib);
  if (cuda.ok()) {
    const CudaApi& api = *Cuda();
    int driver = 0, count = 0;
    api.DriverGetVersion(&driver);
    out << "CUDA runtime: " << api.path << " (runtime " << api.runtime_version / 1000 << "."
        << api.runtime_version % 1000 / 10 << ", driver ";
    if (driver > 0) {
      out << driver / 1000 << "." << driver % 1000 / 10;
    } else {
      out << "none installed";
    }
    Status devices = DeviceCount(&count);
    out << "); devices: ";
    if (devices.ok()) {
      out << count;
    } else {
      out << "none usable (" << devices.message << ")";
    }
    out << "\n";
  } else {
    out << "CUDA runtime: not loaded: " << cuda.message << "\n";
  }
  Status nccl = LoadNccl(settings.nccl_lib);
  if (nccl.ok()) {
    const int version = Nccl()->version;
    const NcclChoice shared = MultiRankGpu(version);
    out << "NCCL: " << Nccl()->path << " (version " << NcclVersionString(version) << ")\n"
        << "Ranks sharing a GPU: " << (shared.yes ? "use NCCL: " : "host-staged through MPI, with one warning: ")
        << shared.why << "\n"
        << "Launch order on the GPU: " << LaunchOrderPerCommunicator(version).why << "\n";
  } else {
    out << "NCCL: not loaded: " << nccl.message << "\n";
  }
  out << "GPU operations: " << (settings.use_nccl ? "nccl" : "mpi (host-staged)") << "\n";
  return out.str();
}

Status StreamWaitEvent(void* stream, const std::shared_ptr<void>& event) {
  if (!event) return Status::OK();
  const CudaApi* cuda = Cuda();
  if (cuda == nullptr) return Status::Error(PERSEUS_INTERNAL_ERROR, "the CUDA runtime is not loaded");
  return CudaStatus(cuda->StreamWaitEvent(static_cast<cudaStream_t>(stream), AsEvent(event), 0),
                    "cudaStreamWaitEvent");
}

Status FreeDeviceBuffer(void* data, void* stream) {
  if (data == nullptr) return Status::OK();
  const CudaApi* cuda = Cuda();
  if (cuda == nullptr)
    return Status::Error(PERSEUS_INVALID_ARGUMENT,
                         "perseus_free_device_buffer: the CUDA runtime is not loaded, so this "
                         "cannot be a device buffer of Perseus");
  return CudaStatus(cuda->FreeAsync(data, static_cast<cudaStream_t>(stream)), "cudaFreeAsync");
}

}  // namespace perseus
