// The CUDA runtime and NCCL, loaded at run time with dlopen, so that one build of
// libperseus (compiled without any CUDA header) serves CPU-only and GPU machines.
//
// Only what the device lanes use is declared here, with the types, values and
// signatures documented in cuda_runtime_api.h / driver_types.h and nccl.h: handles
// are opaque pointers, enums are ints (C enums are int-sized), ncclUniqueId is its
// 128-byte struct. Everything else in csrc/ sees the GPU through cuda/device_backend.h.
#ifndef PERSEUS_CUDA_CUDA_API_H_
#define PERSEUS_CUDA_CUDA_API_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>

#include "common/status.h"

namespace perseus {
namespace gpu {

// ---- CUDA runtime --------------------------------------------------------------
using cudaError_t = int;
using cudaStream_t = struct CUstream_st*;
using cudaEvent_t = struct CUevent_st*;
using cudaLibrary_t = struct CUlib_st*;
using cudaKernel_t = struct CUkern_st*;
constexpr cudaError_t kCudaSuccess = 0;
constexpr cudaError_t kCudaErrorNotReady = 600;
enum MemcpyKind : int { kHostToDevice = 1, kDeviceToHost = 2, kDeviceToDevice = 3 };
constexpr unsigned kStreamNonBlocking = 0x01;   // cudaStreamNonBlocking
constexpr unsigned kEventDisableTiming = 0x02;  // cudaEventDisableTiming
struct Dim3 {  // dim3, passed by value
  unsigned x, y, z;
};
struct MemLocation {  // cudaMemLocation
  int type, id;
};
struct MemcpyAttributes {  // cudaMemcpyAttributes (the same in CUDA 12.8 and 13)
  int src_access_order;    // cudaMemcpySrcAccessOrder
  MemLocation src_loc_hint, dst_loc_hint;
  unsigned flags;
};
constexpr int kMemcpySrcAccessOrderStream = 1;  // sources read in stream order

struct CudaApi {
  cudaError_t (*RuntimeGetVersion)(int*);
  cudaError_t (*DriverGetVersion)(int*);
  cudaError_t (*GetDeviceCount)(int*);
  cudaError_t (*GetDevice)(int*);
  cudaError_t (*SetDevice)(int);
  const char* (*GetErrorString)(cudaError_t);
  cudaError_t (*GetLastError)();
  cudaError_t (*StreamCreateWithFlags)(cudaStream_t*, unsigned);
  cudaError_t (*StreamDestroy)(cudaStream_t);
  cudaError_t (*StreamSynchronize)(cudaStream_t);
  cudaError_t (*StreamQuery)(cudaStream_t);
  cudaError_t (*StreamWaitEvent)(cudaStream_t, cudaEvent_t, unsigned);
  cudaError_t (*EventCreateWithFlags)(cudaEvent_t*, unsigned);
  cudaError_t (*EventDestroy)(cudaEvent_t);
  cudaError_t (*EventRecord)(cudaEvent_t, cudaStream_t);
  cudaError_t (*Malloc)(void**, size_t);
  cudaError_t (*Free)(void*);
  cudaError_t (*MallocAsync)(void**, size_t, cudaStream_t);
  cudaError_t (*FreeAsync)(void*, cudaStream_t);
  cudaError_t (*MallocHost)(void**, size_t);
  cudaError_t (*FreeHost)(void*);
  cudaError_t (*MemcpyAsync)(void*, const void*, size_t, int /* MemcpyKind */, cudaStream_t);
  cudaError_t (*MemsetAsync)(void*, int, size_t, cudaStream_t);
  // Optional: null where the runtime lacks it (cuda/shared_device.h then names the
  // device by its ordinal).
  cudaError_t (*DeviceGetPCIBusId)(char* bus_id, int length, int device);
  // Optional: null where the runtime lacks them (cuda/memory/batched_copy.h then falls back).
  // CUDA 12.0: a kernel loaded from PTX text; a cudaKernel_t is launched as the `func`
  // of cudaLaunchKernel, cast to const void*.
  cudaError_t (*LibraryLoadData)(cudaLibrary_t*, const void* code, int* jit_options,
                                 void** jit_values, unsigned num_jit_options, int* library_options,
                                 void** library_values, unsigned num_library_options);
  cudaError_t (*LibraryGetKernel)(cudaKernel_t*, cudaLibrary_t, const char* name);
  cudaError_t (*LibraryUnload)(cudaLibrary_t);
  cudaError_t (*LaunchKernel)(const void* func, Dim3 grid, Dim3 block, void** args,
                              size_t shared_bytes, cudaStream_t);
  // cudaMemcpyBatchAsync: CUDA 12.8 and 12.9 have a failIdx argument, which CUDA 13
  // dropped. At most one of the two is set, after cudaRuntimeGetVersion.
  cudaError_t (*MemcpyBatchAsync12)(void* const* dsts, const void* const* srcs, const size_t* sizes,
                                    size_t count, MemcpyAttributes* attrs, size_t* attr_indices,
                                    size_t num_attrs, size_t* fail_index, cudaStream_t);
  cudaError_t (*MemcpyBatchAsync13)(void* const* dsts, const void* const* srcs, const size_t* sizes,
                                    size_t count, MemcpyAttributes* attrs, size_t* attr_indices,
                                    size_t num_attrs, cudaStream_t);

  std::string path;     // the file it came from
  int runtime_version;  // e.g. 12080 for 12.8
};

// ---- NCCL ---------------------------------------------------------------------
using ncclResult_t = int;
using ncclComm_t = struct ncclComm*;
using ncclDataType_t = int;
using ncclRedOp_t = int;
constexpr ncclResult_t kNcclSuccess = 0;
constexpr ncclResult_t kNcclInProgress = 7;
enum NcclDataType : int {
  kNcclInt8 = 0, kNcclUint8 = 1, kNcclInt32 = 2, kNcclUint32 = 3, kNcclInt64 = 4,
  kNcclUint64 = 5, kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclFloat64 = 8, kNcclBfloat16 = 9
};
enum NcclRedOp : int { kNcclSum = 0, kNcclProd = 1, kNcclMax = 2, kNcclMin = 3, kNcclAvg = 4 };
constexpr int kNcclScalarHostImmediate = 1;  // ncclScalarResidence_t
struct ncclUniqueId {
  char internal[128];  // NCCL_UNIQUE_ID_BYTES
};
// ncclConfig_t as NCCL 2.31 declares it (ncclConfig_v23100; later versions append). Its
// version field tells NCCL which fields there are. MakeNcclConfig fills it as
// NCCL_CONFIG_INITIALIZER does: every field undefined.
struct NcclConfig {
  size_t size;
  unsigned magic, version;
  int blocking, cgaClusterSize, minCTAs, maxCTAs;
  const char* netName;
  int splitShare, trafficClass;
  const char* commName;
  int collnetEnable, CTAPolicy, shrinkShare, nvlsCTAs, nChannelsPerNetPeer, nvlinkCentricSched,
      graphUsageMode, numRmaCtx, maxP2pPeers, graphStreamOrdering, launchOrderImplicit, numRmaSig,
      rmaEagerInit, hostCftMode, nvlsHostMode;
};
NcclConfig MakeNcclConfig();

struct NcclApi {
  ncclResult_t (*GetVersion)(int*);
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRank)(ncclComm_t*, int nranks, ncclUniqueId id, int rank);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*);
  const char* (*GetErrorString)(ncclResult_t);
  const char* (*GetLastError)(ncclComm_t);  // NCCL >= 2.13; null when absent
  ncclResult_t (*RedOpCreatePreMulSum)(ncclRedOp_t*, void* scalar, ncclDataType_t,
                                       int /* residence */, ncclComm_t);
  ncclResult_t (*RedOpDestroy)(ncclRedOp_t, ncclComm_t);
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int root, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*Reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int root,
                         ncclComm_t, cudaStream_t);
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                ncclComm_t, cudaStream_t);
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int peer, ncclComm_t, cudaStream_t);
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int peer, ncclComm_t, cudaStream_t);
  ncclResult_t (*GroupStart)();
  ncclResult_t (*GroupEnd)();
  // NCCL >= 2.14; null when absent (used from 2.31 on, for launchOrderImplicit).
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int nranks, ncclUniqueId id, int rank, NcclConfig*);

  std::string path;
  int version;  // NCCL_VERSION_CODE, e.g. 22305 for 2.23.5
};

// ---- loading --------------------------------------------------------------------
// Directories searched after PERSEUS_*_LIB and before the system loader path (the
// front end passes its framework's library folders). Refused with
// PERSEUS_INVALID_ARGUMENT once a library was loaded (or tried) with other
// directories; the same directories again are accepted.
Status SetLibraryDirs(const std::string& colon_separated);

// Load once per process; the outcome, failure included, is kept. NCCL opened from a
// file (not the copy a framework loaded already) binds its own calls to itself
// (RTLD_DEEPBIND): with torch's NCCL global in the process, its calls from inside to its
// exported functions would otherwise run torch's copy. `configured` is
// PERSEUS_CUDA_LIB / PERSEUS_NCCL_LIB (a file or a directory; empty when unset) and
// is used only by the first call. On failure: PERSEUS_UNSUPPORTED naming every path
// tried and why each failed.
Status LoadCuda(const std::string& configured);
Status LoadNccl(const std::string& configured);
// The tables once loaded, else null.
const CudaApi* Cuda();
const NcclApi* Nccl();

// The number of visible devices (cudaGetDeviceCount, which initialises the driver),
// asked once; an error when CUDA is not loaded, fails, or sees no device.
Status DeviceCount(int* count);

// "X.Y.Z" of an NCCL_VERSION_CODE.
std::string NcclVersionString(int code);

// CUDA or NCCL failures as Status (PERSEUS_INTERNAL_ERROR), naming the call.
Status CudaStatus(cudaError_t rc, const char* what);
Status NcclStatus(ncclResult_t rc, const char* what, ncclComm_t comm = nullptr);
// Polls ncclCommGetAsyncError on `comm` until it leaves ncclInProgress: OK or the
// operation's error (named `what`), or the error `stop` returns first. `stop` and each
// poll run under `*guard` where one is given (an abort taken under that lock never meets
// a poll); after a short spin the poll naps `nap` between tries.
Status AwaitNcclAsync(ncclComm_t comm, const char* what, std::mutex* guard,
                      const std::function<Status()>& stop, std::chrono::microseconds nap);
// What a launch on `comm` returned (a call outside a group, ncclGroupEnd). On a
// nonblocking communicator (cuda/nccl/nccl_comm.h) NCCL may answer ncclInProgress, and the
// launch is queued only once ncclCommGetAsyncError says ncclSuccess: this polls until
// then (or the launch's error). `aborted` set meanwhile (DeviceRunner::Abort, the pair's
// abort) ends the wait with an error: the communicator is gone.
Status NcclLaunched(ncclResult_t rc, const char* what, ncclComm_t comm,
                    const std::atomic<bool>* aborted = nullptr);

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_CUDA_API_H_
