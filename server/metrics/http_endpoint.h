// The HTTP side of metrics: GET /metrics answers with the text a callback renders at
// each request (the Prometheus pull model), and GET /readyz, where a readiness callback
// is given, answers 200 or 503 (a plaintext readiness probe for Kubernetes, whose gRPC
// probe cannot speak TLS). Served by civetweb on threads of its own, apart from the gRPC
// server; nothing else is served (no files, no directory listings).
#ifndef GPUCOMPUTE_SERVER_METRICS_HTTP_ENDPOINT_H_
#define GPUCOMPUTE_SERVER_METRICS_HTTP_ENDPOINT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct mg_context;
struct mg_connection;

namespace gpucompute::metrics {

class HttpEndpoint {
 public:
  using Render = std::function<std::string()>;
  // OK when the server is ready for calls; otherwise why not.
  using Readiness = std::function<absl::Status()>;

  // Listens on `listen`: IPv4:PORT, [IPv6]:PORT, or :PORT / PORT for every interface;
  // "localhost" is 127.0.0.1; port 0 picks a free one. `render` may be called on several
  // threads at once, and so may `ready`, which when set serves /readyz: 200 "ready", or
  // 503 with the status's message. INVALID_ARGUMENT for a malformed address, UNAVAILABLE
  // when it cannot listen.
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(const std::string& listen,
                                                             Render render,
                                                             Readiness ready = nullptr);
  // Stops listening and waits for requests in progress.
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  int port() const { return port_; }

 private:
  HttpEndpoint(Render render, Readiness ready)
      : render_(std::move(render)), ready_(std::move(ready)) {}
  static int Handle(::mg_connection* conn, void* self);
  static int HandleReady(::mg_connection* conn, void* self);

  Render render_;
  Readiness ready_;
  mg_context* context_ = nullptr;
  int port_ = 0;
  // Where the endpoint reaches its own listener, to wake it when stopping.
  int self_family_ = 0;
  std::string self_host_;
};

}  // namespace gpucompute::metrics

#endif  // GPUCOMPUTE_SERVER_METRICS_HTTP_ENDPOINT_H_
