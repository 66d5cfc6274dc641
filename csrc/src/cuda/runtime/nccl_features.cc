#include "cuda/runtime/nccl_features.h"

#include <cstdlib>
#include <cstring>

#include "cuda/runtime/cuda_api.h"

namespace perseus {
namespace gpu {

namespace {

const char* Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? value : nullptr;
}

std::string Version(int code) { return "NCCL " + NcclVersionString(code); }

}  // namespace

NcclChoice MultiRankGpu(int nccl_version) {
  if (nccl_version < kNcclMultiRankGpu)
    return {false, Version(nccl_version) + " refuses several ranks on one GPU (NCCL 2.30 or later does, with "
                                           "NCCL_MULTI_RANK_GPU_ENABLE=1)"};
  const char* enabled = Env("NCCL_MULTI_RANK_GPU_ENABLE");
  if (enabled == nullptr || std::strcmp(enabled, "1") != 0)
    return {false, std::string("NCCL_MULTI_RANK_GPU_ENABLE is ") + (enabled ? enabled : "not set") + ", not 1 (" +
                       Version(nccl_version) + " runs several ranks on one GPU when it is 1)"};
  const char* nvls = Env("NCCL_NVLS_ENABLE");
  if (nvls != nullptr && std::strcmp(nvls, "1") == 0)
    return {false, "NCCL_NVLS_ENABLE=1 cannot go with NCCL_MULTI_RANK_GPU_ENABLE=1 (an NCCL error)"};
  return {true, Version(nccl_version) + " with NCCL_MULTI_RANK_GPU_ENABLE=1 runs several ranks on one GPU"};
}

NcclChoice LaunchOrderPerCommunicator(int nccl_version) {
  const char* env = Env("NCCL_LAUNCH_ORDER_IMPLICIT");
  if (nccl_version >= kNcclLaunchOrderConfig) {
    if (env != nullptr)
      return {false, std::string("NCCL_LAUNCH_ORDER_IMPLICIT=") + env +
                         " in the environment decides, for every NCCL communicator of the process"};
    return {true, "per communicator: Perseus's are made with launchOrderImplicit=1 (" + Version(nccl_version) +
                      "); other NCCL communicators in the process keep their own setting"};
  }
  if (nccl_version >= kNcclLaunchOrderEnv)
    return {false, env != nullptr ? std::string("NCCL_LAUNCH_ORDER_IMPLICIT=") + env +
                                        " in the environment decides, for every NCCL communicator of the process"
                                  : "the launch order only: " + Version(nccl_version) +
                                        " takes launch order implicit from NCCL_LAUNCH_ORDER_IMPLICIT=1 alone, "
                                        "which would apply to every NCCL communicator of the process (torch's "
                                        "too), so Perseus leaves it to you"};
  return {false, "the launch order only: " + Version(nccl_version) + " has no launch order implicit (2.26 or later)"};
}

}  // namespace gpu
}  // namespace perseus
