// Metric families and their rendering in the Prometheus text exposition format, version
// 0.0.4 (https://prometheus.io/docs/instrumenting/exposition_formats/). Families are
// built afresh at each scrape from the server's state; only histograms accumulate
// between scrapes, in Histogram.
#ifndef GPUCOMPUTE_SERVER_METRICS_EXPOSITION_H_
#define GPUCOMPUTE_SERVER_METRICS_EXPOSITION_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace gpucompute::metrics {

inline constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// (name, value) pairs, in the order they are written.
using Labels = std::vector<std::pair<std::string, std::string>>;

enum class MetricType { kCounter, kGauge, kHistogram };

// Observations counted into fixed buckets. Thread-safe.
class Histogram {
 public:
  struct Snapshot {
    std::vector<double> bounds;    // ascending upper bounds; +Inf is implied
    std::vector<uint64_t> counts;  // per bucket (not cumulative), bounds.size() + 1
    double sum = 0;
    uint64_t count = 0;
  };

  // `bounds` ascending and finite.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;  // read without the lock: never changes
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // bounds_.size() + 1
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

// 1, 2.5 and 5 times each power of ten from 10^from_exponent, up to 10^to_exponent:
// DecadeBounds(-3, 0) is 0.001 0.0025 0.005 0.01 ... 0.5 1. Each bound is the double
// nearest its decimal spelling, so that it prints as that spelling.
std::vector<double> DecadeBounds(int from_exponent, int to_exponent);

struct Sample {
  Labels labels;
  double value = 0;
};

struct HistogramSample {
  Labels labels;
  Histogram::Snapshot data;
};

struct Family {
  std::string name;  // counters end in _total
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<Sample> samples;              // counters and gauges
  std::vector<HistogramSample> histograms;  // histograms
};

// The families in the text format: each with its HELP and TYPE lines, histograms as
// cumulative _bucket series (le="+Inf" last, equal to _count), then _sum and _count.
std::string Render(const std::vector<Family>& families);

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool IsValidMetricName(absl::string_view name);
// [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__" (reserved).
bool IsValidLabelName(absl::string_view name);
// Label values escape backslash, double quote and newline; HELP text backslash and
// newline.
std::string EscapeLabelValue(absl::string_view value);
std::string EscapeHelp(absl::string_view help);
// Shortest text that reads back as the same double, integers without an exponent; NaN,
// +Inf and -Inf as Prometheus spells them.
std::string FormatValue(double value);

}  // namespace gpucompute::metrics

#endif  // GPUCOMPUTE_SERVER_METRICS_EXPOSITION_H_
