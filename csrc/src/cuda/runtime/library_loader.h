// Finding and opening a shared library at run time, reporting every attempt.
#ifndef PERSEUS_CUDA_LIBRARY_LOADER_H_
#define PERSEUS_CUDA_LIBRARY_LOADER_H_

#include <string>
#include <vector>

namespace perseus {
namespace gpu {

struct LibrarySpec {
  const char* what;                // "the CUDA runtime", for messages
  const char* variable;            // "PERSEUS_CUDA_LIB": the override, named in messages
  std::vector<std::string> names;  // file names (sonames), preferred first
  bool deep_bind = false;          // a file it opens binds its own symbols first (RTLD_DEEPBIND)
};

// Opens the library, in this order:
//   1. `configured` (the variable's value) if not empty: that file, or each name in
//      that directory. If nothing loads there, that is the answer: no fallback.
//   2. a copy already loaded into the process (dlopen RTLD_NOLOAD), so that Perseus
//      shares the framework's runtime;
//   (1, 3 and 4 open a file of their own: with spec.deep_bind, RTLD_DEEPBIND, so that
//   the library's calls to its own exported functions stay in it even where another
//   copy is global in the process)
//   3. each name in each of `dirs`;
//   4. each name through the system loader path (LD_LIBRARY_PATH, ld.so.cache, ...).
// Returns the dlopen handle and sets *path to the file loaded; or returns null and
// sets *error to a message naming every path tried and dlerror() for each.
void* OpenLibrary(const LibrarySpec& spec, const std::string& configured,
                  const std::vector<std::string>& dirs, std::string* path, std::string* error);

// Splits "a:b::c" into {"a", "b", "c"}.
std::vector<std::string> SplitDirs(const std::string& colon_separated);

}  // namespace gpu
}  // namespace perseus

#endif  // PERSEUS_CUDA_LIBRARY_LOADER_H_
