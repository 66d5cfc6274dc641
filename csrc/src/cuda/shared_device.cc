#include "cuda/shared_device.h"

#include <unistd.h>

#include <algorithm>
#include <map>

namespace perseus {
namespace gpu {

std::string DeviceIdentity(const CudaApi& cuda, int device) {
  char host[64] = {0};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  char bus[64] = {0};
  std::string where;
  if (cuda.DeviceGetPCIBusId != nullptr && cuda.DeviceGetPCIBusId(bus, sizeof bus - 1, device) == kCudaSuccess)
    where = bus;
  else
    where = "cuda:" + std::to_string(device);
  std::string identity = std::string(host) + "/" + where;
  if (identity.size() >= static_cast<size_t>(kDeviceIdentityBytes)) identity.resize(kDeviceIdentityBytes - 1);
  return identity;
}

std::vector<std::vector<int>> SharedDevices(const std::vector<std::string>& identities) {
  std::map<std::string, std::vector<int>> by_identity;
  for (int i = 0; i < static_cast<int>(identities.size()); ++i) by_identity[identities[i]].push_back(i);
  std::vector<std::vector<int>> shared;
  for (auto& entry : by_identity)
    if (entry.second.size() > 1) shared.push_back(entry.second);
  std::sort(shared.begin(), shared.end());  // by first index: each group is ascending
  return shared;
}

}  // namespace gpu
}  // namespace perseus
