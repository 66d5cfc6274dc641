// The grow's view of the job's processes on this host (csrc/src/mpi/job_processes_here.h)
// against real processes: this test stands in for the launcher's daemon, and its children
// for the job's processes (the same parent and PMIx server entry). A process that ended
// before the watch first looked is named only where the watch was told of it; the
// processes that start after the first look are counted and ended by EndAppeared.
// Run by tests/unit/test_cpp.py; prints "ok" or what went wrong.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "expect.h"
#include "mpi/job_processes_here.h"

using perseus::JobProcessesWatch;

namespace {

constexpr const char* kServer = "PMIX_SERVER_URI41";

pid_t Sleeper() {
  const pid_t pid = fork();
  if (pid == 0) {
    pause();
    _exit(0);
  }
  return pid;
}

// The watcher, a child like the job's processes: `old_rank` runs, `ended` ended before it
// looked; once told to (`go`), it looks again after the parent started one more
// process (`told`: its pid).
int Watch(pid_t old_rank, pid_t ended, int go, int told) {
  JobProcessesWatch seeded({old_rank, ended, getpid()});
  JobProcessesWatch blind;
  const std::string gone = "process " + std::to_string(ended);
  Expect(seeded.Ended() == gone, "the seeded watch names the ended process");
  Expect(blind.Ended().empty(), "a watch not told of it cannot see a process that ended before");
  Expect(seeded.Appeared() == 0 && blind.Appeared() == 0, "nothing appeared at the first look");
  char byte = 1;
  Expect(write(go, &byte, 1) == 1, "asks for a new process");
  pid_t started = 0;
  Expect(read(told, &started, sizeof(started)) == sizeof(started), "hears of the new process");
  Expect(seeded.Ended() == gone, "the new process runs");
  Expect(seeded.Appeared() == 1 && blind.Ended().empty() && blind.Appeared() == 1,
         "the new process appeared to both watches");
  seeded.EndAppeared();
  std::string named;
  const std::string both = gone + ", " + std::to_string(started);
  for (int tries = 0; tries < 200 && named != both; ++tries) {  // the kill takes a moment
    usleep(10000);
    named = seeded.Ended();
  }
  Expect(named == both, "EndAppeared ended the new process, not the old one: " + named);
  Expect(blind.Ended() == "process " + std::to_string(started), "the other watch sees it end too");
  return Verdict();
}

}  // namespace

int main(int argc, char** argv) {
  // The job's processes carry their PMIx server in the environment they started with
  // (/proc/<pid>/environ), so this test starts again with it there.
  if (std::getenv(kServer) == nullptr) {
    setenv(kServer, ("perseus-test-" + std::to_string(getpid())).c_str(), 1);
    execv("/proc/self/exe", argv);
    return 2;
  }
  (void)argc;
  const pid_t old_rank = Sleeper();
  const pid_t ended = fork();
  if (ended == 0) _exit(0);
  waitpid(ended, nullptr, 0);
  int go[2], told[2];
  if (pipe(go) != 0 || pipe(told) != 0) return 2;
  const pid_t watcher = fork();
  if (watcher == 0) {
    const int verdict = Watch(old_rank, ended, go[1], told[0]);
    std::fflush(stdout);  // _exit leaves buffers unwritten
    _exit(verdict);
  }
  char byte = 0;
  pid_t started = 0;
  if (read(go[0], &byte, 1) == 1) {
    started = Sleeper();
    if (write(told[1], &started, sizeof(started)) != sizeof(started)) return 2;
  }
  int status = 0;
  waitpid(watcher, &status, 0);
  kill(old_rank, SIGKILL);
  waitpid(old_rank, nullptr, 0);
  if (started > 0) {
    kill(started, SIGKILL);
    waitpid(started, nullptr, 0);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 3;
}
