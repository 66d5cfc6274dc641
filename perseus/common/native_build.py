"""Builds a front end's small C++ library (the TensorFlow ops, the MXNet engine
bridge) once, on first use, and caches it.

The library is compiled with $CXX (else g++, C++17) against perseus.h and linked to
libperseus.so. The cache key covers the source, perseus.h and the whole compile
command, so a changed source, header or framework rebuilds and anything else loads
the cached file. Ranks started together may all get here at once: a file lock lets
one build while the others wait, and the library appears by an atomic rename.

Cache: $<cache_variable>, else $XDG_CACHE_HOME/perseus, else ~/.cache/perseus; a folder
of the user's that no one else may write (perseus.common.private_files), since a library
found there is loaded into the process.
"""

import fcntl
import hashlib
import os
import shlex
import subprocess
import sys

from perseus.common import library as _core
from perseus.common import private_files


class CachedBuild:
    """what: named in messages ("the Perseus TensorFlow ops"); source: the .cc file;
    include_dir: holds perseus/perseus.h; stem: the file name's start; flags: the
    framework's own compile and link flags."""

    def __init__(self, what, source, include_dir, cache_variable, stem, flags=()):
        self.what, self.source, self.include_dir = what, source, include_dir
        self.cache_variable, self.stem, self.flags = cache_variable, stem, list(flags)

    def _header(self):
        header = os.path.join(self.include_dir, "perseus", "perseus.h")
        if not os.path.exists(header):
            raise ImportError("cannot build %s: %s not found; reinstall Perseus"
                              % (self.what, header))
        return header

    def _command(self, output):
        compiler = shlex.split(os.environ.get("CXX", "g++"))
        core_dir = os.path.dirname(_core.LIBRARY_PATH)
        return (compiler + ["-shared", "-fPIC", "-O2", "-std=c++17", "-pthread", self.source,
                            "-o", output, "-I" + self.include_dir] + self.flags
                + ["-L" + core_dir, "-l:libperseus.so", "-Wl,-rpath," + core_dir])

    def path(self):
        """Where the library for this source, header and command lives (built or not)."""
        key = hashlib.sha256()
        # The header too: a changed perseus_request_t must never meet a stale library.
        for source in (self.source, self._header()):
            with open(source, "rb") as f:
                key.update(f.read())
        key.update(" ".join(self._command("")).encode())
        cache = os.environ.get(self.cache_variable) or private_files.cache_dir()
        return os.path.join(cache, "%s-%s.so" % (self.stem, key.hexdigest()[:16]))

    def ensure(self):
        """The library's path, compiling it first if no process has yet."""
        path = self.path()
        try:
            private_files.private_folder(os.path.dirname(path))
        except OSError as e:
            raise ImportError("cannot load %s: %s" % (self.what, e)) from e
        if not os.path.exists(path):
            print("perseus: building %s (once) into %s" % (self.what, path), file=sys.stderr)
            self._build(path)
        return path

    def _build(self, path):
        with open(path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(path):
                return
            tmp = "%s.%d.tmp" % (path, os.getpid())
            command = self._command(tmp)
            try:
                result = subprocess.run(command, capture_output=True, text=True)
            except OSError as e:
                raise ImportError("cannot build %s: could not run the C++ compiler %r (%s); "
                                  "install g++ or set CXX" % (self.what, command[0], e)) from e
            if result.returncode != 0:
                raise ImportError(
                    "cannot build %s. Command:\n  %s\nCompiler output (last lines):\n%s"
                    % (self.what, " ".join(shlex.quote(c) for c in command),
                       "\n".join(result.stderr.splitlines()[-30:])))
            os.replace(tmp, path)
