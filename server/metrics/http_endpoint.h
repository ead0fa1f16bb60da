// The HTTP side of metrics: GET /metrics answers with the text a callback renders at
// each request (the Prometheus pull model). Served by civetweb on threads of its own,
// apart from the gRPC server; nothing else is served (no files, no directory listings).
#ifndef GPUCOMPUTE_SERVER_METRICS_HTTP_ENDPOINT_H_
#define GPUCOMPUTE_SERVER_METRICS_HTTP_ENDPOINT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

struct mg_context;
struct mg_connection;

namespace gpucompute::metrics {

class HttpEndpoint {
 public:
  using Render = std::function<std::string()>;

  // Listens on `listen`: IPv4:PORT, [IPv6]:PORT, or :PORT / PORT for every interface;
  // "localhost" is 127.0.0.1; port 0 picks a free one. `render` may be called on several
  // threads at once. INVALID_ARGUMENT for a malformed address, UNAVAILABLE when it cannot
  // listen.
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(const std::string& listen,
                                                             Render render);
  // Stops listening and waits for requests in progress.
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  int port() const { return port_; }

 private:
  explicit HttpEndpoint(Render render) : render_(std::move(render)) {}
  static int Handle(::mg_connection* conn, void* self);

  Render render_;
  mg_context* context_ = nullptr;
  int port_ = 0;
  // Where the endpoint reaches its own listener, to wake it when stopping.
  int self_family_ = 0;
  std::string self_host_;
};

}  // namespace gpucompute::metrics

#endif  // GPUCOMPUTE_SERVER_METRICS_HTTP_ENDPOINT_H_
