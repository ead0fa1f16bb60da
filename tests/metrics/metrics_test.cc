// Metrics: the exposition text itself, NVML loaded from a stand-in library, and the
// series ServerMetrics reads from the executor (as its observer), the registry and the
// backend. metrics_server_test.cc scrapes a real server over HTTP.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/cpu/cpu_backend.h"
#include "server/metrics/exposition.h"
#include "server/metrics/nvml.h"
#include "server/metrics/server_metrics.h"
#include "tests/metrics/metrics_scrape.h"

namespace gpucompute {
namespace {

using metrics::Family;
using metrics::Histogram;
using metrics::MetricType;
using testing::ExpectWellFormed;
using testing::Parse;
using testing::Scrape;

// ---- The exposition text.

TEST(ExpositionTest, RendersEachTypeWithHelpAndType) {
  Histogram h({0.5, 1, 2.5});
  for (double v : {0.1, 0.5, 0.7, 1.0, 3.0, 10.0}) h.Observe(v);
  std::vector<Family> families;
  families.push_back({"x_requests_total",
                      "Requests.",
                      MetricType::kCounter,
                      {{{{"code", "200"}}, 3}, {{{"code", "500"}}, 0}},
                      {}});
  families.push_back({"x_temperature_celsius", "Heat.", MetricType::kGauge, {{{}, -1.5}}, {}});
  families.push_back(
      {"x_latency_seconds", "Latency.", MetricType::kHistogram, {}, {{{{"op", "a"}}, h.Read()}}});
  EXPECT_EQ(metrics::Render(families),
            "# HELP x_requests_total Requests.\n"
            "# TYPE x_requests_total counter\n"
            "x_requests_total{code=\"200\"} 3\n"
            "x_requests_total{code=\"500\"} 0\n"
            "# HELP x_temperature_celsius Heat.\n"
            "# TYPE x_temperature_celsius gauge\n"
            "x_temperature_celsius -1.5\n"
            "# HELP x_latency_seconds Latency.\n"
            "# TYPE x_latency_seconds histogram\n"
            "x_latency_seconds_bucket{op=\"a\",le=\"0.5\"} 2\n"
            "x_latency_seconds_bucket{op=\"a\",le=\"1\"} 4\n"
            "x_latency_seconds_bucket{op=\"a\",le=\"2.5\"} 4\n"
            "x_latency_seconds_bucket{op=\"a\",le=\"+Inf\"} 6\n"
            "x_latency_seconds_sum{op=\"a\"} 15.3\n"
            "x_latency_seconds_count{op=\"a\"} 6\n");
}

TEST(ExpositionTest, HistogramBucketsAreInclusiveAndCumulative) {
  Histogram h(metrics::DecadeBounds(-3, 0));
  // One observation exactly on each bound, one below the first and one above the last.
  const Histogram::Snapshot empty = h.Read();
  ASSERT_EQ(empty.bounds.size(), 10u);
  for (double b : empty.bounds) h.Observe(b);
  h.Observe(1e-4);
  h.Observe(7);
  const Histogram::Snapshot s = h.Read();
  EXPECT_EQ(s.count, 12u);
  ASSERT_EQ(s.counts.size(), 11u);
  EXPECT_EQ(s.counts[0], 2u);   // 1e-4 and 0.001
  EXPECT_EQ(s.counts[10], 1u);  // 7, in +Inf only
  // In the text, each bucket holds everything at or below its bound.
  const std::string text =
      metrics::Render({{"h_seconds", "h", MetricType::kHistogram, {}, {{{}, s}}}});
  uint64_t previous = 0;
  int buckets = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, "h_seconds_bucket")) continue;
    uint64_t value = 0;
    ASSERT_TRUE(absl::SimpleAtoi(line.substr(line.rfind(' ') + 1), &value)) << line;
    EXPECT_GE(value, previous) << line;
    previous = value;
    ++buckets;
    if (buckets == 2) {
      EXPECT_EQ(line, "h_seconds_bucket{le=\"0.0025\"} 3");
    }
  }
  EXPECT_EQ(buckets, 11);
  EXPECT_EQ(previous, 12u);
  EXPECT_NE(text.find("h_seconds_bucket{le=\"+Inf\"} 12\n"), std::string::npos);
  EXPECT_NE(text.find("h_seconds_count 12\n"), std::string::npos);
}

TEST(ExpositionTest, DecadeBoundsPrintAsTheirDecimalSpelling) {
  std::vector<std::string> text;
  for (double b : metrics::DecadeBounds(-5, -3)) text.push_back(metrics::FormatValue(b));
  EXPECT_EQ(text, (std::vector<std::string>{"1e-05", "2.5e-05", "5e-05", "0.0001", "0.00025",
                                            "0.0005", "0.001"}));
  EXPECT_EQ(metrics::DecadeBounds(0, 2).back(), 100.0);
}

TEST(ExpositionTest, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(metrics::EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(metrics::EscapeHelp("say \"hi\"\\\nbye"), "say \"hi\"\\\\\\nbye");
  const std::string text = metrics::Render({{"m",
                                             "line one\nline \\two",
                                             MetricType::kGauge,
                                             {{{{"client", "we\"ird\\name\n"}}, 1}},
                                             {}}});
  EXPECT_EQ(text,
            "# HELP m line one\\nline \\\\two\n"
            "# TYPE m gauge\n"
            "m{client=\"we\\\"ird\\\\name\\n\"} 1\n");
}

TEST(ExpositionTest, FormatsValues) {
  EXPECT_EQ(metrics::FormatValue(0), "0");
  EXPECT_EQ(metrics::FormatValue(42), "42");
  EXPECT_EQ(metrics::FormatValue(0.1), "0.1");
  EXPECT_EQ(metrics::FormatValue(1e-5), "1e-05");
  EXPECT_EQ(metrics::FormatValue(12884901888.0), "12884901888");
  EXPECT_EQ(metrics::FormatValue(-2.5), "-2.5");
  EXPECT_EQ(metrics::FormatValue(1e20), "1e+20");
  EXPECT_EQ(metrics::FormatValue(NAN), "NaN");
  EXPECT_EQ(metrics::FormatValue(INFINITY), "+Inf");
  EXPECT_EQ(metrics::FormatValue(-INFINITY), "-Inf");
  double back = 0;
  ASSERT_TRUE(absl::SimpleAtod(metrics::FormatValue(1.0 / 3), &back));
  EXPECT_EQ(back, 1.0 / 3);
}

TEST(ExpositionTest, NameRules) {
  EXPECT_TRUE(metrics::IsValidMetricName("gpucompute_operations_total"));
  EXPECT_TRUE(metrics::IsValidMetricName("job:rate5m"));
  EXPECT_FALSE(metrics::IsValidMetricName("9lives"));
  EXPECT_FALSE(metrics::IsValidMetricName("has-dash"));
  EXPECT_FALSE(metrics::IsValidMetricName(""));
  EXPECT_TRUE(metrics::IsValidLabelName("device"));
  EXPECT_FALSE(metrics::IsValidLabelName("__name__"));
  EXPECT_FALSE(metrics::IsValidLabelName("a:b"));
  EXPECT_FALSE(metrics::IsValidLabelName("1a"));
}

// ---- NVML, loaded at run time.

TEST(NvmlTest, MissingLibraryIsReportedNotFatal) {
  std::string error;
  EXPECT_EQ(metrics::Nvml::Load("/nonexistent/libnvidia-ml.so.1", &error), nullptr);
  EXPECT_NE(error.find("libnvidia-ml.so.1"), std::string::npos) << error;
}

TEST(NvmlTest, LibraryWithoutNvmlIsRefused) {
  std::string error;
  EXPECT_EQ(metrics::Nvml::Load("libc.so.6", &error), nullptr);
  EXPECT_EQ(error, "libc.so.6 has no nvmlInit_v2");
}

TEST(NvmlTest, InitFailureIsReported) {
  setenv("FAKE_NVML_INIT_ERROR", "9", 1);
  std::string error;
  std::unique_ptr<metrics::Nvml> nvml = metrics::Nvml::Load(FAKE_NVML_PATH, &error);
  unsetenv("FAKE_NVML_INIT_ERROR");
  EXPECT_EQ(nvml, nullptr);
  EXPECT_EQ(error, "nvmlInit failed: Driver Not Loaded");
}

TEST(NvmlTest, ReadsEveryGpu) {
  std::string error;
  std::unique_ptr<metrics::Nvml> nvml = metrics::Nvml::Load(FAKE_NVML_PATH, &error);
  ASSERT_NE(nvml, nullptr) << error;
  const std::vector<metrics::GpuReading> gpus = nvml->Read();
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].index, 0u);
  EXPECT_EQ(gpus[0].uuid, "GPU-00000000-1111-2222-3333-444444444444");
  EXPECT_EQ(gpus[0].name, "Fake GPU \"A\"");
  EXPECT_EQ(gpus[0].utilization_ratio, 0.87);
  EXPECT_EQ(gpus[0].memory_utilization_ratio, 0.42);
  // From nvmlDeviceGetMemoryInfo_v2: without what the driver reserves.
  EXPECT_EQ(gpus[0].memory_used_bytes, 3.0 * (1 << 30) - 512.0 * (1 << 20));
  EXPECT_EQ(gpus[0].memory_total_bytes, 80.0 * (1 << 30));
  EXPECT_EQ(gpus[0].power_watts, 312.5);
  EXPECT_EQ(gpus[0].power_limit_watts, 700.0);
  EXPECT_EQ(gpus[0].temperature_celsius, 61.0);
  EXPECT_FALSE(gpus[1].utilization_ratio.has_value());
  EXPECT_EQ(gpus[1].power_watts, 71.25);
}

TEST(NvmlTest, MemoryFromTheFirstApiOnOlderDrivers) {
  setenv("FAKE_NVML_NO_MEMORY_V2", "1", 1);
  std::string error;
  std::unique_ptr<metrics::Nvml> nvml = metrics::Nvml::Load(FAKE_NVML_PATH, &error);
  ASSERT_NE(nvml, nullptr) << error;
  const std::vector<metrics::GpuReading> gpus = nvml->Read();
  unsetenv("FAKE_NVML_NO_MEMORY_V2");
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].memory_used_bytes, 3.0 * (1 << 30));
  EXPECT_EQ(gpus[0].memory_total_bytes, 80.0 * (1 << 30));
}

// ---- The observer: operations queued and running, straight from the executor.

class ObserverTest : public ::testing::Test {
 protected:
  ObserverTest()
      : backend_(2),
        limiter_(uint64_t{1} << 30),
        registry_(backend_, limiter_),
        executor_(*Executor::Create(backend_)),
        ctx_{backend_, *executor_, registry_, limiter_, timer_},
        metrics_(ctx_) {
    executor_->SetObserver(&metrics_);
  }
  // The executor goes first, waiting for its work, while the observer it calls lives.
  ~ObserverTest() override { executor_.reset(); }

  BufferHandle NewBuffer(const std::string& client, uint64_t n) {
    absl::StatusOr<BufferHandle> b =
        registry_.Allocate(client, "", DType::kFloat64, {n}, Layout::kC, 0);
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(registry_.Register(*b).ok());
    return *b;
  }

  // A fill of `b` that, once handed to the device, holds the stream until `release`.
  Executor::OpSpec HeldFill(const BufferHandle& b, std::shared_future<void> release) {
    Executor::OpSpec spec;
    spec.kind = OperationKind::kFill;
    spec.accesses = {{b, true}};
    spec.bytes_written = b->size_bytes();
    spec.launch = [this, b, release](Stream& s, OpResult&) -> absl::StatusOr<LaunchInfo> {
      if (absl::Status st = s.OnComplete([release](absl::Status) { release.wait(); }); !st.ok())
        return st;
      if (absl::Status st = backend_.Fill(s, b->memory, DType::kFloat64, 0, b->num_elements());
          !st.ok())
        return st;
      return LaunchInfo{};
    };
    return spec;
  }

  Scrape Read() { return Parse(metrics_.Render()); }

  cpu::CpuBackend backend_;
  MemoryLimiter limiter_;
  BufferRegistry registry_;
  Timer timer_;
  std::unique_ptr<Executor> executor_;
  ServiceContext ctx_;
  metrics::ServerMetrics metrics_;
};

TEST_F(ObserverTest, QueuedRunningAndDone) {
  BufferHandle a = NewBuffer("c", 1000);
  BufferHandle b = NewBuffer("c", 10);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::shared_ptr<HostAccess> hold;
  // Whatever fails below, the held work is let go, or the executor would wait forever.
  auto let_go = [&, done = false]() mutable {
    if (done) return;
    done = true;
    if (hold != nullptr) executor_->Release(hold);
    release.set_value();
  };
  struct LetGo {
    std::function<void()> fn;
    ~LetGo() { fn(); }
  } guard{[&] { let_go(); }};

  // A host access holds `b`: the fill of b waits for it in the executor (queued).
  std::promise<void> ready;
  hold = executor_->AcquireHostAccess(
      {{b, true}}, [&](const std::shared_ptr<HostAccess>&) { ready.set_value(); });
  ready.get_future().wait();
  // Two fills of `a`, on their own stream, hold the device (running).
  absl::StatusOr<StreamInfo> other = executor_->CreateStream("c", 0);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(executor_->Submit("c", other->id, HeldFill(a, released)).ok());
  EXPECT_TRUE(executor_->Submit("c", other->id, HeldFill(a, released)).ok());
  absl::StatusOr<std::shared_ptr<Operation>> queued =
      executor_->Submit("c", "", HeldFill(b, released));
  EXPECT_TRUE(queued.ok());

  Scrape s = Read();
  EXPECT_EQ(s.at("gpucompute_operations_queued{device=\"0\"}"), 1);
  EXPECT_EQ(s.at("gpucompute_operations_running{device=\"0\"}"), 2);
  EXPECT_EQ(s.at("gpucompute_operations_total{kind=\"fill\",outcome=\"succeeded\"}"), 0);
  EXPECT_EQ(s.at("gpucompute_buffers{device=\"0\",client=\"c\"}"), 2);
  EXPECT_EQ(s.at("gpucompute_buffer_bytes{device=\"0\",client=\"c\"}"), 8080);

  let_go();
  // Completions are counted a moment after the work is done, each series on its own (a
  // scrape may see the count before the gauge and the histograms): wait for all of them.
  for (int i = 0; i < 1000; ++i) {
    s = Read();
    if (s.at("gpucompute_operations_total{kind=\"fill\",outcome=\"succeeded\"}") == 3 &&
        s.at("gpucompute_operations_running{device=\"0\"}") == 0 &&
        s.at("gpucompute_operation_device_seconds_count{kind=\"fill\"}") == 3 &&
        s.at("gpucompute_operation_latency_seconds_count{kind=\"fill\"}") == 3) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(s.at("gpucompute_operations_queued{device=\"0\"}"), 0);
  EXPECT_EQ(s.at("gpucompute_operations_running{device=\"0\"}"), 0);
  EXPECT_EQ(s.at("gpucompute_operations_total{kind=\"fill\",outcome=\"succeeded\"}"), 3);
  EXPECT_EQ(s.at("gpucompute_operation_device_seconds_count{kind=\"fill\"}"), 3);
  EXPECT_EQ(s.at("gpucompute_operation_latency_seconds_count{kind=\"fill\"}"), 3);
  EXPECT_EQ(s.at("gpucompute_operation_written_bytes_total{kind=\"fill\"}"), 2 * 8000 + 80);
  ExpectWellFormed(s);
}

// Transfers a client broke off or left idle: failed, and counted by reason.
TEST_F(ObserverTest, AbandonedTransfersAreCountedByReason) {
  executor_->RecordTransfer("c", OperationKind::kUpload, 100);
  executor_->RecordFailedTransfer("c", OperationKind::kUpload, absl::CancelledError("gone"));
  executor_->RecordFailedTransfer("c", OperationKind::kUpload, absl::DeadlineExceededError("idle"));
  executor_->RecordFailedTransfer("c", OperationKind::kUpload, absl::InvalidArgumentError("short"));
  executor_->RecordFailedTransfer("c", OperationKind::kDownload, absl::CancelledError("gone"));
  const Scrape s = Read();
  EXPECT_EQ(s.at("gpucompute_operations_total{kind=\"upload\",outcome=\"succeeded\"}"), 1);
  EXPECT_EQ(s.at("gpucompute_operations_total{kind=\"upload\",outcome=\"failed\"}"), 3);
  EXPECT_EQ(s.at("gpucompute_transfers_abandoned_total{kind=\"upload\",reason=\"cancelled\"}"), 1);
  EXPECT_EQ(s.at("gpucompute_transfers_abandoned_total{kind=\"upload\",reason=\"timed_out\"}"), 1);
  EXPECT_EQ(s.at("gpucompute_operations_total{kind=\"download\",outcome=\"failed\"}"), 1);
  EXPECT_EQ(s.at("gpucompute_transfers_abandoned_total{kind=\"download\",reason=\"cancelled\"}"),
            1);
  EXPECT_EQ(s.at("gpucompute_transfers_abandoned_total{kind=\"download\",reason=\"timed_out\"}"),
            0);
  ExpectWellFormed(s);
}

TEST_F(ObserverTest, FailedOperationsAreCountedNotTimed) {
  BufferHandle a = NewBuffer("c", 10);
  Executor::OpSpec spec;
  spec.kind = OperationKind::kReduce;
  spec.accesses = {{a, false}};
  spec.launch = [](Stream&, OpResult&) -> absl::StatusOr<LaunchInfo> {
    return absl::InternalError("launch failed on purpose");
  };
  absl::StatusOr<std::shared_ptr<Operation>> op = executor_->Submit("c", "", std::move(spec));
  ASSERT_TRUE(op.ok());
  std::promise<void> done;
  executor_->OnDone(*op, [&] { done.set_value(); });
  done.get_future().wait();
  // The observer counts a completion a moment after the operation's own done callbacks
  // may have run (QueuedRunningAndDone says so too): wait for the count and the gauge.
  Scrape s = Read();
  for (int i = 0; i < 1000; ++i) {
    if (s.at("gpucompute_operations_total{kind=\"reduce\",outcome=\"failed\"}") == 1 &&
        s.at("gpucompute_operations_running{device=\"0\"}") == 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    s = Read();
  }
  EXPECT_EQ(s.at("gpucompute_operations_total{kind=\"reduce\",outcome=\"failed\"}"), 1);
  EXPECT_EQ(s.at("gpucompute_operations_total{kind=\"reduce\",outcome=\"succeeded\"}"), 0);
  EXPECT_EQ(s.at("gpucompute_operation_device_seconds_count{kind=\"reduce\"}"), 0);
  EXPECT_EQ(s.at("gpucompute_operations_running{device=\"0\"}"), 0);
}

TEST_F(ObserverTest, ClientSeriesAreBounded) {
  // Client i holds (i + 1) elements; the 63 largest keep their own series.
  const int clients = static_cast<int>(metrics::kMaxClientSeries) + 6;
  for (int i = 0; i < clients; ++i) NewBuffer(absl::StrCat("client", i), i + 1);
  const Scrape s = Read();
  int client_series = 0;
  double bytes = 0;
  for (const auto& [series, value] : s.values) {
    if (!absl::StartsWith(series, "gpucompute_buffer_bytes{")) continue;
    ++client_series;
    bytes += value;
  }
  EXPECT_EQ(client_series, static_cast<int>(metrics::kMaxClientSeries));
  EXPECT_EQ(bytes, 8.0 * clients * (clients + 1) / 2);
  // Clients 0..6 hold the least: 1..7 elements.
  EXPECT_EQ(s.at("gpucompute_buffers{device=\"0\",client=\"_other\"}"), 7);
  EXPECT_EQ(s.at("gpucompute_buffer_bytes{device=\"0\",client=\"_other\"}"), 8.0 * 28);
  EXPECT_EQ(s.values.count("gpucompute_buffers{device=\"0\",client=\"client6\"}"), 0u);
  EXPECT_EQ(s.at("gpucompute_buffers{device=\"0\",client=\"client7\"}"), 1);
}

TEST_F(ObserverTest, NoGpuSeriesOnTheCpuBackend) {
  const Scrape s = Read();
  EXPECT_EQ(s.types.count("gpucompute_nvml_up"), 0u);
  EXPECT_EQ(s.types.count("gpucompute_gpu_utilization_ratio"), 0u);
  EXPECT_EQ(s.at("gpucompute_backend_healthy"), 1);
  backend_.ReportFailure(absl::InternalError("broken on purpose"));
  EXPECT_EQ(Read().at("gpucompute_backend_healthy"), 0);
}

TEST_F(ObserverTest, GpuSeriesFromNvml) {
  metrics::ServerMetrics::Options options;
  options.nvml_library = FAKE_NVML_PATH;
  options.nvml_on_any_backend = true;
  metrics::ServerMetrics with_gpus(ctx_, options);
  const Scrape s = Parse(with_gpus.Render());
  const std::string gpu0 = "{gpu=\"0\",uuid=\"GPU-00000000-1111-2222-3333-444444444444\"}";
  const std::string gpu1 = "{gpu=\"1\",uuid=\"GPU-55555555-6666-7777-8888-999999999999\"}";
  EXPECT_EQ(s.at("gpucompute_nvml_up"), 1);
  EXPECT_EQ(s.at("gpucompute_gpu_utilization_ratio" + gpu0), 0.87);
  EXPECT_EQ(s.values.count("gpucompute_gpu_utilization_ratio" + gpu1), 0u);
  EXPECT_EQ(s.at("gpucompute_gpu_memory_used_bytes" + gpu0), 3.0 * (1 << 30) - 512.0 * (1 << 20));
  EXPECT_EQ(s.at("gpucompute_gpu_power_watts" + gpu1), 71.25);
  EXPECT_EQ(s.at("gpucompute_gpu_temperature_celsius" + gpu0), 61);
  EXPECT_EQ(s.at("gpucompute_gpu_info{gpu=\"0\",uuid=\"GPU-00000000-1111-2222-3333-444444444444\","
                 "name=\"Fake GPU \\\"A\\\"\"}"),
            1);
  ExpectWellFormed(s);

  options.nvml_library = "/nonexistent/libnvidia-ml.so.1";
  metrics::ServerMetrics without(ctx_, options);
  const Scrape none = Parse(without.Render());
  EXPECT_EQ(none.at("gpucompute_nvml_up"), 0);
  EXPECT_EQ(none.types.count("gpucompute_gpu_power_watts"), 0u);
}

}  // namespace
}  // namespace gpucompute
