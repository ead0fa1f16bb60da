// What the Client's source files share and its public header keeps private: the
// generated stubs, the context every call starts from, the one way to make a unary
// call, and the registry of asynchronous operation calls.
#ifndef GPUCOMPUTE_CLIENT_CPP_CLIENT_INTERNAL_H_
#define GPUCOMPUTE_CLIENT_CPP_CLIENT_INTERNAL_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "gpucompute/v1/gpucompute.grpc.pb.h"

namespace gpucompute {

// The four generated stubs, sharing the Client's channel.
struct Client::Stubs {
  explicit Stubs(const std::shared_ptr<grpc::Channel>& channel)
      : buffers(v1::BufferService::NewStub(channel)),
        streams(v1::StreamService::NewStub(channel)),
        operations(v1::OperationService::NewStub(channel)),
        server(v1::ServerService::NewStub(channel)) {}

  std::unique_ptr<v1::BufferService::Stub> buffers;
  std::unique_ptr<v1::StreamService::Stub> streams;
  std::unique_ptr<v1::OperationService::Stub> operations;
  std::unique_ptr<v1::ServerService::Stub> server;
};

struct Client::Connection {
  Connection(std::string target_in, std::shared_ptr<grpc::Channel> channel_in)
      : target(std::move(target_in)), channel(std::move(channel_in)), stubs(channel) {}

  std::string target;
  std::shared_ptr<grpc::Channel> channel;
  Stubs stubs;
};

namespace client_internal {

// What a call needs to build its context; asynchronous calls keep a copy.
struct CallSettings {
  std::string client_name;
  std::string token;
  absl::Duration timeout;
  std::string request_id;
  std::string tenant;
};

// A context carrying the settings' metadata, and their deadline when `unary`.
std::unique_ptr<grpc::ClientContext> MakeContext(const CallSettings& settings, bool unary);

inline CallSettings SettingsOf(const ClientOptions& options) {
  return CallSettings{options.client_name, options.token, options.timeout, options.request_id,
                      options.tenant};
}

// Every unary call: a fresh context with the deadline, and on failure the server's
// request id attached (FromGrpcStatus with the context).
template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> CallUnary(const CallSettings& settings, Stub* stub,
                                   grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                                const Request&, Response*),
                                   const Request& request) {
  std::unique_ptr<grpc::ClientContext> context = MakeContext(settings, /*unary=*/true);
  Response response;
  grpc::Status status = (stub->*method)(context.get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status, *context);
  return response;
}

inline const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}

class AsyncOperationCall;

// The asynchronous calls in flight. The Client cancels them and waits until they are
// destroyed before it destroys the channel: a channel must not be destroyed from one
// of its own callbacks, which is where the last reference would otherwise drop.
class AsyncCallRegistry {
 public:
  void Add(AsyncOperationCall* call, std::weak_ptr<AsyncOperationCall> handle) {
    absl::MutexLock lock(&mu_);
    calls_.emplace(call, std::move(handle));
  }

  // Called by each call's destructor.
  void Remove(AsyncOperationCall* call) {
    absl::MutexLock lock(&mu_);
    calls_.erase(call);
  }

  void CancelAllAndWait();

  // Submissions reach the server in the order they were made: one Submit RPC is in
  // flight at a time, and the next starts when the previous is answered. The waits
  // that follow run concurrently.
  void QueueSubmit(std::shared_ptr<AsyncOperationCall> call);
  void SubmitAnswered();
  // Blocks until every queued asynchronous submission has been answered, so that a
  // synchronous Submit cannot overtake them.
  void WaitForSubmissions();

 private:
  absl::Mutex mu_;
  std::map<AsyncOperationCall*, std::weak_ptr<AsyncOperationCall>> calls_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<AsyncOperationCall>> submit_queue_ ABSL_GUARDED_BY(mu_);
  bool submitting_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace client_internal

template <typename Call>
auto Client::Routed(const Call& call, const std::function<bool()>& again) {
  auto result = call(*connection());
  if (client_internal::StatusOf(result).code() == absl::StatusCode::kFailedPrecondition &&
      Redirect(client_internal::StatusOf(result)) && (!again || again())) {
    result = call(*connection());
  }
  return result;
}

template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> Client::Unary(std::unique_ptr<Stub> Stubs::*stub,
                                       grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                                    const Request&, Response*),
                                       const Request& request) {
  return Routed([&](const Connection& connection) {
    return client_internal::CallUnary(client_internal::SettingsOf(options_),
                                      (connection.stubs.*stub).get(), method, request);
  });
}

}  // namespace gpucompute

#endif  // GPUCOMPUTE_CLIENT_CPP_CLIENT_INTERNAL_H_
