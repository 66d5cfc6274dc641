#include "cuda/runtime/library_loader.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

namespace perseus {
namespace gpu {

namespace {

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

// The file a handle came from, as the dynamic loader resolved it.
std::string LoadedPath(void* handle, const std::string& fallback) {
  struct link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && map->l_name[0])
    return map->l_name;
  return fallback;
}

std::string Join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : separator) + p;
  return out;
}

}  // namespace

std::vector<std::string> SplitDirs(const std::string& colon_separated) {
  std::vector<std::string> dirs;
  std::string current;
  for (char c : colon_separated + ":") {
    if (c != ':') {
      current += c;
    } else if (!current.empty()) {
      dirs.push_back(current);
      current.clear();
    }
  }
  return dirs;
}

void* OpenLibrary(const LibrarySpec& spec, const std::string& configured,
                  const std::vector<std::string>& dirs, std::string* path, std::string* error) {
  std::vector<std::string> tried;
  auto attempt = [&](const std::string& file, const char* how) -> void* {
    dlerror();  // clear a stale message
    void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL | (spec.deep_bind ? RTLD_DEEPBIND : 0));
    if (handle) {
      // A path we named is the answer; a bare name is what the loader resolved it to.
      *path = file.find('/') != std::string::npos ? file : LoadedPath(handle, file);
      return handle;
    }
    const char* why = dlerror();
    tried.push_back(file + how + " (" + (why ? why : "unknown dlopen error") + ")");
    return nullptr;
  };

  if (!configured.empty()) {
    if (IsDirectory(configured)) {
      for (const std::string& name : spec.names)
        if (void* h = attempt(JoinPath(configured, name), "")) return h;
    } else if (void* h = attempt(configured, "")) {
      return h;
    }
    *error = std::string("could not load ") + spec.what + " from " + spec.variable + "=" +
             configured + "; tried: " + Join(tried, "; ");
    return nullptr;
  }
  for (const std::string& name : spec.names) {
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (handle) {
      *path = LoadedPath(handle, name);
      return handle;
    }
  }
  for (const std::string& dir : dirs)
    for (const std::string& name : spec.names)
      if (void* h = attempt(JoinPath(dir, name), "")) return h;
  for (const std::string& name : spec.names)
    if (void* h = attempt(name, " via the system loader path")) return h;
  *error = std::string("could not load ") + spec.what + " (none of " + Join(spec.names, ", ") +
           " was already loaded in the process); set " + spec.variable +
           " to the library file or its folder. Tried: " + Join(tried, "; ");
  dlerror();
  return nullptr;
}

}  // namespace gpu
}  // namespace perseus
