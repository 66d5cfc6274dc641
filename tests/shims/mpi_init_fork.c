/* An MPI_Init_thread that forks, for the fork-safety tests (tests/mpi/test_fork_during_init.py).
 * Preloaded (LD_PRELOAD), it stands in for the MPI's own, then calls the real one
 * (PMPI_Init_thread, found at call time: no MPI header or library needed here). It
 * models what Open MPI's singleton start does inside MPI_Init_thread, on any MPI:
 *
 *   PTEST_FORK_MARK=path     fork here; the child writes `path` and _exits, the
 *                            parent waits for it (a fork on the thread inside init()).
 *   PTEST_INIT_ENTERED=path  write `path` on entry, then
 *   PTEST_INIT_WAITS_FOR=path  wait (at most 20 s) until `path` exists: init() waits
 *                            for a process that another thread forks meanwhile.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void touch(const char* path) {
  int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
  if (fd >= 0) close(fd);
}

int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  const char* mark = getenv("PTEST_FORK_MARK");
  if (mark) {
    pid_t pid = fork();
    if (pid == 0) {
      touch(mark);
      _exit(0);
    }
    if (pid > 0) waitpid(pid, NULL, 0);
  }
  const char* entered = getenv("PTEST_INIT_ENTERED");
  if (entered) touch(entered);
  const char* awaited = getenv("PTEST_INIT_WAITS_FOR");
  for (int i = 0; awaited && i < 2000 && access(awaited, F_OK) != 0; ++i) {
    struct timespec ten_ms = {0, 10 * 1000 * 1000};
    nanosleep(&ten_ms, NULL);
  }
  int (*real)(int*, char***, int, int*) =
      (int (*)(int*, char***, int, int*))dlsym(RTLD_NEXT, "PMPI_Init_thread");
  return real(argc, argv, required, provided);
}
