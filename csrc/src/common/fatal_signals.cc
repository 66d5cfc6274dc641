#include "common/fatal_signals.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <thread>

namespace perseus {

namespace {

struct Watched {
  int signo;
  const char* name;
  bool only_if_default;  // SIGTERM: a program's own handler (or Python's) comes first
};
const Watched kWatched[] = {{SIGSEGV, "SIGSEGV", false}, {SIGBUS, "SIGBUS", false},
                            {SIGFPE, "SIGFPE", false},   {SIGILL, "SIGILL", false},
                            {SIGABRT, "SIGABRT", false}, {SIGTERM, "SIGTERM", true}};
constexpr int kMaxSignal = 65;

struct sigaction g_previous[kMaxSignal];
int g_wake[2] = {-1, -1};  // handler -> reporter: the signal number
int g_done[2] = {-1, -1};  // reporter -> handler: reported
std::atomic<bool> g_dying{false};
pid_t g_owner = 0;  // a forked child inherits the handlers, not the reporter
void (*g_report)(int) = nullptr;

void OnFatalSignal(int signo) {
  // Only the first signal is reported; another (a second thread crashing, or the
  // reporter itself) goes straight to its previous action.
  if (getpid() == g_owner && !g_dying.exchange(true)) {
    const int saved_errno = errno;
    unsigned char byte = static_cast<unsigned char>(signo);
    if (write(g_wake[1], &byte, 1) == 1) {
      pollfd fd{g_done[0], POLLIN, 0};
      poll(&fd, 1, static_cast<int>(kFatalSignalWaitS * 1000));
    }
    errno = saved_errno;
  }
  sigaction(signo, &g_previous[signo], nullptr);
  raise(signo);  // pending until we return; a fault re-executes and meets the old action
}

void ReporterLoop() {
  unsigned char byte = 0;
  while (read(g_wake[0], &byte, 1) != 1) {
  }
  g_report(byte);
  const char done = 1;
  (void)!write(g_done[1], &done, 1);
}

}  // namespace

const char* FatalSignalName(int signo) {
  for (const Watched& w : kWatched)
    if (w.signo == signo) return w.name;
  static thread_local char text[24];
  std::snprintf(text, sizeof text, "signal %d", signo);
  return text;
}

void WatchFatalSignals(void (*report)(int signo)) {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  if (pipe(g_wake) != 0 || pipe(g_done) != 0) return;
  g_report = report;
  g_owner = getpid();
  std::thread(ReporterLoop).detach();
  for (const Watched& w : kWatched) {
    struct sigaction now {};
    if (sigaction(w.signo, nullptr, &now) != 0) continue;
    if (now.sa_handler == SIG_IGN) continue;  // ignored on purpose: leave it so
    if (w.only_if_default && ((now.sa_flags & SA_SIGINFO) || now.sa_handler != SIG_DFL)) continue;
    struct sigaction mine {};
    mine.sa_handler = OnFatalSignal;
    sigemptyset(&mine.sa_mask);
    mine.sa_flags = SA_NODEFER;  // raise() inside must not wait for the handler's end
    sigaction(w.signo, &mine, &g_previous[w.signo]);
  }
}

}  // namespace perseus
