// The C++ unit tests' checks: each failed Expect is printed and counted; Verdict() prints
// "ok", which the Python side (tests/support/cpp_build.py's callers) looks for, only when none failed.
#pragma once

#include <cstdio>
#include <string>

inline int failures = 0;

inline void Expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what.c_str());
    ++failures;
  }
}

inline int Verdict() {
  if (failures == 0) std::printf("ok\n");
  return failures == 0 ? 0 : 1;
}
