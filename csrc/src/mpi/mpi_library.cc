#include "mpi/mpi_library.h"

#include <dlfcn.h>
#include <mpi.h>

#include <vector>

#define PERSEUS_STR2(x) #x
#define PERSEUS_STR(x) PERSEUS_STR2(x)

namespace perseus {
namespace {

// Implementations that share an ABI: a library of the same family can serve the header.
enum class Abi { kUnknown, kMpich, kOpenMpi };

// Not MPI_MAX_LIBRARY_VERSION_STRING: in a mixed build that constant is the header's
// (Open MPI: 256) while the library writes up to its own (MPICH: 8192).
constexpr size_t kVersionBuffer = 16384;

Abi HeaderAbi() {
#if defined(OMPI_MAJOR_VERSION)
  return Abi::kOpenMpi;
#elif defined(MPICH_VERSION) || defined(I_MPI_VERSION) || defined(MVAPICH2_VERSION)
  // MPICH and the implementations of its ABI (Intel MPI, MVAPICH2, Cray MPICH): one
  // libmpi.so.12 interface, so a build against one runs on another.
  return Abi::kMpich;
#else
  return Abi::kUnknown;
#endif
}

// From the first line of MPI_Get_library_version(), which each implementation starts
// with its own name ("MPICH Version: ...", "Open MPI v4.1.4, ...", "Intel(R) MPI
// Library ...", "MVAPICH2 Version ...", "... CRAY MPICH version ...").
Abi LibraryAbi(const std::string& first_line) {
  if (first_line.find("Open MPI") != std::string::npos) return Abi::kOpenMpi;
  for (const char* name : {"MPICH", "MVAPICH", "Intel(R) MPI"})
    if (first_line.find(name) != std::string::npos) return Abi::kMpich;
  return Abi::kUnknown;
}

std::string LibraryFirstLine() {
  std::string line = LibraryVersion();
  line = line.substr(0, line.find('\n'));
  std::string tidy;  // "MPICH Version:\t5.0.2" -> "MPICH Version: 5.0.2"
  for (char c : line) {
    bool space = c == ' ' || c == '\t' || c == '\r';
    if (!space) tidy += c;
    else if (!tidy.empty() && tidy.back() != ' ') tidy += ' ';
  }
  while (!tidy.empty() && tidy.back() == ' ') tidy.pop_back();
  return tidy;
}

}  // namespace

std::string LibraryVersion() {
  std::vector<char> text(kVersionBuffer + 1, '\0');
  int length = 0;
  if (MPI_Get_library_version(text.data(), &length) != MPI_SUCCESS) return "";
  text.back() = '\0';
  return std::string(text.data());
}

std::string LibraryPath() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&MPI_Get_library_version), &info) && info.dli_fname)
    return info.dli_fname;
  return "";
}

const char* HeaderMpi() {
#if defined(I_MPI_VERSION)
  return "Intel MPI " I_MPI_VERSION;
#elif defined(MVAPICH2_VERSION)
  return "MVAPICH2 " MVAPICH2_VERSION;
#elif defined(MPICH_VERSION)
  return "MPICH " MPICH_VERSION;
#elif defined(OMPI_MAJOR_VERSION)
  return "Open MPI " PERSEUS_STR(OMPI_MAJOR_VERSION) "." PERSEUS_STR(OMPI_MINOR_VERSION) "." PERSEUS_STR(
      OMPI_RELEASE_VERSION);
#else
  return "an MPI of unknown kind (MPI " PERSEUS_STR(MPI_VERSION) "." PERSEUS_STR(MPI_SUBVERSION) ")";
#endif
}

std::string LoadedMpi() {
  std::string text = LibraryFirstLine();
  if (text.empty()) text = "an MPI whose MPI_Get_library_version failed";
  const std::string path = LibraryPath();
  if (!path.empty()) text += " (" + path + ")";
  return text;
}

Status CheckMpiLibrary() {
  Abi header = HeaderAbi();
  Abi library = LibraryAbi(LibraryFirstLine());
  if (header == Abi::kUnknown || library == Abi::kUnknown || header == library) return Status::OK();
  return Status::Error(
      PERSEUS_MPI_ERROR,
      std::string("libperseus was compiled with the mpi.h of ") + HeaderMpi() +
          ", but the MPI library loaded in this process is " + LoadedMpi() +
          ": the two are not compatible (MPI would hang or crash), so Perseus does not start "
          "MPI. Rebuild Perseus with the compiler wrapper of the MPI you run with, e.g. "
          "PERSEUS_MPICXX=/path/to/that/mpicxx pip install . (the build then links that "
          "MPI's libmpi), or run with the MPI it was built for");
}

}  // namespace perseus
