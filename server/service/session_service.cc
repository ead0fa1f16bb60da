// SessionService.Session through gRPC's callback API:
// a bidirectional stream of tagged operations, each planned and queued as it arrives and
// answered as it completes (the contract is in the proto; the logic in session_core.h).
//
// A message costs far more than an operation: gRPC hands each read and each write to a
// thread of its own. So a request carries many operations, and while one answer message
// is on the wire the answers that complete meanwhile gather into the next.
#include <memory>
#include <utility>

#include "server/service/services.h"
#include "server/service/session_core.h"

namespace gpucompute {
namespace {

using SessionStream = grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>;

// Serves a session through the callback API: gRPC calls back when a read or a write is
// done, on a thread of its own.
class SessionReactor final : public SessionStream, private SessionIo {
 public:
  SessionReactor(ServiceContext& ctx, Caller caller, Credential credential)
      : core_(std::make_shared<SessionCore>(ctx, std::move(caller.scope), std::move(credential),
                                            static_cast<SessionIo*>(this))),
        admission_(std::move(caller.admission)) {
    core_->Start();
  }

  void OnReadDone(bool ok) override { core_->OnReadDone(ok); }
  void OnWriteDone(bool ok) override { core_->OnWriteDone(ok); }
  void OnCancel() override { core_->OnCancel(); }
  void OnDone() override {
    core_->Detach();
    delete this;
  }

 private:
  void Read(v1::SessionRequest* request) override { StartRead(request); }
  void Write(const v1::SessionResponse* response) override { StartWrite(response); }
  void End(grpc::Status status) override { Finish(std::move(status)); }

  std::shared_ptr<SessionCore> core_;
  std::shared_ptr<const void> admission_;  // the call's, until OnDone
};

}  // namespace

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* SessionServiceImpl::Session(
    grpc::CallbackServerContext* context) {
  using Refuse = Refusal<SessionStream>;
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return new Refuse(caller.status());
  // The session checks its token's standing before each request it acts on.
  Credential credential;
  if (ctx_.auth != nullptr) {
    absl::StatusOr<Identity> identity = ctx_.auth->AuthenticateCall(*context);
    if (!identity.ok()) return new Refuse(identity.status());
    credential = identity->credential;
  }
  if (absl::Status s = CheckBackendHealthy(ctx_.backend); !s.ok()) return new Refuse(s);
  return new SessionReactor(ctx_, *std::move(caller), std::move(credential));
}

}  // namespace gpucompute
