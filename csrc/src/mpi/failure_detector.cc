#include "mpi/failure_detector.h"

#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace perseus {
namespace {

constexpr double kOpenMpiDefaultPeriodS = 3.0;  // mpi_ft_detector_period's default

bool Enabled(const char* value) {
  std::string text = value == nullptr ? "" : value;
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text == "1" || text == "true" || text == "yes" || text == "on" || text == "enabled";
}

std::string Seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

// Leaked on purpose: a process may leave without running destructors in any order.
struct Pump {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread thread;
};
std::mutex g_pump_mu;
Pump* g_pump = nullptr;
std::string g_summary;  // written before MPI_Init, read after

// Open MPI's opal_progress runs its event loop, where the detector sends and checks its
// heartbeats, only at one call in 8 (a process-wide count: opal/runtime/opal_progress.c).
// One probe a beat sent a heartbeat every 4 s at best: with a 4 s detector a rank busy
// outside MPI was declared failed in 3 runs of 10 (mpi_ft_verbose: "MISSED my SEND
// deadline by 4.0e+00"). So each beat makes twice that many calls (the count is not
// atomic), each a microsecond or so when nothing matches.
constexpr int kProgressCallsPerBeat = 16;

void RunPump(Pump* pump, MPI_Comm self, double period_s) {
  const auto beat = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(period_s / 2));
  std::unique_lock<std::mutex> lock(pump->mu);
  while (!pump->cv.wait_for(lock, beat, [pump] { return pump->stop; })) {
    for (int i = 0; i < kProgressCallsPerBeat; ++i) {
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, self, &flag, MPI_STATUS_IGNORE);  // progress
    }
  }
  MPI_Comm_free(&self);
}

// ArmFailureDetector, saying what it did in `*why`.
double ArmDetector(double timeout_s, std::string* why) {
  const char* user = std::getenv("OMPI_MCA_mpi_ft_detector");
  if (user != nullptr) {
    if (!Enabled(user)) {
      *why = "Open MPI's heartbeat detector is off (OMPI_MCA_mpi_ft_detector=" +
             std::string(user) + "): a frozen rank alone on its host is not declared failed";
      return 0;
    }
    if (Enabled(std::getenv("OMPI_MCA_mpi_ft_detector_thread"))) {
      *why = "Open MPI's heartbeat detector runs in its own thread, as set "
             "(OMPI_MCA_mpi_ft_detector_thread; with Open MPI 5.0.11 MPI_Finalize may then "
             "not return)";
      return 0;
    }
    const char* period = std::getenv("OMPI_MCA_mpi_ft_detector_period");
    const double period_s = period != nullptr && std::atof(period) > 0 ? std::atof(period)
                                                                     : kOpenMpiDefaultPeriodS;
    *why = "Open MPI's heartbeat detector runs as set (OMPI_MCA_mpi_ft_detector), "
           "heartbeats every " + Seconds(period_s) + " s";
    return period_s;
  }
  if (!(timeout_s > 0)) {
    *why = "Open MPI's heartbeat detector is off (no stall shutdown time and no peer "
           "timeout): a frozen rank alone on its host is not declared failed";
    return 0;
  }
  timeout_s = std::max(timeout_s, kDetectorMinTimeoutS);
  // Open MPI wants the timeout above 3 periods; a quarter leaves room for a late beat.
  const double period_s = timeout_s / 4;
  setenv("OMPI_MCA_mpi_ft_detector", "true", 1);
  setenv("OMPI_MCA_mpi_ft_detector_thread", "false", 1);
  setenv("OMPI_MCA_mpi_ft_detector_period", Seconds(period_s).c_str(), 1);
  setenv("OMPI_MCA_mpi_ft_detector_timeout", Seconds(timeout_s).c_str(), 1);
  *why = "Open MPI's heartbeat detector declares a rank that is silent for " +
         Seconds(timeout_s) + " s failed";
  return period_s;
}

}  // namespace

double ArmFailureDetector(double timeout_s) { return ArmDetector(timeout_s, &g_summary); }

std::string FailureDetectorSummary() { return g_summary; }

void StartHeartbeatPump(double period_s) {
  if (!(period_s > 0)) return;
  std::lock_guard<std::mutex> lock(g_pump_mu);
  if (g_pump != nullptr) return;
  MPI_Comm self = MPI_COMM_NULL;
  if (MPI_Comm_dup(MPI_COMM_SELF, &self) != MPI_SUCCESS) return;
  MPI_Comm_set_errhandler(self, MPI_ERRORS_RETURN);
  g_pump = new Pump;
  g_pump->thread = std::thread(RunPump, g_pump, self, period_s);
}

void StopHeartbeatPump() {
  std::lock_guard<std::mutex> lock(g_pump_mu);
  if (g_pump == nullptr || !g_pump->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> stop(g_pump->mu);
    g_pump->stop = true;
  }
  g_pump->cv.notify_all();
  g_pump->thread.join();
}

}  // namespace perseus
