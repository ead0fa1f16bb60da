// Scraped metrics text parsed back into series and values, with the checks every scrape
// must pass, and a plain HTTP request to the metrics endpoint (civetweb's client).
#ifndef GPUCOMPUTE_TESTS_METRICS_METRICS_SCRAPE_H_
#define GPUCOMPUTE_TESTS_METRICS_METRICS_SCRAPE_H_

#include <civetweb.h>
#include <gtest/gtest.h>
#include <strings.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "server/metrics/exposition.h"

namespace gpucompute::testing {

// "name{labels}" -> value, and the HELP and TYPE lines by family.
struct Scrape {
  std::map<std::string, double> values;
  std::map<std::string, std::string> types;
  std::set<std::string> helps;

  double at(const std::string& series) const {
    auto it = values.find(series);
    if (it == values.end()) {
      ADD_FAILURE() << "no series " << series;
      return NAN;
    }
    return it->second;
  }
};

inline Scrape Parse(const std::string& text) {
  Scrape s;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "# HELP ")) {
      std::vector<std::string> f = absl::StrSplit(line.substr(7), absl::MaxSplits(' ', 1));
      s.helps.insert(f[0]);
      EXPECT_EQ(f.size(), 2u) << line;
      continue;
    }
    if (absl::StartsWith(line, "# TYPE ")) {
      std::vector<std::string> f = absl::StrSplit(line.substr(7), ' ');
      EXPECT_EQ(f.size(), 2u) << line;
      EXPECT_TRUE(metrics::IsValidMetricName(f[0])) << line;
      EXPECT_TRUE(s.types.emplace(f[0], f[1]).second) << "two TYPE lines for " << f[0];
      EXPECT_EQ(s.helps.count(f[0]), 1u) << "TYPE before HELP for " << f[0];
      continue;
    }
    const size_t space = line.rfind(' ');
    double value = 0;
    EXPECT_TRUE(absl::SimpleAtod(line.substr(space + 1), &value)) << line;
    EXPECT_TRUE(s.values.emplace(std::string(line.substr(0, space)), value).second)
        << "repeated: " << line;
  }
  return s;
}

// Every sample belongs to a family that has HELP and TYPE lines; counters end in
// _total; histograms' buckets are cumulative and end with +Inf equal to _count.
inline void ExpectWellFormed(const Scrape& s) {
  for (const auto& [series, value] : s.values) {
    std::string name = series.substr(0, series.find('{'));
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (absl::EndsWith(name, suffix) &&
          s.types.count(name.substr(0, name.size() - strlen(suffix))) != 0 &&
          s.types.at(name.substr(0, name.size() - strlen(suffix))) == "histogram") {
        family = name.substr(0, name.size() - strlen(suffix));
      }
    }
    ASSERT_EQ(s.types.count(family), 1u) << "no TYPE for " << series;
    if (s.types.at(family) == "counter") {
      EXPECT_TRUE(absl::EndsWith(family, "_total")) << family;
      EXPECT_GE(value, 0) << series;
    }
  }
  for (const auto& [family, type] : s.types) {
    if (type != "histogram") continue;
    // Bucket lines in text order are cumulative; check via the +Inf bucket and count.
    for (const auto& [series, value] : s.values) {
      if (!absl::StartsWith(series, family + "_count")) continue;
      const std::string labels = series.substr((family + "_count").size());  // "{...}" or ""
      const std::string inf =
          labels.empty()
              ? family + "_bucket{le=\"+Inf\"}"
              : family + "_bucket" + labels.substr(0, labels.size() - 1) + ",le=\"+Inf\"}";
      EXPECT_EQ(s.at(inf), value) << inf;
    }
  }
}

struct HttpResponse {
  int status = 0;
  std::string content_type;
  std::string body;
};

inline HttpResponse HttpRequest(int port, const std::string& method, const std::string& path) {
  HttpResponse out;
  char error[256] = {};
  mg_connection* conn =
      mg_download("127.0.0.1", port, 0, error, sizeof(error),
                  "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", method.c_str(),
                  path.c_str());
  if (conn == nullptr) {
    ADD_FAILURE() << "HTTP " << method << " " << path << ": " << error;
    return out;
  }
  const mg_response_info* info = mg_get_response_info(conn);
  out.status = info->status_code;
  for (int i = 0; i < info->num_headers; ++i) {
    if (strcasecmp(info->http_headers[i].name, "Content-Type") == 0)
      out.content_type = info->http_headers[i].value;
  }
  if (method != "HEAD") {
    char buffer[16384];
    for (int n; (n = mg_read(conn, buffer, sizeof(buffer))) > 0;) out.body.append(buffer, n);
  }
  mg_close_connection(conn);
  return out;
}

}  // namespace gpucompute::testing

#endif  // GPUCOMPUTE_TESTS_METRICS_METRICS_SCRAPE_H_
