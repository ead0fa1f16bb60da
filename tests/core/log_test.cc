// The log's line format, its JSON escaping and bounds, and the rate limiter.
#include "server/util/log.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace gpucompute {
namespace {

const absl::Time kNoon = absl::FromUnixSeconds(1795435200) + absl::Microseconds(123456);

TEST(JsonEscapeTest, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(JsonEscape("plain text"), "plain text");
  EXPECT_EQ(JsonEscape("say \"hi\""), "say \\\"hi\\\"");
  EXPECT_EQ(JsonEscape("a\\b"), "a\\\\b");
  EXPECT_EQ(JsonEscape("l1\nl2\r\t"), "l1\\nl2\\r\\t");
  EXPECT_EQ(JsonEscape(std::string("\x01\x1f\x7f", 3)), "\\u0001\\u001f\\u007f");
  EXPECT_EQ(JsonEscape(std::string("a\0b", 3)), "a\\u0000b");
}

TEST(JsonEscapeTest, KeepsValidUtf8AndReplacesInvalidBytes) {
  // é (2 bytes), € (3 bytes), 😀 (4 bytes) pass unchanged.
  EXPECT_EQ(JsonEscape("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"),
            "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
  const std::string kReplacement = "\xEF\xBF\xBD";
  EXPECT_EQ(JsonEscape("a\xFF"
                       "b"),
            "a" + kReplacement + "b");
  // A lone continuation byte, a truncated sequence, an overlong '/', a surrogate.
  EXPECT_EQ(JsonEscape("\x80"), kReplacement);
  EXPECT_EQ(JsonEscape("\xE2\x82"), kReplacement + kReplacement);
  EXPECT_EQ(JsonEscape("\xC0\xAF"), kReplacement + kReplacement);
  EXPECT_EQ(JsonEscape("\xED\xA0\x80"), kReplacement + kReplacement + kReplacement);
  EXPECT_EQ(JsonEscape("\xF4\x90\x80\x80"),  // above U+10FFFF
            kReplacement + kReplacement + kReplacement + kReplacement);
}

TEST(FormatLogLineTest, JsonLineHasTimeLevelMessageAndFields) {
  const LogField fields[] = {{"request_id", "req-1"}, {"code", "NOT_FOUND"}};
  EXPECT_EQ(FormatLogLine(LogFormat::kJson, kNoon, LogLevel::kWarning, "call \"refused\"", fields),
            "{\"time\":\"2026-11-23T12:00:00.123456Z\",\"level\":\"warning\",\"message\":\"call "
            "\\\"refused\\\"\",\"request_id\":\"req-1\",\"code\":\"NOT_FOUND\"}");
}

TEST(FormatLogLineTest, TextLineQuotesOnlyWhatNeedsIt) {
  const LogField fields[] = {{"request_id", "req-1"}, {"error", "no such buffer"}};
  EXPECT_EQ(FormatLogLine(LogFormat::kText, kNoon, LogLevel::kError, "call failed", fields),
            "2026-11-23T12:00:00.123456Z error call failed request_id=req-1 "
            "error=\"no such buffer\"");
}

TEST(FormatLogLineTest, LongValuesAreCutOnACharacterBoundary) {
  // 1023 ASCII bytes, then a 2-byte character that straddles the bound.
  const std::string value = std::string(kMaxLogValueBytes - 1, 'x') + "\xC3\xA9" + "tail";
  const LogField fields[] = {{"name", value}};
  const std::string line =
      FormatLogLine(LogFormat::kJson, kNoon, LogLevel::kInfo, std::string(5000, 'm'), fields);
  EXPECT_NE(line.find(absl::StrCat("\"message\":\"", std::string(kMaxLogValueBytes, 'm'), "...\"")),
            std::string::npos);
  EXPECT_NE(
      line.find(absl::StrCat("\"name\":\"", std::string(kMaxLogValueBytes - 1, 'x'), "...\"}")),
      std::string::npos)
      << line.substr(line.size() - 40);
  EXPECT_LT(line.size(), 2 * kMaxLogValueBytes + 200);
}

TEST(LogTest, SinkReceivesWholeLines) {
  std::vector<std::string> lines;
  SetLogSink([&](absl::string_view line) { lines.emplace_back(line); });
  SetLogFormat(LogFormat::kJson);
  Log(LogLevel::kInfo, "hello", {{"k", "v\n"}});
  SetLogSink(nullptr);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].find('\n'), std::string::npos);
  EXPECT_NE(lines[0].find("\"level\":\"info\",\"message\":\"hello\",\"k\":\"v\\n\"}"),
            std::string::npos)
      << lines[0];
}

class RateLimitedLogTest : public ::testing::Test {
 protected:
  absl::Time now_ = kNoon;
  RateLimitedLog limiter_{/*per_second=*/2, /*burst=*/3, [this] { return now_; }};
};

TEST_F(RateLimitedLogTest, AllowsABurstThenTheRateAndCountsWhatItDropped) {
  uint64_t suppressed = 99;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(limiter_.Allow("auth", &suppressed)) << i;
    EXPECT_EQ(suppressed, 0u);
  }
  for (int i = 0; i < 7; ++i) EXPECT_FALSE(limiter_.Allow("auth", &suppressed)) << i;
  // Another key has its own bucket.
  EXPECT_TRUE(limiter_.Allow("quota", &suppressed));
  EXPECT_EQ(suppressed, 0u);
  // Half a second refills one token (2 a second): one line, which reports the 7 dropped.
  now_ += absl::Milliseconds(500);
  EXPECT_TRUE(limiter_.Allow("auth", &suppressed));
  EXPECT_EQ(suppressed, 7u);
  EXPECT_FALSE(limiter_.Allow("auth", &suppressed));
  // A long quiet refills the bucket to its burst, no further.
  now_ += absl::Seconds(60);
  EXPECT_TRUE(limiter_.Allow("auth", &suppressed));
  EXPECT_EQ(suppressed, 1u);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(limiter_.Allow("auth", &suppressed)) << i;
  EXPECT_EQ(suppressed, 0u);
  EXPECT_FALSE(limiter_.Allow("auth", &suppressed));
}

TEST_F(RateLimitedLogTest, LogWritesTheSuppressedCount) {
  std::vector<std::string> lines;
  SetLogSink([&](absl::string_view line) { lines.emplace_back(line); });
  SetLogFormat(LogFormat::kJson);
  for (int i = 0; i < 5; ++i) limiter_.Log("k", LogLevel::kWarning, "refused", {{"n", "1"}});
  now_ += absl::Seconds(1);
  limiter_.Log("k", LogLevel::kWarning, "refused", {{"n", "2"}});
  SetLogSink(nullptr);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].find("suppressed"), std::string::npos);
  EXPECT_NE(lines[3].find("\"n\":\"2\",\"suppressed\":\"2\"}"), std::string::npos) << lines[3];
}

TEST_F(RateLimitedLogTest, InventedKeysShareOneBucketBeyondTheBound) {
  uint64_t suppressed = 0;
  for (size_t i = 0; i < RateLimitedLog::kMaxKeys; ++i) {
    // Each key spends its burst, so none can be forgotten yet.
    for (int j = 0; j < 4; ++j) limiter_.Allow(absl::StrCat("key", i), &suppressed);
  }
  // New keys now fall into the shared bucket "other": its burst, then nothing.
  int allowed = 0;
  for (int i = 0; i < 100; ++i) allowed += limiter_.Allow(absl::StrCat("new", i), &suppressed);
  EXPECT_EQ(allowed, 3);
  // Once the old buckets have refilled and reported, they are forgotten and room returns.
  now_ += absl::Seconds(60);
  for (size_t i = 0; i < RateLimitedLog::kMaxKeys; ++i) {
    limiter_.Allow(absl::StrCat("key", i), &suppressed);  // reports its dropped line
  }
  now_ += absl::Seconds(60);
  EXPECT_TRUE(limiter_.Allow("fresh", &suppressed));
  EXPECT_EQ(suppressed, 0u);
}

}  // namespace
}  // namespace gpucompute
