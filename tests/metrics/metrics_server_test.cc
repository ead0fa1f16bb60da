// /metrics of a real server, scraped over HTTP after a workload whose every figure is
// known in advance, and linted by promtool where it is installed; the endpoint itself
// stopping, and serving scrapes while other connections stall.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "client/cpp/session.h"
#include "server/metrics/http_endpoint.h"
#include "server/server.h"
#include "tests/metrics/metrics_scrape.h"
#include "tests/support/test_server.h"

namespace gpucompute {
namespace {

using testing::ExpectWellFormed;
using testing::HttpRequest;
using testing::HttpResponse;
using testing::Parse;
using testing::Scrape;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A TCP connection to 127.0.0.1:port that has sent `text`; -1 if it could not connect.
int OpenAndSend(int port, const std::string& text) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      send(fd, text.data(), text.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(text.size())) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

// GET /metrics on a new connection, given up after `limit_seconds` (unlike
// HttpRequest, which waits as long as the server does): the response's status
// code, or 0 if the whole response did not come in time.
int GetMetricsWithin(int port, double limit_seconds) {
  const Clock::time_point start = Clock::now();
  const int fd =
      OpenAndSend(port, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (fd < 0) return 0;
  std::string response;
  for (;;) {
    const int left_ms = static_cast<int>((limit_seconds - SecondsSince(start)) * 1000);
    pollfd p{fd, POLLIN, 0};
    if (left_ms <= 0 || poll(&p, 1, left_ms) != 1) break;
    char buffer[4096];
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) {
      close(fd);
      int status = 0;
      if (n == 0) std::sscanf(response.c_str(), "HTTP/1.1 %d", &status);
      return status;
    }
    response.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return 0;
}

class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.backend = "cpu";
    options.cpu_threads = 2;
    options.memory_limit_bytes = kLimit;
    options.metrics_listen = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_GT(server_->metrics_port(), 0);
    ASSERT_NE(server_->metrics_port(), server_->port());
  }

  std::unique_ptr<Client> Connect(const std::string& name) {
    ClientOptions options;
    options.target = absl::StrCat("127.0.0.1:", server_->port());
    options.client_name = name;
    options.timeout = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::string ScrapeText() {
    HttpResponse r = HttpRequest(server_->metrics_port(), "GET", "/metrics");
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.content_type, metrics::kContentType);
    return r.body;
  }

  static constexpr uint64_t kLimit = uint64_t{64} << 20;
  std::unique_ptr<Server> server_;
};

TEST_F(MetricsServerTest, SeriesAfterAKnownWorkload) {
  constexpr uint64_t n = 1000;
  std::unique_ptr<Client> alice = Connect("alice");
  std::unique_ptr<Client> odd = Connect("we\"ird\\name");
  ASSERT_NE(alice, nullptr);
  ASSERT_NE(odd, nullptr);

  std::vector<double> x(n, 2.0);
  v1::UploadHeader header;
  header.mutable_create()->set_dtype(v1::DTYPE_FLOAT64);
  header.mutable_create()->add_shape(n);
  header.mutable_create()->set_name("x");
  ASSERT_TRUE(alice->Upload(header, std::as_bytes(std::span(x))).ok());
  // Three elementwise operations (each a new n-element float64 buffer) and a reduce.
  for (int i = 0; i < 3; ++i) {
    v1::SubmitRequest eval =
        Elementwise("x * 3 + 1", {{"x", BufferOperand("x")}}, NewOutput(absl::StrCat("y", i)));
    eval.set_wait(true);
    absl::StatusOr<v1::Operation> op = alice->Submit(eval);
    ASSERT_TRUE(op.ok()) << op.status();
    ASSERT_EQ(op->state(), v1::Operation::STATE_SUCCEEDED);
  }
  v1::SubmitRequest sum = Reduce(v1::REDUCE_KIND_SUM, "y0");
  sum.set_wait(true);
  ASSERT_TRUE(alice->Submit(sum).ok());
  std::string downloaded;
  v1::DownloadRequest download;
  download.set_buffer("y1");
  ASSERT_TRUE(alice->Download(download, &downloaded).ok());
  ASSERT_EQ(downloaded.size(), n * 8);
  // A rejected request is no operation.
  EXPECT_EQ(alice->Submit(Reduce(v1::REDUCE_KIND_SUM, "nothing")).status().code(),
            absl::StatusCode::kNotFound);
  v1::CreateBufferRequest create;
  create.set_dtype(v1::DTYPE_INT32);
  create.add_shape(5);
  ASSERT_TRUE(odd->CreateBuffer(create).ok());
  // A buffer created without fill is zeroed on its stream: wait for that, so that nothing
  // is queued or running when the scrape is taken.
  ASSERT_TRUE(odd->SynchronizeStream("").ok());

  // The gauges follow the executor's completion, which may trail the stream's by a moment.
  std::string text = ScrapeText();
  for (int i = 0; i < 200; ++i) {
    const Scrape gauges = Parse(text);
    if (gauges.at("gpucompute_operations_running{device=\"0\"}") == 0 &&
        gauges.at("gpucompute_operations_queued{device=\"0\"}") == 0) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
    text = ScrapeText();
  }
  const Scrape s = Parse(text);
  ExpectWellFormed(s);
  EXPECT_EQ(s.at("gpucompute_operations_total{kind=\"elementwise\",outcome=\"succeeded\"}"), 3);
  EXPECT_EQ(s.at("gpucompute_operations_total{kind=\"elementwise\",outcome=\"failed\"}"), 0);
  EXPECT_EQ(s.at("gpucompute_operations_total{kind=\"reduce\",outcome=\"succeeded\"}"), 1);
  EXPECT_EQ(s.at("gpucompute_operations_total{kind=\"upload\",outcome=\"succeeded\"}"), 1);
  EXPECT_EQ(s.at("gpucompute_operations_total{kind=\"download\",outcome=\"succeeded\"}"), 1);
  EXPECT_EQ(s.at("gpucompute_operations_total{kind=\"gemv\",outcome=\"succeeded\"}"), 0);
  EXPECT_EQ(s.at("gpucompute_operation_device_seconds_count{kind=\"elementwise\"}"), 3);
  EXPECT_EQ(s.at("gpucompute_operation_latency_seconds_count{kind=\"elementwise\"}"), 3);
  EXPECT_GT(s.at("gpucompute_operation_device_seconds_sum{kind=\"elementwise\"}"), 0);
  EXPECT_GE(s.at("gpucompute_operation_latency_seconds_sum{kind=\"elementwise\"}"),
            s.at("gpucompute_operation_device_seconds_sum{kind=\"elementwise\"}"));
  EXPECT_EQ(s.at("gpucompute_operation_read_bytes_total{kind=\"elementwise\"}"), 3 * 8 * n);
  EXPECT_EQ(s.at("gpucompute_operation_written_bytes_total{kind=\"elementwise\"}"), 3 * 8 * n);
  EXPECT_EQ(s.at("gpucompute_operation_read_bytes_total{kind=\"reduce\"}"), 8 * n);
  EXPECT_EQ(s.at("gpucompute_uploaded_bytes_total"), 8 * n);
  EXPECT_EQ(s.at("gpucompute_downloaded_bytes_total"), 8 * n);
  // x, y0..y2 and the reduce's result for alice; one int32[5] for the other client.
  EXPECT_EQ(s.at("gpucompute_buffers{device=\"0\",client=\"alice\"}"), 5);
  EXPECT_EQ(s.at("gpucompute_buffer_bytes{device=\"0\",client=\"alice\"}"), 4 * 8 * n + 8);
  EXPECT_EQ(s.at("gpucompute_buffers{device=\"0\",client=\"we\\\"ird\\\\name\"}"), 1);
  EXPECT_EQ(s.at("gpucompute_buffer_bytes{device=\"0\",client=\"we\\\"ird\\\\name\"}"), 20);
  EXPECT_EQ(s.at("gpucompute_memory_limit_bytes"), kLimit);
  EXPECT_EQ(s.at("gpucompute_memory_used_bytes"), 4 * 8 * n + 8 + 20);
  // Reserved adds the freed blocks the backend keeps for reuse (the CPU backend keeps
  // those of 1 MiB and more, such as the copy ceiling's measurement at start).
  EXPECT_EQ(s.at("gpucompute_pool_used_bytes{device=\"0\"}"), 4 * 8 * n + 8 + 20);
  EXPECT_GE(s.at("gpucompute_pool_reserved_bytes{device=\"0\"}"),
            s.at("gpucompute_pool_used_bytes{device=\"0\"}"));
  EXPECT_EQ(s.at("gpucompute_operations_queued{device=\"0\"}"), 0);
  EXPECT_EQ(s.at("gpucompute_operations_running{device=\"0\"}"), 0);
  EXPECT_EQ(s.at("gpucompute_backend_healthy"), 1);
  EXPECT_GT(s.at("gpucompute_uptime_seconds"), 0);
  absl::StatusOr<v1::ServerInfo> info = alice->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(s.at(absl::StrCat("gpucompute_build_info{version=\"", info->version(),
                              "\",api=\"gpucompute.v1\",backend=\"cpu\"}")),
            1);
  EXPECT_GT(s.at("process_resident_memory_bytes"), 1 << 20);
  EXPECT_GT(s.at("process_open_fds"), 3);
  EXPECT_EQ(s.types.at("gpucompute_operation_device_seconds"), "histogram");
  EXPECT_EQ(s.types.at("gpucompute_operations_total"), "counter");
  EXPECT_EQ(s.types.at("gpucompute_buffers"), "gauge");

  // The figures agree with GetStats.
  absl::StatusOr<v1::Stats> stats = alice->GetStats();
  ASSERT_TRUE(stats.ok());
  for (const v1::KindStats& k : stats->kinds()) {
    if (k.kind() != v1::OPERATION_KIND_ELEMENTWISE) continue;
    EXPECT_DOUBLE_EQ(s.at("gpucompute_operation_device_seconds_sum{kind=\"elementwise\"}"),
                     k.device_seconds());
  }
}

TEST_F(MetricsServerTest, PromtoolAcceptsTheScrape) {
  const std::string promtool = "/usr/bin/promtool";
  if (!std::filesystem::exists(promtool))
    GTEST_SKIP() << "promtool (Debian's prometheus package) is not installed";
  const std::string path = ::testing::TempDir() + "/metrics_test_scrape.txt";
  std::ofstream(path) << ScrapeText();
  const std::string command = promtool + " check metrics < " + path + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  EXPECT_EQ(pclose(pipe), 0) << output;
  EXPECT_EQ(output, "") << "promtool's lint findings";
  std::filesystem::remove(path);
}

TEST_F(MetricsServerTest, OnlyGetAndHeadOfMetrics) {
  const HttpResponse head = HttpRequest(server_->metrics_port(), "HEAD", "/metrics");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
  EXPECT_EQ(HttpRequest(server_->metrics_port(), "POST", "/metrics").status, 405);
  EXPECT_EQ(HttpRequest(server_->metrics_port(), "GET", "/").status, 404);
  EXPECT_EQ(HttpRequest(server_->metrics_port(), "GET", "/etc/passwd").status, 404);
  EXPECT_EQ(HttpRequest(server_->metrics_port(), "GET", "/metrics/x").status, 404);
}

TEST_F(MetricsServerTest, ReadyzSaysServingUntilShutdownBegins) {
  const HttpResponse ready = HttpRequest(server_->metrics_port(), "GET", "/readyz");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.body, "ready\n");
  const HttpResponse head = HttpRequest(server_->metrics_port(), "HEAD", "/readyz");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
  EXPECT_EQ(HttpRequest(server_->metrics_port(), "POST", "/readyz").status, 405);
  EXPECT_EQ(HttpRequest(server_->metrics_port(), "GET", "/readyz/x").status, 404);

  // An open session holds the shutdown in its grace, while which the server takes no new
  // calls: a readiness probe must say so, so that traffic goes elsewhere.
  std::unique_ptr<Client> client = Connect("alice");
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(*client);
  ASSERT_TRUE(session.ok()) << session.status();
  std::thread shutdown([this] { server_->Shutdown(); });
  HttpResponse during;
  for (const Clock::time_point start = Clock::now(); SecondsSince(start) < 5;) {
    during = HttpRequest(server_->metrics_port(), "GET", "/readyz");
    if (during.status != 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(during.status, 503);
  EXPECT_EQ(during.body, "the server is shutting down\n");
  // Cancelled by us, or ended by the shutdown first: either way the session is over.
  const absl::Status ended = (*session)->Cancel();
  EXPECT_TRUE(ended.code() == absl::StatusCode::kCancelled ||
              ended.code() == absl::StatusCode::kUnavailable)
      << ended;
  shutdown.join();
}

TEST(HttpEndpointTest, ReadyzAnswersWhatTheCallbackSays) {
  std::atomic<bool> started{false};
  absl::StatusOr<std::unique_ptr<metrics::HttpEndpoint>> endpoint = metrics::HttpEndpoint::Start(
      "127.0.0.1:0", [] { return std::string("up 1\n"); },
      [&started] {
        return started.load() ? absl::OkStatus() : absl::UnavailableError("the server is starting");
      });
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const HttpResponse starting = HttpRequest((*endpoint)->port(), "GET", "/readyz");
  EXPECT_EQ(starting.status, 503);
  EXPECT_EQ(starting.body, "the server is starting\n");
  started = true;
  EXPECT_EQ(HttpRequest((*endpoint)->port(), "GET", "/readyz").status, 200);
  EXPECT_EQ(HttpRequest((*endpoint)->port(), "GET", "/metrics").body, "up 1\n");

  // Without a readiness callback there is no /readyz.
  absl::StatusOr<std::unique_ptr<metrics::HttpEndpoint>> plain =
      metrics::HttpEndpoint::Start("127.0.0.1:0", [] { return std::string("up 1\n"); });
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(HttpRequest((*plain)->port(), "GET", "/readyz").status, 404);
}

TEST(HttpEndpointTest, StopsAtOnce) {
  // civetweb's listener polls in 2 s periods; the endpoint wakes it when stopping, so
  // that a server's shutdown (SIGTERM, podman stop) is not held up by it.
  for (const char* listen : {"127.0.0.1:0", ":0"}) {
    absl::StatusOr<std::unique_ptr<metrics::HttpEndpoint>> endpoint =
        metrics::HttpEndpoint::Start(listen, [] { return std::string("up 1\n"); });
    ASSERT_TRUE(endpoint.ok()) << endpoint.status();
    const HttpResponse r = HttpRequest((*endpoint)->port(), "GET", "/metrics");
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, "up 1\n");
    const auto start = std::chrono::steady_clock::now();
    endpoint->reset();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 1.0) << listen;
  }
}

TEST(HttpEndpointTest, StalledConnectionsNeitherBlockScrapesNorLinger) {
  // A tenant who can reach the port holds connections open that send nothing, and as many
  // that send part of a request line and stop (slowloris), opening each again as soon as
  // the server drops it. With 4 threads and a 10 s request timeout, kEach = 4 of them
  // stopped every scrape.
  constexpr int kEach = 4;
  // Seconds. A scrape never waits for the server to drop a stalled connection (1 s), and
  // the server drops each well within the old 10 s.
  constexpr double kScrapeLimit = 0.5;
  constexpr double kStalledLimit = 2.0;
  absl::StatusOr<std::unique_ptr<metrics::HttpEndpoint>> endpoint =
      metrics::HttpEndpoint::Start("127.0.0.1:0", [] { return std::string("up 1\n"); });
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  struct Stalled {
    std::string sent;
    int fd = -1;
    Clock::time_point opened;
  };
  std::vector<Stalled> stalled(2 * kEach);
  for (int i = 0; i < kEach; ++i) stalled[i].sent = "GET /metr";  // the others send nothing
  for (Stalled& s : stalled) {
    s.fd = OpenAndSend(port, s.sent);
    s.opened = Clock::now();
    ASSERT_GE(s.fd, 0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // workers have taken them

  int scrapes = 0;
  int dropped = 0;
  const Clock::time_point start = Clock::now();
  while (SecondsSince(start) < 3.0) {
    const Clock::time_point scrape_start = Clock::now();
    EXPECT_EQ(GetMetricsWithin(port, kScrapeLimit), 200) << "scrape " << scrapes;
    EXPECT_LT(SecondsSince(scrape_start), kScrapeLimit) << "scrape " << scrapes;
    ++scrapes;
    for (Stalled& s : stalled) {
      // The server's answer to a partial request (400) is read and dropped; an end of
      // stream or a reset means the server has closed the connection.
      char buffer[512];
      ssize_t n;
      while ((n = recv(s.fd, buffer, sizeof(buffer), MSG_DONTWAIT)) > 0) {
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      EXPECT_LT(SecondsSince(s.opened), kStalledLimit) << "a stalled connection lingered";
      ++dropped;
      close(s.fd);
      s.fd = OpenAndSend(port, s.sent);
      s.opened = Clock::now();
      ASSERT_GE(s.fd, 0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GE(dropped, static_cast<int>(stalled.size())) << "the server kept stalled connections";
  for (Stalled& s : stalled) close(s.fd);
  endpoint->reset();
}

TEST(MetricsListenTest, BadAddressesStopTheStart) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.backend = "cpu";
  options.cpu_threads = 1;
  for (const char* bad :
       {"nohost", "127.0.0.1:http", "127.0.0.1:70000", "example.com:9100", "[::1:9100"}) {
    options.metrics_listen = bad;
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument)
        << bad << ": " << server.status();
  }
  // A port already taken.
  options.metrics_listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<Server>> first = Server::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  options.metrics_listen = absl::StrCat("127.0.0.1:", (*first)->metrics_port());
  absl::StatusOr<std::unique_ptr<Server>> second = Server::Start(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
}

}  // namespace
}  // namespace gpucompute
