// SessionService.Session through gRPC's synchronous API (--session-handler=sync), to
// compare with the callback API (session_service.cc): the handler's thread, one of the
// server's synchronous pool, makes the blocking reads the session asks for, and a thread
// of the session's own makes its writes. The logic is the same (session_core.h).
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/service/services.h"
#include "server/service/session_core.h"
#include "server/util/thread_name.h"

namespace gpucompute {
namespace {

using SyncStream = grpc::ServerReaderWriter<v1::SessionResponse, v1::SessionRequest>;

class SyncSessionIo final : public SessionIo {
 public:
  explicit SyncSessionIo(SyncStream* stream) : stream_(stream) {}

  void Read(v1::SessionRequest* request) override {
    absl::MutexLock lock(&mu_);
    read_ = request;
  }
  void Write(const v1::SessionResponse* response) override {
    absl::MutexLock lock(&mu_);
    write_ = response;
  }
  void End(grpc::Status status) override {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    ended_ = true;
  }

  // Serves `core` on this thread (reads) and on a writer thread until it ends; returns
  // the status it ended with.
  grpc::Status Serve(SessionCore& core, grpc::ServerContext& context) {
    std::thread writer([this, &core] {
      NameThisThread("session-write");
      for (;;) {
        const v1::SessionResponse* response = nullptr;
        {
          absl::MutexLock lock(&mu_);
          mu_.Await(absl::Condition(
              +[](SyncSessionIo* io) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io->mu_) {
                return io->write_ != nullptr || io->ended_;
              },
              this));
          if (write_ == nullptr) return;  // ended, with no write outstanding
          response = std::exchange(write_, nullptr);
        }
        core.OnWriteDone(stream_->Write(*response));
      }
    });
    for (;;) {
      v1::SessionRequest* request = nullptr;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](SyncSessionIo* io) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io->mu_) {
              return io->read_ != nullptr || io->ended_;
            },
            this));
        if (read_ == nullptr) break;  // ended
        request = std::exchange(read_, nullptr);
      }
      const bool ok = stream_->Read(request);
      // A read fails when the client has closed its side, or when the call is cancelled,
      // which the synchronous API tells only through the context.
      if (!ok && context.IsCancelled()) core.OnCancel();
      core.OnReadDone(ok);
    }
    writer.join();
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  SyncStream* const stream_;
  absl::Mutex mu_;
  v1::SessionRequest* read_ ABSL_GUARDED_BY(mu_) = nullptr;
  const v1::SessionResponse* write_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::Status SyncSessionServiceImpl::Session(grpc::ServerContext* context, SyncStream* stream) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status s = CheckBackendHealthy(ctx_.backend); !s.ok()) return ToGrpcStatus(s);
  SyncSessionIo io(stream);
  auto core = std::make_shared<SessionCore>(ctx_, std::move(caller->scope), &io);
  core->Start();
  grpc::Status status = io.Serve(*core, *context);
  core->Detach();  // completions may still hold the core; the stream goes with this call
  return status;
}

}  // namespace gpucompute
