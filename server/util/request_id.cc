#include "server/util/request_id.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "gpucompute/v1/limits.h"
#include "server/tenancy/auth.h"
#include "server/util/ids.h"
#include "server/util/log.h"

namespace gpucompute {
namespace {

using grpc::experimental::InterceptionHookPoints;

absl::string_view View(grpc::string_ref ref) { return {ref.data(), ref.size()}; }

// Codes that say the server, not the caller, has a problem.
bool IsServerSide(grpc::StatusCode code) {
  return code == grpc::StatusCode::INTERNAL || code == grpc::StatusCode::UNKNOWN ||
         code == grpc::StatusCode::DATA_LOSS || code == grpc::StatusCode::UNAVAILABLE;
}

// grpc::StatusCode and absl::StatusCode share their values (google.rpc.Code).
std::string CodeName(grpc::StatusCode code) {
  std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  return name.empty() ? absl::StrCat("CODE_", static_cast<int>(code)) : name;
}

class RequestIdInterceptor final : public grpc::experimental::Interceptor {
 public:
  RequestIdInterceptor(grpc::experimental::ServerRpcInfo* info, const Authenticator* auth)
      : info_(info), auth_(auth) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      ReadMetadata(*methods->GetRecvInitialMetadata());
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_INITIAL_METADATA) &&
        !id_.empty()) {
      methods->GetSendInitialMetadata()->emplace(kRequestIdMetadataKey, id_);
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      LogFailure(methods->GetSendStatus());
    }
    methods->Proceed();
  }

 private:
  void ReadMetadata(std::multimap<grpc::string_ref, grpc::string_ref>& metadata) {
    if (auto it = metadata.find(kClientMetadataKey); it != metadata.end()) {
      client_ = std::string(View(it->second));
    }
    auto it = metadata.find(kRequestIdMetadataKey);
    if (it == metadata.end()) {
      id_ = NewId("req-");
      // The map refers to our copy, which lives as long as the call.
      metadata.emplace(kRequestIdMetadataKey, id_);
    } else if (CheckRequestId(View(it->second)).ok()) {
      id_ = std::string(View(it->second));
    } else {
      // The handler refuses the call; the log line shows (a bounded copy of) what came.
      invalid_id_ = std::string(View(it->second).substr(0, kMaxRequestIdBytes + 1));
    }
  }

  void LogFailure(const grpc::Status& status) {
    if (status.ok()) return;
    const std::string code = CodeName(status.error_code());
    const absl::string_view method = info_->method() == nullptr ? "" : info_->method();
    const std::string client = client_.empty() ? std::string(kDefaultClient) : client_;
    const std::string error = status.error_message();  // a copy: fields only refer to it
    const std::string tenant = Tenant();
    const LogField fields[] = {{"request_id", id_.empty() ? invalid_id_ : id_},
                               {"method", method},
                               {"tenant", tenant},
                               {"client", client},
                               {"code", code},
                               {"error", error}};
    if (IsServerSide(status.error_code())) {
      Log(LogLevel::kError, "call failed", fields);
    } else {
      ServerRateLimitedLog().Log(absl::StrCat("rpc_error:", method, ":", code), LogLevel::kWarning,
                                 "call refused", fields);
    }
  }

  // The caller's tenant as its credentials name it, for the log line of a failed call
  // (authenticated again here: the success path pays nothing for it).
  std::string Tenant() const {
    if (auth_ == nullptr) return "";
    const grpc::ServerContextBase* context = info_->server_context();
    if (context == nullptr) return "";
    absl::StatusOr<Identity> identity = auth_->AuthenticateCall(*context);
    return identity.ok() ? identity->tenant : "(unauthenticated)";
  }

  grpc::experimental::ServerRpcInfo* const info_;
  const Authenticator* const auth_;  // null without authentication
  std::string id_;                   // the call's id; empty if the client's was invalid
  std::string invalid_id_;           // the client's invalid id
  std::string client_;
};

class RequestIdInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RequestIdInterceptorFactory(const Authenticator* auth) : auth_(auth) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RequestIdInterceptor(info, auth_);
  }

 private:
  const Authenticator* const auth_;
};

}  // namespace

absl::Status CheckRequestId(absl::string_view id) {
  const bool printable =
      std::all_of(id.begin(), id.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
  if (id.empty() || id.size() > kMaxRequestIdBytes || !printable) {
    return absl::InvalidArgumentError(absl::StrCat("metadata '", kRequestIdMetadataKey,
                                                   "' must be 1 to ", kMaxRequestIdBytes,
                                                   " printable ASCII characters"));
  }
  return absl::OkStatus();
}

std::string RequestId(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kRequestIdMetadataKey);
  if (it == metadata.end() || !CheckRequestId(View(it->second)).ok()) return "";
  return std::string(View(it->second));
}

absl::Status CheckCallMetadata(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kRequestIdMetadataKey);
  if (it == metadata.end()) return absl::OkStatus();
  return CheckRequestId(View(it->second));
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeRequestIdInterceptorFactory(const Authenticator* auth) {
  return std::make_unique<RequestIdInterceptorFactory>(auth);
}

}  // namespace gpucompute
