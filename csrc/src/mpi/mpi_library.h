// Whether the MPI library loaded in this process is the kind whose mpi.h libperseus
// was compiled with. A build that mixes them (MPICH's header, Open MPI's libmpi) hangs
// or crashes in its first MPI call, because handles such as MPI_COMM_WORLD mean
// different things to the two; this check runs first and says so instead.
#ifndef PERSEUS_MPI_MPI_LIBRARY_H_
#define PERSEUS_MPI_MPI_LIBRARY_H_

#include <string>

#include "common/status.h"

namespace perseus {

// The MPI whose mpi.h this library was compiled with, e.g. "MPICH 4.3.0", "Open MPI 4.1.4".
const char* HeaderMpi();

// The first line of MPI_Get_library_version() (callable before MPI_Init), followed
// by the file that provides it where the loader can say, e.g.
// "Open MPI v4.1.4, package: ... (/usr/lib/x86_64-linux-gnu/libmpi.so.40)".
std::string LoadedMpi();

// The whole of MPI_Get_library_version() (callable before MPI_Init); MPICH's names
// its configure options. Empty if the call fails.
std::string LibraryVersion();

// The file of the loaded libmpi, as the loader names it; empty where it cannot say.
std::string LibraryPath();

// OK when the loaded MPI can serve the header's ABI (the same implementation, or one
// of the MPICH ABI family for an MPICH header), or when either side is of a kind not
// known here; else PERSEUS_MPI_ERROR naming both and what to rebuild with. Never
// initialises MPI.
Status CheckMpiLibrary();

}  // namespace perseus

#endif  // PERSEUS_MPI_MPI_LIBRARY_H_
