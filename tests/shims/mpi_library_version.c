/* An MPI_Get_library_version that reports another MPI, for the mixed-build check
 * (tests/launch/test_mpi_library_check.py). Preloaded (LD_PRELOAD), it answers with
 * $PTEST_MPI_LIBRARY_VERSION, as the library of a mixed build (MPICH's mpi.h, Open
 * MPI's libmpi) would answer; every other MPI function stays the real one. */
#include <stdlib.h>
#include <string.h>

int MPI_Get_library_version(char* version, int* resultlen) {
  const char* text = getenv("PTEST_MPI_LIBRARY_VERSION");
  if (!text) text = "";
  size_t n = strlen(text);
  if (n > 255) n = 255; /* fits Open MPI's MPI_MAX_LIBRARY_VERSION_STRING too */
  memcpy(version, text, n);
  version[n] = '\0';
  *resultlen = (int)n;
  return 0;
}
