#include "server/metrics/http_endpoint.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/metrics/exposition.h"

namespace gpucompute::metrics {
namespace {

struct ListenAddress {
  std::string civetweb_ports;  // "127.0.0.1:9090", "[::1]:9090", or "9090" for every IPv4 interface
  int family = AF_INET;        // of the address the server can reach itself on
  std::string self;            // that address: the host, or loopback for every interface
};

absl::StatusOr<ListenAddress> ParseListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  const std::string host = colon == std::string::npos ? "" : listen.substr(0, colon);
  const std::string port_text = colon == std::string::npos ? listen : listen.substr(colon + 1);
  int port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", listen, "' has no port (use HOST:PORT)"));
  }
  unsigned char address[16];
  if (host.empty() || host == "*") return ListenAddress{absl::StrCat(port), AF_INET, "127.0.0.1"};
  if (host == "localhost")
    return ListenAddress{absl::StrCat("127.0.0.1:", port), AF_INET, "127.0.0.1"};
  if (inet_pton(AF_INET, host.c_str(), address) == 1) {
    return ListenAddress{absl::StrCat(host, ":", port), AF_INET,
                         host == "0.0.0.0" ? "127.0.0.1" : host};
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    const std::string ip = host.substr(1, host.size() - 2);
    if (inet_pton(AF_INET6, ip.c_str(), address) == 1) {
      return ListenAddress{absl::StrCat(host, ":", port), AF_INET6, ip == "::" ? "::1" : ip};
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", listen, "': the host must be an IP address, [IPv6], localhost or empty"));
}

// Opens and closes a connection to host:port, which wakes a listener waiting in poll.
void Poke(int family, const std::string& host, int port) {
  const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_storage address{};
  socklen_t length = 0;
  if (family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&address);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, host.c_str(), &a->sin_addr);
    length = sizeof(sockaddr_in);
  } else {
    auto* a = reinterpret_cast<sockaddr_in6*>(&address);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET6, host.c_str(), &a->sin6_addr);
    length = sizeof(sockaddr_in6);
  }
  connect(fd, reinterpret_cast<sockaddr*>(&address), length);
  close(fd);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(const std::string& listen,
                                                                  Render render,
                                                                  Readiness ready) {
  absl::StatusOr<ListenAddress> address = ParseListen(listen);
  if (!address.ok()) return address.status();
  static std::once_flag init;
  std::call_once(init, [] { mg_init_library(0); });

  std::unique_ptr<HttpEndpoint> endpoint(new HttpEndpoint(std::move(render), std::move(ready)));
  endpoint->self_family_ = address->family;
  endpoint->self_host_ = address->self;
  // Whoever reaches the port can open connections and send nothing, or part of a request
  // (slowloris); civetweb gives each connection a worker thread until its request has
  // come, and queues the rest. The bounds:
  // - A connection holds a worker at most kRequestTimeoutMs before its whole request has
  //   come (counted from when a worker takes it; twice that if it trickles in byte by
  //   byte), and a write that makes no progress for as long is abandoned. A scraper sends
  //   its request in its first packet, so 1 s spares any network it can work over.
  // - kThreads workers: a Prometheus per replica and someone's curl need 3 at once, and the
  //   other 13 may sit on stalled connections without a scrape waiting at all. Beyond that
  //   a scrape queues, and waits about 1 s for each 16 connections ahead of it; no thread
  //   count outlasts a flood of connections, which is why the port belongs on a network
  //   you trust. A worker costs a 16 KiB request buffer and a mostly untouched stack.
  // - No keep-alive: a connection kept open between scrapes would hold a worker, and delay
  //   stopping by up to half a second; a new connection per scrape costs nothing.
  constexpr const char* kThreads = "16";
  constexpr const char* kRequestTimeoutMs = "1000";
  const char* options[] = {"listening_ports",
                           address->civetweb_ports.c_str(),
                           "num_threads",
                           kThreads,
                           "request_timeout_ms",
                           kRequestTimeoutMs,
                           "enable_keep_alive",
                           "no",
                           nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  mg_init_data init_data{&callbacks, endpoint.get(), options};
  char error_text[256] = {};
  mg_error_data error{nullptr, error_text, sizeof(error_text)};
  endpoint->context_ = mg_start2(&init_data, &error);
  if (endpoint->context_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", listen, ": ",
                     error_text[0] != '\0' ? error_text : "civetweb failed to start"));
  }
  mg_set_request_handler(endpoint->context_, "/metrics$", &HttpEndpoint::Handle, endpoint.get());
  if (endpoint->ready_ != nullptr) {
    mg_set_request_handler(endpoint->context_, "/readyz$", &HttpEndpoint::HandleReady,
                           endpoint.get());
  }
  mg_server_port server_ports[4] = {};
  if (mg_get_server_ports(endpoint->context_, 4, server_ports) > 0)
    endpoint->port_ = server_ports[0].port;
  return endpoint;
}

HttpEndpoint::~HttpEndpoint() {
  if (context_ == nullptr) return;
  // civetweb's listener sees the stop only when its poll returns, which it does every
  // 2 s or on a connection: poke it until it has stopped, so that stopping (and so the
  // server's shutdown) takes milliseconds instead.
  std::atomic<bool> stopped{false};
  std::thread poke([&] {
    while (!stopped.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (!stopped.load() && port_ != 0) Poke(self_family_, self_host_, port_);
    }
  });
  mg_stop(context_);
  stopped = true;
  poke.join();
}

namespace {

// GET or HEAD: whether the body is to be sent; anything else is answered 405 here.
std::optional<bool> SendsBody(mg_connection* conn) {
  const mg_request_info* request = mg_get_request_info(conn);
  if (std::strcmp(request->request_method, "HEAD") == 0) return false;
  if (std::strcmp(request->request_method, "GET") == 0) return true;
  mg_send_http_error(conn, 405, "only GET and HEAD are served here\n");
  return std::nullopt;
}

}  // namespace

int HttpEndpoint::Handle(mg_connection* conn, void* self) {
  const std::optional<bool> body_wanted = SendsBody(conn);
  if (!body_wanted.has_value()) return 405;
  const std::string body = static_cast<HttpEndpoint*>(self)->render_();
  mg_send_http_ok(conn, kContentType, static_cast<long long>(body.size()));
  if (*body_wanted) mg_write(conn, body.data(), body.size());
  return 200;
}

int HttpEndpoint::HandleReady(mg_connection* conn, void* self) {
  const std::optional<bool> body_wanted = SendsBody(conn);
  if (!body_wanted.has_value()) return 405;
  const absl::Status ready = static_cast<HttpEndpoint*>(self)->ready_();
  const int code = ready.ok() ? 200 : 503;
  const std::string body =
      ready.ok() ? std::string("ready\n") : absl::StrCat(ready.message(), "\n");
  mg_response_header_start(conn, code);
  mg_response_header_add(conn, "Content-Type", "text/plain; charset=utf-8", -1);
  mg_response_header_add(conn, "Content-Length", absl::StrCat(body.size()).c_str(), -1);
  mg_response_header_add(conn, "Cache-Control", "no-store", -1);
  mg_response_header_send(conn);
  if (*body_wanted) mg_write(conn, body.data(), body.size());
  return code;
}

}  // namespace gpucompute::metrics
