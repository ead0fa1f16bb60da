// Request ids, and the log line of every failed call, for every RPC of every service,
// in one place: a server interceptor (registered in server.cc).
//
// A call's id is the client's metadata "x-request-id" when it sent a valid one (1 to
// kMaxRequestIdBytes printable ASCII characters), else one the server generates
// ("req-" and 32 hex digits). The interceptor adds a generated id to the call's client
// metadata, so that handlers find every call's id in the same place (RequestId), and
// returns the id in the call's initial metadata. It cannot refuse a call: a handler
// refuses an invalid id with INVALID_ARGUMENT (CheckCallMetadata, which ClientName
// calls), and such a call gets no id back.
//
// When a call ends with an error, the interceptor logs it, with its id, method, tenant
// (as the call's credentials name it, "(unauthenticated)" when they name none), client
// and code: server-side failures (INTERNAL, UNKNOWN, DATA_LOSS, UNAVAILABLE) at error
// level, every time; errors a client caused at warning level, rate-limited per method
// and code (ServerRateLimitedLog).
#ifndef GPUCOMPUTE_SERVER_UTIL_REQUEST_ID_H_
#define GPUCOMPUTE_SERVER_UTIL_REQUEST_ID_H_

#include <memory>
#include <string>

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_interceptor.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/tenancy/auth.h"

namespace gpucompute {

// OK if `id` may be a request id.
absl::Status CheckRequestId(absl::string_view id);

// The call's request id; empty if the client sent an invalid one.
std::string RequestId(const grpc::ServerContextBase& context);

// INVALID_ARGUMENT if the client's request id is invalid.
absl::Status CheckCallMetadata(const grpc::ServerContextBase& context);

// `auth` (null without authentication) names the tenant in log lines; it must outlive
// the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeRequestIdInterceptorFactory(const Authenticator* auth);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_UTIL_REQUEST_ID_H_
