// Open MPI's heartbeat failure detector (ULFM), armed by the core in a fault-tolerant
// job so that a frozen process (SIGSTOP, stuck in the kernel) is declared failed like a
// dead one, even alone on its host, where no survivor can end it
// (docs/elastic.md, "A frozen rank").
//
// The detector runs in non-threaded mode: its heartbeats are sent and checked inside
// MPI's progress, so a process that makes no MPI call for its timeout is declared
// failed (and aborts when it calls MPI again). A live process must therefore progress
// MPI now and then whatever it does (the engine idles without MPI calls; the user's
// code may compute for minutes): the heartbeat pump, a thread that makes one local MPI
// call (MPI_Iprobe on a private copy of MPI_COMM_SELF) twice a period from MPI_Init to
// MPI_Finalize. Why not the detector's own thread (mpi_ft_detector_thread): with it,
// MPI_Finalize never returned here (Open MPI 5.0.11, every run: its finalize waits for
// a heartbeat that only the main thread's progress would receive).
#ifndef PERSEUS_MPI_FAILURE_DETECTOR_H_
#define PERSEUS_MPI_FAILURE_DETECTOR_H_

#include <string>

namespace perseus {

// The least timeout the core arms the detector with: a live rank whose heartbeats come
// late (a machine loaded far beyond its cores) is declared failed and aborts.
constexpr double kDetectorMinTimeoutS = 10.0;

// Before MPI_Init, in a fault-tolerant run (FaultTolerant()): arms the detector through
// Open MPI's environment with `timeout_s` (the stall shutdown time, else the peer
// timeout; at least kDetectorMinTimeoutS; none if 0) and a period of a quarter of it,
// unless the user set OMPI_MCA_mpi_ft_detector (then their settings stand). Returns
// the heartbeat period in seconds the pump must keep up with (0: no detector armed, or
// the user's runs in its own thread); FailureDetectorSummary() says what was done.
double ArmFailureDetector(double timeout_s);

// After MPI_Init (MPI_THREAD_MULTIPLE): starts the pump for a detector of period
// `period_s` (nothing if 0). StopHeartbeatPump before MPI_Finalize or exit; both are
// idempotent.
void StartHeartbeatPump(double period_s);
void StopHeartbeatPump();

// What ArmFailureDetector did in this process ("" before it ran), for init()'s word on
// fault tolerance.
std::string FailureDetectorSummary();

}  // namespace perseus

#endif  // PERSEUS_MPI_FAILURE_DETECTOR_H_
