#include "server/metrics/exposition.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gpucompute::metrics {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  // The first bucket whose upper bound is >= value ("le" is inclusive).
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  absl::MutexLock lock(&mu_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot snapshot;
  snapshot.bounds = bounds_;
  absl::MutexLock lock(&mu_);
  snapshot.counts = counts_;
  snapshot.sum = sum_;
  snapshot.count = count_;
  return snapshot;
}

std::vector<double> DecadeBounds(int from_exponent, int to_exponent) {
  std::vector<double> bounds;
  for (int e = from_exponent; e <= to_exponent; ++e) {
    for (const char* mantissa : {"1", "2.5", "5"}) {
      if (e == to_exponent && mantissa[0] != '1') break;
      double bound = 0;
      if (absl::SimpleAtod(absl::StrCat(mantissa, "e", e), &bound)) bounds.push_back(bound);
    }
  }
  return bounds;
}

bool IsValidMetricName(absl::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok =
        absl::ascii_isalpha(c) || c == '_' || c == ':' || (i > 0 && absl::ascii_isdigit(c));
    if (!ok) return false;
  }
  return true;
}

bool IsValidLabelName(absl::string_view name) {
  if (name.empty() || absl::StartsWith(name, "__")) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = absl::ascii_isalpha(c) || c == '_' || (i > 0 && absl::ascii_isdigit(c));
    if (!ok) return false;
  }
  return true;
}

namespace {

std::string Escape(absl::string_view text, bool quotes) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// {a="x",b="y"} with `extra` appended (a histogram's le), or nothing when empty.
void AppendLabels(std::string& out, const Labels& labels,
                  const std::pair<std::string, std::string>* extra) {
  if (labels.empty() && extra == nullptr) return;
  out += '{';
  bool first = true;
  auto one = [&](const std::string& name, const std::string& value) {
    if (!first) out += ',';
    first = false;
    absl::StrAppend(&out, name, "=\"", EscapeLabelValue(value), "\"");
  };
  for (const auto& [name, value] : labels) one(name, value);
  if (extra != nullptr) one(extra->first, extra->second);
  out += '}';
}

void AppendLine(std::string& out, absl::string_view name, const Labels& labels, double value,
                const std::pair<std::string, std::string>* extra = nullptr) {
  absl::StrAppend(&out, name);
  AppendLabels(out, labels, extra);
  absl::StrAppend(&out, " ", FormatValue(value), "\n");
}

}  // namespace

std::string EscapeLabelValue(absl::string_view value) { return Escape(value, true); }
std::string EscapeHelp(absl::string_view help) { return Escape(help, false); }

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Counts and byte totals print as integers (general format would write 1.2e+10 for
  // 12 GB), other values in the %g style: 0.0001, 2.5e-05.
  if (value == std::trunc(value) && std::fabs(value) < 1e15)
    return absl::StrCat(static_cast<int64_t>(value));
  char buffer[32];
  const auto result =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::general);
  return std::string(buffer, result.ptr);
}

std::string Render(const std::vector<Family>& families) {
  std::string out;
  for (const Family& f : families) {
    absl::StrAppend(&out, "# HELP ", f.name, " ", EscapeHelp(f.help), "\n");
    absl::StrAppend(&out, "# TYPE ", f.name, " ", TypeName(f.type), "\n");
    for (const Sample& s : f.samples) AppendLine(out, f.name, s.labels, s.value);
    for (const HistogramSample& h : f.histograms) {
      const std::string bucket = absl::StrCat(f.name, "_bucket");
      uint64_t cumulative = 0;
      for (size_t i = 0; i < h.data.counts.size(); ++i) {
        cumulative += h.data.counts[i];
        const std::pair<std::string, std::string> le{
            "le", i < h.data.bounds.size() ? FormatValue(h.data.bounds[i]) : "+Inf"};
        AppendLine(out, bucket, h.labels, static_cast<double>(cumulative), &le);
      }
      AppendLine(out, absl::StrCat(f.name, "_sum"), h.labels, h.data.sum);
      AppendLine(out, absl::StrCat(f.name, "_count"), h.labels, static_cast<double>(h.data.count));
    }
  }
  return out;
}

}  // namespace gpucompute::metrics
