// Leveled logging to stderr, prefixed with the rank. The level comes from the config table.
#ifndef PERSEUS_LOGGING_H_
#define PERSEUS_LOGGING_H_

#include <sstream>

namespace perseus {

enum class LogLevel { kTrace = 0, kDebug = 1, kInfo = 2, kWarning = 3, kError = 4, kFatal = 5 };

void SetLogLevel(LogLevel level);
void SetLogRank(int rank);
bool LogEnabled(LogLevel level);

// Accumulates one message and writes it in a single call when destroyed.
class LogMessage {
 public:
  explicit LogMessage(LogLevel level) : level_(level) {}
  ~LogMessage();
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace perseus

#define PERSEUS_LOG(level)                                          \
  if (!::perseus::LogEnabled(::perseus::LogLevel::level)) {         \
  } else                                                            \
    ::perseus::LogMessage(::perseus::LogLevel::level).stream()

#endif  // PERSEUS_LOGGING_H_
