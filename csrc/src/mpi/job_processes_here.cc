#include "mpi/job_processes_here.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

extern char** environ;

namespace perseus {

namespace {

// /proc/<pid>/stat of a process that runs (not a zombie): its parent and start time.
bool ReadStat(int pid, int* parent, unsigned long long* start) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const size_t name_end = text.rfind(')');  // the command name may hold spaces
  if (name_end == std::string::npos) return false;
  std::istringstream fields(text.substr(name_end + 1));
  std::string state, skip;
  fields >> state >> *parent;
  if (state.empty() || state == "Z" || state == "X" || state == "x") return false;
  for (int field = 5; field < 22 && fields >> skip;) ++field;  // fields 5..21
  return static_cast<bool>(fields >> *start);
}

// Whether `process` still runs: not ended, its pid not taken since by another.
bool StillRuns(const HostProcess& process) {
  int parent = 0;
  unsigned long long start = 0;
  return ReadStat(process.pid, &parent, &start) && start == process.start;
}

// This process's PMIx server, as the daemon told it ("PMIX_SERVER_URI41=..."), or "".
std::string PmixServerEntry() {
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry)
    if (std::strncmp(*entry, "PMIX_SERVER_URI", 15) == 0) return *entry;
  return std::string();
}

bool EnvironmentHolds(int pid, const std::string& entry) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string line;
  while (std::getline(file, line, '\0'))
    if (line == entry) return true;
  return false;
}

}  // namespace

std::vector<HostProcess> JobProcessesHere() {
  std::vector<HostProcess> found;
  const std::string server = PmixServerEntry();
  if (server.empty()) return found;
  const int self = getpid(), daemon = getppid();
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* entry = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || pid == self) continue;
    HostProcess process;
    int parent = 0;
    process.pid = static_cast<int>(pid);
    if (!ReadStat(process.pid, &parent, &process.start) || parent != daemon) continue;
    if (EnvironmentHolds(process.pid, server)) found.push_back(process);
  }
  closedir(proc);
  return found;
}

JobProcessesWatch::JobProcessesWatch(const std::vector<int>& pids) {
  for (int pid : pids) {
    if (pid == getpid()) continue;
    HostProcess process;
    process.pid = pid;
    int parent = 0;
    ReadStat(pid, &parent, &process.start);  // start 0 where it ended: Ended() names it
    seen_.push_back(process);
  }
}

std::string JobProcessesWatch::Ended() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string ended;
  for (const HostProcess& process : seen_) {
    if (StillRuns(process)) continue;
    ended += (ended.empty() ? "process " : ", ") + std::to_string(process.pid);
  }
  for (const HostProcess& process : JobProcessesHere()) {
    bool known = false;
    for (const HostProcess& seen : seen_) known = known || seen.pid == process.pid;
    if (!known) seen_.push_back(process);
  }
  if (!looked_) first_look_ = seen_.size();
  looked_ = true;
  return ended;
}

size_t JobProcessesWatch::Appeared() {
  std::lock_guard<std::mutex> lock(mu_);
  return looked_ ? seen_.size() - first_look_ : 0;
}

void JobProcessesWatch::EndAppeared() {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = looked_ ? first_look_ : seen_.size(); i < seen_.size(); ++i)
    if (StillRuns(seen_[i])) kill(seen_[i].pid, SIGKILL);
}

}  // namespace perseus
