#include "client/cpp/session.h"

#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gpucompute/v1/limits.h"
#include "common/wire_format.h"

namespace gpucompute {
namespace {

void NameClient(const ClientOptions& options, grpc::ClientContext* context) {
  if (!options.client_name.empty()) context->AddMetadata(kClientMetadataKey, options.client_name);
  if (!options.token.empty()) context->AddMetadata("authorization", "Bearer " + options.token);
  // A proxy routes the session on it, as every other call.
  if (!options.tenant.empty()) context->AddMetadata(kTenantMetadataKey, options.tenant);
}

OperationFuture Resolved(absl::StatusOr<v1::Operation> value) {
  std::promise<absl::StatusOr<v1::Operation>> promise;
  promise.set_value(std::move(value));
  return OperationFuture(promise.get_future().share());
}

}  // namespace

std::string TagRef(std::string_view tag) { return kTagPrefix + std::string(tag); }

// The call's reactor: passes each reaction to the Session, and reads answers until the
// server ends the call.
class Session::Stream final
    : public grpc::ClientBidiReactor<v1::SessionRequest, v1::SessionResponse> {
 public:
  explicit Stream(Session& session) : session_(session) {}

  void Start() {
    // Writes start from Submit, outside any reaction: the hold keeps the call open for
    // them until the session ends its writes.
    AddHold();
    StartRead(&answers_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      session_.OnReadsEnded();
      return;
    }
    session_.OnAnswers(answers_);
    answers_.Clear();
    StartRead(&answers_);
  }
  void OnWriteDone(bool ok) override { session_.OnWriteDone(ok); }
  void OnDone(const grpc::Status& status) override { session_.OnDone(status); }

 private:
  Session& session_;
  v1::SessionResponse answers_;
};

Session::Session(Client& client, AnswerFn on_answer)
    : stub_(v1::SessionService::NewStub(client.channel())), on_answer_(std::move(on_answer)) {
  NameClient(client.options(), &context_);
}

absl::StatusOr<std::unique_ptr<Session>> Session::Open(Client& client, AnswerFn on_answer) {
  std::unique_ptr<Session> session(new Session(client, std::move(on_answer)));
  session->stream_ = std::make_unique<Stream>(*session);
  session->stub_->async()->Session(&session->context_, session->stream_.get());
  session->stream_->Start();
  return session;
}

Session::~Session() {
  bool ended;
  {
    absl::MutexLock lock(&mu_);
    ended = ended_;
  }
  if (!ended) (void)Cancel();
}

Session::Submitted Session::Submit(v1::SubmitRequest request, std::string tag) {
  v1::ChainStep step;
  *step.mutable_op() = std::move(request);
  // The tag's few bytes are left out: the bound is approximate by design.
  const size_t bytes = step.ByteSizeLong();
  std::shared_future<absl::StatusOr<v1::Operation>> future;
  const v1::SessionRequest* write = nullptr;
  {
    absl::MutexLock lock(&queue_mu_);
    // Waits for room before the tag is numbered, so that numbers follow queue order.
    auto room = [this, bytes]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return queued_.ops().empty() || closing_ || writes_ended_ ||
             (queued_.ops_size() < kMaxBatchOps && queued_bytes_ + bytes <= kMaxBatchBytes);
    };
    queue_mu_.Await(absl::Condition(&room));
    ++submitted_;
    if (tag.empty()) tag = absl::StrCat("#", submitted_);
    if (closing_) return {tag, Resolved(absl::FailedPreconditionError("the session is closed"))};
    {
      absl::MutexLock pending_lock(&mu_);
      if (ended_) return {tag, Resolved(end_status_)};
      auto [it, inserted] = pending_.try_emplace(tag);
      if (!inserted) {
        return {tag, Resolved(absl::InvalidArgumentError(
                         absl::StrCat("tag '", tag, "' is already in flight in this session")))};
      }
      future = it->second.get_future().share();
    }
    // Once the writes have ended (a write failed, or the server ended the call), the
    // call's status resolves the future.
    if (!writes_ended_) {
      step.set_tag(tag);
      *queued_.add_ops() = std::move(step);
      queued_bytes_ += bytes;
      write = TakeQueuedLocked();
    }
  }
  if (write != nullptr) stream_->StartWrite(write);
  return {std::move(tag), OperationFuture(std::move(future))};
}

const v1::SessionRequest* Session::TakeQueuedLocked() {
  if (writing_ || writes_ended_ || write_failed_ || reads_ended_ || queued_.ops().empty()) {
    return nullptr;
  }
  writing_message_.Swap(&queued_);
  queued_.Clear();
  queued_bytes_ = 0;
  writing_ = true;
  return &writing_message_;
}

bool Session::EndWritesLocked() {
  if (writing_ || writes_ended_ || !(closing_ || write_failed_ || reads_ended_)) return false;
  writes_ended_ = true;
  queued_.Clear();
  queued_bytes_ = 0;
  return true;
}

void Session::EndWrites(bool send_writes_done) {
  if (send_writes_done) stream_->StartWritesDone();
  stream_->RemoveHold();
}

void Session::OnWriteDone(bool ok) {
  const v1::SessionRequest* next = nullptr;
  bool end = false;
  bool clean = false;
  {
    absl::MutexLock lock(&queue_mu_);
    writing_message_.Clear();
    writing_ = false;
    // A failed write means the call is over: OnDone resolves the futures with its status.
    if (!ok) write_failed_ = true;
    next = TakeQueuedLocked();
    if (next == nullptr) {
      end = EndWritesLocked();
      clean = !write_failed_ && !reads_ended_;
    }
  }
  if (next != nullptr) stream_->StartWrite(next);
  if (end) EndWrites(clean);
}

void Session::OnReadsEnded() {
  bool end;
  {
    absl::MutexLock lock(&queue_mu_);
    reads_ended_ = true;
    end = EndWritesLocked();
  }
  // No answer can come any more: nothing more is written, and the call can end.
  if (end) EndWrites(false);
}

void Session::OnAnswers(v1::SessionResponse& message) {
  if (on_answer_) {
    for (const v1::ChainStepResult& answer : message.answers()) {
      on_answer_(answer.tag(), answer.operation());
    }
  }
  absl::MutexLock lock(&mu_);
  for (v1::ChainStepResult& answer : *message.mutable_answers()) {
    auto it = pending_.find(answer.tag());
    if (it == pending_.end()) continue;  // not ours: ignore
    it->second.set_value(std::move(*answer.mutable_operation()));
    pending_.erase(it);
  }
}

void Session::OnDone(const grpc::Status& grpc_status) {
  const absl::Status status = FromGrpcStatus(grpc_status);
  absl::MutexLock lock(&mu_);
  const absl::Status unanswered =
      status.ok() ? absl::UnavailableError("the session ended before answering") : status;
  for (auto& [tag, promise] : pending_) promise.set_value(unanswered);
  pending_.clear();
  end_status_ = status;
  ended_ = true;
}

absl::Status Session::Join() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&ended_));
  return end_status_;
}

absl::Status Session::Close() {
  bool end;
  bool clean;
  {
    absl::MutexLock lock(&queue_mu_);
    closing_ = true;
    // The operations already queued go first: OnWriteDone ends the writes after them.
    end = EndWritesLocked();
    clean = !write_failed_ && !reads_ended_;
  }
  if (end) EndWrites(clean);
  return Join();
}

absl::Status Session::Cancel() {
  {
    absl::MutexLock lock(&queue_mu_);
    closing_ = true;
  }
  context_.TryCancel();
  bool end;
  {
    // A write in flight fails once the call is cancelled, and its OnWriteDone ends the
    // writes; otherwise they end here.
    absl::MutexLock lock(&queue_mu_);
    end = EndWritesLocked();
  }
  if (end) EndWrites(false);
  return Join();
}

std::string Chain::Add(v1::SubmitRequest op, std::string tag) {
  Changing();
  if (tag.empty()) tag = absl::StrCat("#", request_.steps_size() + 1);
  v1::ChainStep* step = request_.add_steps();
  step->set_tag(tag);
  *step->mutable_op() = std::move(op);
  return tag;
}

Chain& Chain::Keep(std::string_view tag) {
  Changing();
  request_.add_keep(std::string(tag));
  return *this;
}

Chain& Chain::OnStream(std::string_view stream_id) {
  Changing();
  request_.set_stream_id(std::string(stream_id));
  return *this;
}

Chain& Chain::SeparateLaunches(bool separate) {
  Changing();
  request_.set_separate_launches(separate);
  return *this;
}

grpc::ByteBuffer Chain::Bytes() const {
  // A chain moved from has no cache (and no steps).
  if (encoded_ == nullptr) return wire::Serialize(request_);
  absl::MutexLock lock(&encoded_->mu);
  if (!encoded_->bytes) encoded_->bytes = wire::Serialize(request_);
  return *encoded_->bytes;
}

absl::StatusOr<v1::ChainResponse> Chain::Run(Client& client) const {
  // The request goes as its bytes, on the path a generated stub's call takes (one batch
  // of operations, so one wake-up; gRPC's generic stub makes two), and the answer is
  // parsed as a generated stub would.
  static const std::string kMethod =
      absl::StrCat("/", v1::SessionService::service_full_name(), "/RunChain");
  const grpc::internal::RpcMethod method(kMethod.c_str(), grpc::internal::RpcMethod::NORMAL_RPC,
                                         client.channel());
  const grpc::ByteBuffer request = Bytes();
  grpc::ClientContext context;
  NameClient(client.options(), &context);
  if (client.options().timeout != absl::InfiniteDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + client.options().timeout));
  }
  v1::ChainResponse response;
  const grpc::Status status =
      grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, v1::ChainResponse>(
          client.channel().get(), method, &context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  // A chain run as one operation names it once: each step is given its id and stream
  // back, as each step of a chain planned step by step has its own.
  if (!response.operation_id().empty()) {
    for (v1::ChainStepResult& step : *response.mutable_steps()) {
      v1::Operation& op = *step.mutable_operation();
      op.set_id(response.operation_id());
      op.set_stream_id(response.stream_id());
      op.mutable_timing()->set_stream_id(response.stream_id());
    }
  }
  return response;
}

}  // namespace gpucompute
