// The GPU backend as the rest of the core sees it (lanes/ and the C ABI): no
// CUDA or NCCL type crosses this header. CUDA and NCCL are loaded at run time
// (cuda/runtime/cuda_api.h); a build without them serves GPU requests all the same.
#ifndef PERSEUS_CUDA_DEVICE_BACKEND_H_
#define PERSEUS_CUDA_DEVICE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/request.h"

namespace perseus {

// The configuration the GPU path reads (from the config table).
struct GpuSettings {
  std::string cuda_lib;  // PERSEUS_CUDA_LIB: a file or a folder; empty = search
  std::string nccl_lib;  // PERSEUS_NCCL_LIB
  bool use_nccl = true;  // PERSEUS_GPU_OPERATIONS=nccl; false = host-staged through MPI
  bool nan_check = false;
  int64_t chunk_bytes = 4ll << 20;
};

// ---- enqueue (the framework's thread) ----------------------------------------
// Loads the CUDA runtime and asks the device count if not yet (both may take a
// while the first time: call outside engine locks; the outcomes are kept).
void WarmGpu(const GpuSettings& settings);
// Whether a CUDA runtime loads here (tried once; the outcome is kept).
bool CudaLoads(const GpuSettings& settings);
// For a GPU request: makes its device current for the call, records a pooled event
// on its stream (entry->stream; NULL = the legacy default stream) into
// entry->ready_event, or reuses the one `call` recorded there already (ReadyEvents,
// common/request.h), and restores the caller's device. When no GPU can be used at
// all (runtime missing, no device) it returns OK with no event: the device lane then
// fails the batch on every rank, naming the cause, instead of this rank failing alone
// while its peers wait. Errors it returns belong to this request only (a device that
// does not exist, a second device in one process, a failing cudaEventRecord).
Status PrepareGpuEntry(Entry* entry, const GpuSettings& settings, ReadyEvents* call);

// For a device point-to-point message, on the framework's thread: checks that NCCL can
// carry it here (GPU operations over NCCL, which loads), binds `device` as a GPU request
// does (one GPU per process), and records a pooled event on `stream` (NULL = legacy
// default) into *ready, which the message's NCCL call waits for.
Status PrepareDeviceMessage(int device, void* stream, const GpuSettings& settings,
                            std::shared_ptr<void>* ready);

// ---- the C ABI (perseus.h) -------------------------------------------------------
Status SetGpuLibraryDirs(const std::string& colon_separated);
// Loads both libraries now. OK when the CUDA runtime loaded; the flags say which did.
Status LoadGpu(const GpuSettings& settings, bool* cuda_ok, bool* nccl_ok);
// Each library's path and version, the device count, or why loading failed.
std::string DescribeGpu(const GpuSettings& settings);
// Makes `stream` (a cudaStream_t; NULL = legacy default) wait for `event` on the device.
Status StreamWaitEvent(void* stream, const std::shared_ptr<void>& event);
// cudaFreeAsync(data, stream).
Status FreeDeviceBuffer(void* data, void* stream);

}  // namespace perseus

#endif  // PERSEUS_CUDA_DEVICE_BACKEND_H_
