#include "common/logging.h"

#include <atomic>
#include <cstdio>

namespace perseus {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::atomic<int> g_rank{-1};
const char* const kLevelNames[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};
}  // namespace

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }
void SetLogRank(int rank) { g_rank = rank; }
bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

LogMessage::~LogMessage() {
  std::string text = stream_.str();
  std::fprintf(stderr, "[perseus %s rank %d] %s\n", kLevelNames[static_cast<int>(level_)],
               g_rank.load(), text.c_str());
  std::fflush(stderr);
}

}  // namespace perseus
