#include "server/util/log.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gpucompute {
namespace {

struct LogState {
  absl::Mutex mu;
  LogFormat format ABSL_GUARDED_BY(mu) = LogFormat::kJson;
  LogSink sink ABSL_GUARDED_BY(mu);  // empty: stderr
};

// Never destroyed: threads may log while the process exits.
LogState& State() {
  static LogState& state = *new LogState;
  return state;
}

// The length of the valid UTF-8 sequence at the start of `s`, or 0 if it is not one
// (overlong forms, surrogates and code points above U+10FFFF are invalid).
size_t Utf8SequenceLength(absl::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  size_t n = 0;
  uint32_t cp = 0;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    if ((b(i) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i) & 0x3F);
  }
  if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
      (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
    return 0;
  }
  return n;
}

// `text` cut to kMaxLogValueBytes on a character boundary, with "..." when cut.
absl::string_view Bounded(absl::string_view text, bool* cut) {
  *cut = text.size() > kMaxLogValueBytes;
  if (!*cut) return text;
  size_t end = kMaxLogValueBytes;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

void AppendJsonString(std::string& out, absl::string_view text) {
  bool cut = false;
  out += '"';
  out += JsonEscape(Bounded(text, &cut));
  if (cut) out += "...";
  out += '"';
}

// Text lines: the value as is where it is safe to, else quoted as in JSON.
void AppendTextValue(std::string& out, absl::string_view text) {
  const bool plain = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return c > 0x20 && c < 0x7F && c != '"' && c != '\\' && c != '=';
  });
  if (plain && text.size() <= kMaxLogValueBytes) {
    out.append(text.data(), text.size());
  } else {
    AppendJsonString(out, text);
  }
}

absl::string_view LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

}  // namespace

std::string JsonEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const unsigned char c = static_cast<unsigned char>(text[0]);
    const size_t n = Utf8SequenceLength(text);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER, for one bad byte
      text.remove_prefix(1);
      continue;
    }
    if (n > 1) {
      out.append(text.data(), n);
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += absl::StrFormat("\\u%04x", static_cast<int>(c));
    } else {
      out += static_cast<char>(c);
    }
    text.remove_prefix(n);
  }
  return out;
}

std::string FormatLogLine(LogFormat format, absl::Time time, LogLevel level,
                          absl::string_view message, absl::Span<const LogField> fields) {
  const std::string stamp = absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", time, absl::UTCTimeZone());
  std::string out;
  if (format == LogFormat::kJson) {
    absl::StrAppend(&out, "{\"time\":\"", stamp, "\",\"level\":\"", LevelName(level),
                    "\",\"message\":");
    AppendJsonString(out, message);
    for (const auto& [key, value] : fields) {
      out += ',';
      AppendJsonString(out, key);
      out += ':';
      AppendJsonString(out, value);
    }
    out += '}';
    return out;
  }
  absl::StrAppend(&out, stamp, " ", LevelName(level), " ");
  bool cut = false;
  out += JsonEscape(Bounded(message, &cut));
  if (cut) out += "...";
  for (const auto& [key, value] : fields) {
    absl::StrAppend(&out, " ", JsonEscape(key), "=");
    AppendTextValue(out, value);
  }
  return out;
}

void SetLogFormat(LogFormat format) {
  LogState& state = State();
  absl::MutexLock lock(&state.mu);
  state.format = format;
}

void SetLogSink(LogSink sink) {
  LogState& state = State();
  absl::MutexLock lock(&state.mu);
  state.sink = std::move(sink);
}

void Log(LogLevel level, absl::string_view message, absl::Span<const LogField> fields) {
  LogState& state = State();
  absl::MutexLock lock(&state.mu);
  std::string line = FormatLogLine(state.format, absl::Now(), level, message, fields);
  if (state.sink) return state.sink(line);
  line += '\n';
  // One write per line, so that lines of several processes sharing stderr do not mix.
  const char* data = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, data, left);
    if (n <= 0) return;
    data += n;
    left -= static_cast<size_t>(n);
  }
}

RateLimitedLog::RateLimitedLog(double per_second, double burst, std::function<absl::Time()> now)
    : per_second_(per_second),
      burst_(std::max(burst, 1.0)),
      now_(now != nullptr ? std::move(now)
                          : std::function<absl::Time()>([] { return absl::Now(); })) {}

bool RateLimitedLog::Allow(absl::string_view key, uint64_t* suppressed) {
  const absl::Time now = now_();
  absl::MutexLock lock(&mu_);
  if (buckets_.size() >= kMaxKeys && !buckets_.contains(key)) {
    // Forget keys whose bucket has refilled: they hold nothing worth remembering.
    for (auto it = buckets_.begin(); it != buckets_.end();) {
      const Bucket& b = it->second;
      const bool full = b.tokens + absl::ToDoubleSeconds(now - b.last) * per_second_ >= burst_;
      if (b.suppressed == 0 && full) {
        buckets_.erase(it++);
      } else {
        ++it;
      }
    }
    if (buckets_.size() >= kMaxKeys) key = "other";
  }
  auto [it, inserted] = buckets_.try_emplace(key);
  Bucket& b = it->second;
  if (inserted) {
    b.tokens = burst_;
  } else {
    b.tokens = std::min(burst_, b.tokens + absl::ToDoubleSeconds(now - b.last) * per_second_);
  }
  b.last = now;
  if (b.tokens < 1) {
    ++b.suppressed;
    return false;
  }
  b.tokens -= 1;
  *suppressed = b.suppressed;
  b.suppressed = 0;
  return true;
}

bool RateLimitedLog::Log(absl::string_view key, LogLevel level, absl::string_view message,
                         absl::Span<const LogField> fields) {
  uint64_t suppressed = 0;
  if (!Allow(key, &suppressed)) return false;
  if (suppressed == 0) {
    gpucompute::Log(level, message, fields);
    return true;
  }
  // The fields, then how many lines of this key were dropped before this one.
  const std::string count = absl::StrCat(suppressed);
  std::vector<LogField> all(fields.begin(), fields.end());
  all.emplace_back("suppressed", count);
  gpucompute::Log(level, message, all);
  return true;
}

RateLimitedLog& ServerRateLimitedLog() {
  static RateLimitedLog& log = *new RateLimitedLog(5, 20);
  return log;
}

}  // namespace gpucompute
