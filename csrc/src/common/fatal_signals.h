// Lets a process that is about to die of a signal tell its peers first.
//
// A handler may do almost nothing (no locks, no MPI), so it only wakes a helper thread,
// which runs `report` (for Perseus: announce the end to the other ranks, bounded), and
// waits for it at most kFatalSignalWaitS; then the signal's previous action runs as if
// we had never been there (the default: the process dies of it, its exit status intact).
#ifndef PERSEUS_FATAL_SIGNALS_H_
#define PERSEUS_FATAL_SIGNALS_H_

namespace perseus {

// Longest a dying thread waits for `report`, in seconds.
constexpr double kFatalSignalWaitS = 3.0;

// Installs the handlers once per process (later calls do nothing): SIGSEGV, SIGBUS,
// SIGFPE, SIGILL and SIGABRT always (chained to what was there, e.g. Python's
// faulthandler), SIGTERM only while nobody else handles it.
void WatchFatalSignals(void (*report)(int signo));

// "SIGSEGV" and the like for the signals above; "signal N" for any other.
const char* FatalSignalName(int signo);

}  // namespace perseus

#endif  // PERSEUS_FATAL_SIGNALS_H_
