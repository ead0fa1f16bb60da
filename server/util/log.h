// The server's log: one line per event on stderr (or an injected sink), either one JSON
// object per line (the default, for log collectors) or plain text for a terminal.
//
// A JSON line reads
//   {"time":"2026-11-23T15:04:05.123456Z","level":"error","message":"...","request_id":"...",...}
// with the time in RFC 3339 UTC, then the message, then the fields in the order given.
// Every string is escaped as JSON requires: quotes, backslashes and control characters
// become escapes, and bytes that are not valid UTF-8 become U+FFFD, so a line is always
// one valid JSON object whatever a client sent. Each field's value, and the message, are
// cut to kMaxLogValueBytes (then end in "...") so that no caller can make a line long.
//
// Logging is thread-safe: a line is written whole, with one write, under a mutex.
#ifndef GPUCOMPUTE_SERVER_UTIL_LOG_H_
#define GPUCOMPUTE_SERVER_UTIL_LOG_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace gpucompute {

enum class LogLevel { kInfo, kWarning, kError };
enum class LogFormat { kJson, kText };

// Longest message or field value written, in bytes, before "..." (longer ones are cut on
// a UTF-8 character boundary).
inline constexpr size_t kMaxLogValueBytes = 1024;

// One field of a line: a key (a fixed name such as "request_id", "method", "code") and its
// value. Numbers are given as text.
using LogField = std::pair<absl::string_view, absl::string_view>;

// Where lines go. Receives one line, without its newline.
using LogSink = std::function<void(absl::string_view line)>;

// Sets the format of every later line (flag --log-format). Default: kJson.
void SetLogFormat(LogFormat format);
// Sends every later line to `sink` instead of stderr; nullptr restores stderr. For tests.
void SetLogSink(LogSink sink);

// Writes one line.
void Log(LogLevel level, absl::string_view message, absl::Span<const LogField> fields = {});

// Formats a line as Log writes it, without writing it.
std::string FormatLogLine(LogFormat format, absl::Time time, LogLevel level,
                          absl::string_view message, absl::Span<const LogField> fields);

// `text` as the inside of a JSON string (no quotes): see the file comment.
std::string JsonEscape(absl::string_view text);

// Rate-limited logging, for events a client can cause at will (authentication failures,
// quota refusals, rejected requests): each event key (e.g. "auth_failed", or
// "rpc_error:/gpucompute.v1.BufferService/Upload:NOT_FOUND") has a token bucket of
// `burst` lines, refilled at `per_second` lines a second. A line beyond the bucket is not
// written but counted; the next line written for that key carries the field
// "suppressed" with how many were dropped since the last one written. Keys are kept for
// `burst / per_second` seconds after their last line at least; at most kMaxKeys keys are
// tracked, and beyond that all other keys share one bucket ("other"), so that a caller
// that invents keys cannot grow the table.
//
//   static RateLimitedLog& auth_log = *new RateLimitedLog(/*per_second=*/1, /*burst=*/5);
//   auth_log.Log("auth_failed", LogLevel::kWarning, "authentication failed",
//                {{"request_id", id}, {"peer", peer}});
//
// Thread-safe.
class RateLimitedLog {
 public:
  static constexpr size_t kMaxKeys = 1024;

  // `now` is the clock (tests inject one); defaults to absl::Now.
  RateLimitedLog(double per_second, double burst, std::function<absl::Time()> now = nullptr);

  // Writes the line unless `key`'s bucket is empty; true if it was written.
  bool Log(absl::string_view key, LogLevel level, absl::string_view message,
           absl::Span<const LogField> fields = {});

  // Takes a token for `key`: true and the count suppressed since the last allowed line,
  // or false (and the line is counted as suppressed). Log is Allow followed by ::Log.
  bool Allow(absl::string_view key, uint64_t* suppressed);

 private:
  struct Bucket {
    double tokens = 0;
    absl::Time last;
    uint64_t suppressed = 0;
  };
  const double per_second_;
  const double burst_;
  const std::function<absl::Time()> now_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

// The limiter the server's own rate-limited lines share (client errors of RPCs): 5 lines
// a second per key, bursts of 20. Others (authentication, quotas) may use it too.
RateLimitedLog& ServerRateLimitedLog();

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_UTIL_LOG_H_
