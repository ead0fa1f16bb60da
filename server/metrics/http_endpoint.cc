#include "server/metrics/http_endpoint.h"

#include <arpa/inet.h>
#include <civetweb.h>

#include <cstring>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/metrics/exposition.h"

namespace gpucompute::metrics {
namespace {

// civetweb's spelling of `listen`: "127.0.0.1:9090", "[::1]:9090", or "9090" for every
// IPv4 interface.
absl::StatusOr<std::string> CivetwebPorts(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  const std::string host = colon == std::string::npos ? "" : listen.substr(0, colon);
  const std::string port_text = colon == std::string::npos ? listen : listen.substr(colon + 1);
  int port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", listen, "' has no port (use HOST:PORT)"));
  }
  if (host.empty() || host == "*") return absl::StrCat(port);
  if (host == "localhost") return absl::StrCat("127.0.0.1:", port);
  unsigned char address[16];
  if (inet_pton(AF_INET, host.c_str(), address) == 1) return absl::StrCat(host, ":", port);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']' &&
      inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), address) == 1) {
    return absl::StrCat(host, ":", port);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", listen, "': the host must be an IP address, [IPv6], localhost or empty"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(const std::string& listen, Render render) {
  absl::StatusOr<std::string> ports = CivetwebPorts(listen);
  if (!ports.ok()) return ports.status();
  static std::once_flag init;
  std::call_once(init, [] { mg_init_library(0); });

  std::unique_ptr<HttpEndpoint> endpoint(new HttpEndpoint(std::move(render)));
  // A scraper or two, not the public: few threads, and requests that stall are dropped.
  const char* options[] = {"listening_ports",    ports->c_str(), "num_threads", "4",
                           "request_timeout_ms", "10000",        "enable_keep_alive", "yes",
                           nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  mg_init_data init_data{&callbacks, endpoint.get(), options};
  char error_text[256] = {};
  mg_error_data error{nullptr, error_text, sizeof(error_text)};
  endpoint->context_ = mg_start2(&init_data, &error);
  if (endpoint->context_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", listen, ": ",
                                               error_text[0] != '\0' ? error_text : "civetweb failed to start"));
  }
  mg_set_request_handler(endpoint->context_, "/metrics$", &HttpEndpoint::Handle, endpoint.get());
  mg_server_port server_ports[4] = {};
  if (mg_get_server_ports(endpoint->context_, 4, server_ports) > 0) endpoint->port_ = server_ports[0].port;
  return endpoint;
}

HttpEndpoint::~HttpEndpoint() {
  if (context_ != nullptr) mg_stop(context_);
}

int HttpEndpoint::Handle(mg_connection* conn, void* self) {
  const mg_request_info* request = mg_get_request_info(conn);
  const bool head = std::strcmp(request->request_method, "HEAD") == 0;
  if (!head && std::strcmp(request->request_method, "GET") != 0) {
    mg_send_http_error(conn, 405, "only GET and HEAD are served here\n");
    return 405;
  }
  const std::string body = static_cast<HttpEndpoint*>(self)->render_();
  mg_send_http_ok(conn, kContentType, static_cast<long long>(body.size()));
  if (!head) mg_write(conn, body.data(), body.size());
  return 200;
}

}  // namespace gpucompute::metrics
