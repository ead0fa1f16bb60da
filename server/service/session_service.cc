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

using SessionStream = grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

// Serves a session through the callback API: gRPC calls back when a read or a write is
// done, on a thread of its own. Served raw, so that a request that does not parse ends
// the session with INVALID_ARGUMENT; gRPC's own parsing would report it as the end of
// the requests.
class SessionReactor final : public SessionStream, private SessionIo {
 public:
  SessionReactor(ServiceContext& ctx, Caller caller)
      : core_(std::make_shared<SessionCore>(ctx, std::move(caller.scope),
                                            std::move(caller.credential),
                                            static_cast<SessionIo*>(this))),
        admission_(std::move(caller.admission)) {
    core_->Start();
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      if (absl::Status parsed = ParseRequest(read_bytes_, request_); !parsed.ok()) {
        return core_->OnReadRefused(std::move(parsed));
      }
    }
    core_->OnReadDone(ok);
  }
  void OnWriteDone(bool ok) override { core_->OnWriteDone(ok); }
  void OnCancel() override { core_->OnCancel(); }
  void OnDone() override {
    core_->Detach();
    delete this;
  }

 private:
  void Read(v1::SessionRequest* request) override {
    request_ = request;
    StartRead(&read_bytes_);
  }
  void Write(const v1::SessionResponse* response) override {
    write_bytes_ = SerializeResponse(*response);
    StartWrite(&write_bytes_);
  }
  void End(grpc::Status status) override { Finish(std::move(status)); }

  std::shared_ptr<SessionCore> core_;
  std::shared_ptr<const void> admission_;  // the call's, until OnDone
  // One read and one write at most are outstanding (SessionIo), each with its bytes.
  v1::SessionRequest* request_ = nullptr;
  grpc::ByteBuffer read_bytes_;
  grpc::ByteBuffer write_bytes_;
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* SessionServiceImpl::Session(
    grpc::CallbackServerContext* context) {
  using Refuse = Refusal<SessionStream>;
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return new Refuse(caller.status());
  if (absl::Status s = CheckBackendHealthy(ctx_.backend); !s.ok()) return new Refuse(s);
  return new SessionReactor(ctx_, *std::move(caller));
}

}  // namespace gpucompute
