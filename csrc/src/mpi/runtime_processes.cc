#include "mpi/runtime_processes.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>

#include "common/logging.h"

namespace perseus {

namespace {

// PMIx's C API, looked up in the PMIx library Open MPI already loaded: the core is
// built against any MPI and needs no PMIx headers. The types are PMIx's (standard ABI).
using PmixStatus = int;
using PmixReleaseFn = void (*)(void*);
using PmixInfoCallback = void (*)(PmixStatus, void* info, size_t ninfo, void* cbdata,
                                  PmixReleaseFn release, void* release_data);
using JobControlNb = PmixStatus (*)(const RuntimeProcess* targets, size_t ntargets,
                                    const void* directives, size_t ndirectives,
                                    PmixInfoCallback callback, void* cbdata);
using InfoCreate = void* (*)(size_t n);
using InfoLoad = PmixStatus (*)(void* info, const char* key, const void* data, uint16_t type);
using InfoFree = void (*)(void* info, size_t n);

constexpr uint16_t kPmixBool = 1;                        // PMIX_BOOL
constexpr const char* kJobControlKill = "pmix.jctrl.kill";  // PMIX_JOB_CTRL_KILL

struct Pmix {
  JobControlNb job_control_nb = nullptr;
  InfoCreate info_create = nullptr;
  InfoLoad info_load = nullptr;
  InfoFree info_free = nullptr;
};

// The PMIx library of this process, if MPI loaded one (RTLD_NOLOAD: never loads it).
const Pmix* LoadedPmix() {
  static const Pmix pmix = [] {
    Pmix found;
    void* library = dlopen("libpmix.so.2", RTLD_LAZY | RTLD_NOLOAD);
    if (library == nullptr) return found;
    found.job_control_nb = reinterpret_cast<JobControlNb>(dlsym(library, "PMIx_Job_control_nb"));
    found.info_create = reinterpret_cast<InfoCreate>(dlsym(library, "PMIx_Info_create"));
    found.info_load = reinterpret_cast<InfoLoad>(dlsym(library, "PMIx_Info_load"));
    found.info_free = reinterpret_cast<InfoFree>(dlsym(library, "PMIx_Info_free"));
    return found;
  }();
  const bool complete = pmix.job_control_nb && pmix.info_create && pmix.info_load &&
                        pmix.info_free;
  return complete ? &pmix : nullptr;
}

// What a request holds until PMIx answers (it reads the arrays after the call returns).
struct KillRequest {
  std::vector<RuntimeProcess> targets;
  void* directive = nullptr;
};

void KillAnswered(PmixStatus status, void*, size_t, void* cbdata, PmixReleaseFn release,
                  void* release_data) {
  auto* request = static_cast<KillRequest*>(cbdata);
  if (status != 0)
    PERSEUS_LOG(kWarning) << "Open MPI's runtime did not end the " << request->targets.size()
                          << " process(es) declared failed (PMIx status " << status << ")";
  LoadedPmix()->info_free(request->directive, 1);
  delete request;
  if (release != nullptr) release(release_data);
}

}  // namespace

std::vector<RuntimeProcess> GatherRuntimeProcesses(MPI_Comm world) {
  RuntimeProcess me{};
  const char* nspace = std::getenv("PMIX_NAMESPACE");
  const char* rank = std::getenv("PMIX_RANK");
  if (nspace != nullptr && rank != nullptr && std::strlen(nspace) < sizeof(me.nspace)) {
    std::strcpy(me.nspace, nspace);
    me.rank = static_cast<uint32_t>(std::strtoul(rank, nullptr, 10));
  }
  int size = 0;
  MPI_Comm_size(world, &size);
  std::vector<RuntimeProcess> all(size);
  if (MPI_Allgather(&me, sizeof(me), MPI_BYTE, all.data(), sizeof(me), MPI_BYTE, world) !=
      MPI_SUCCESS)
    return {};
  for (const auto& process : all)
    if (process.nspace[0] == '\0') return {};
  return all;
}

bool AskRuntimeToEnd(const std::vector<RuntimeProcess>& processes) {
  const Pmix* pmix = LoadedPmix();
  if (pmix == nullptr || processes.empty()) return false;
  auto* request = new KillRequest{processes, pmix->info_create(1)};
  const bool yes = true;
  if (request->directive == nullptr ||
      pmix->info_load(request->directive, kJobControlKill, &yes, kPmixBool) != 0 ||
      pmix->job_control_nb(request->targets.data(), request->targets.size(),
                           request->directive, 1, KillAnswered, request) != 0) {
    if (request->directive != nullptr) pmix->info_free(request->directive, 1);
    delete request;
    return false;
  }
  return true;
}

}  // namespace perseus
