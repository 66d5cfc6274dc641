// Ranks that drive the same GPU. NCCL refuses a communicator with two ranks on one
// device, so a device lane that finds such ranks in its set runs host-staged instead
// (cuda/device_runner.cc, which the device lane runs), with one warning, rather than
// failing in ncclCommInitRank.
#ifndef PERSEUS_CUDA_SHARED_DEVICE_H_
#define PERSEUS_CUDA_SHARED_DEVICE_H_

#include <string>
#include <vector>

#include "cuda/runtime/cuda_api.h"

namespace perseus {
namespace gpu {

// Room for one identity in the lanes' exchange (host name, '/', PCI bus id), NUL included.
constexpr int kDeviceIdentityBytes = 160;

// "host/0000:1b:00.0": this host's name and the device's PCI bus id, which names one
// GPU whatever CUDA_VISIBLE_DEVICES makes its ordinal; "host/cuda:N" where the runtime
// cannot say. Cut to kDeviceIdentityBytes - 1 bytes.
std::string DeviceIdentity(const CudaApi& cuda, int device);

// The groups of two or more indices of `identities` that are equal, in order of their
// first index; empty when every identity is different.
std::vector<std::vector<int>> SharedDevices(const std::vector<std::string>& identities);

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_SHARED_DEVICE_H_
