#include "client/session.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gpucompute/v1/limits.h"

namespace gpucompute {
namespace {

void NameClient(const ClientOptions& options, grpc::ClientContext* context) {
  if (!options.client_name.empty()) context->AddMetadata(kClientMetadataKey, options.client_name);
  if (!options.token.empty()) context->AddMetadata("authorization", "Bearer " + options.token);
}

OperationFuture Resolved(absl::StatusOr<v1::Operation> value) {
  std::promise<absl::StatusOr<v1::Operation>> promise;
  promise.set_value(std::move(value));
  return OperationFuture(promise.get_future().share());
}

}  // namespace

std::string TagRef(std::string_view tag) { return kTagPrefix + std::string(tag); }

Session::Session(Client& client, AnswerFn on_answer)
    : stub_(v1::SessionService::NewStub(client.channel())), on_answer_(std::move(on_answer)) {
  NameClient(client.options(), &context_);
}

absl::StatusOr<std::unique_ptr<Session>> Session::Open(Client& client, AnswerFn on_answer) {
  std::unique_ptr<Session> session(new Session(client, std::move(on_answer)));
  session->stream_ = session->stub_->Session(&session->context_);
  if (session->stream_ == nullptr) return absl::UnavailableError("cannot start a session");
  session->reader_ = std::thread([s = session.get()] { s->ReadAnswers(); });
  return session;
}

Session::~Session() {
  if (reader_.joinable()) (void)Cancel();
}

Session::Submitted Session::Submit(v1::SubmitRequest request, std::string tag) {
  v1::ChainStep step;
  *step.mutable_op() = std::move(request);
  // The tag's few bytes are left out: the bound is approximate by design.
  const size_t bytes = step.ByteSizeLong();
  std::shared_future<absl::StatusOr<v1::Operation>> future;
  {
    absl::MutexLock lock(&queue_mu_);
    // Waits for room before the tag is numbered, so that numbers follow queue order.
    auto room = [this, bytes]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return queued_.ops().empty() || writes_done_ || write_failed_ ||
             (queued_.ops_size() < kMaxBatchOps && queued_bytes_ + bytes <= kMaxBatchBytes);
    };
    queue_mu_.Await(absl::Condition(&room));
    ++submitted_;
    if (tag.empty()) tag = absl::StrCat("#", submitted_);
    if (writes_done_) {
      return {tag, Resolved(absl::FailedPreconditionError("the session is closed"))};
    }
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
    // After a failed write the reader resolves the future with the call's status.
    if (!write_failed_) {
      step.set_tag(tag);
      *queued_.add_ops() = std::move(step);
      queued_bytes_ += bytes;
    }
    if (writing_) return {std::move(tag), OperationFuture(std::move(future))};
    writing_ = true;
  }
  WriteQueued();
  return {std::move(tag), OperationFuture(std::move(future))};
}

void Session::WriteQueued() {
  v1::SessionRequest message;
  absl::MutexLock lock(&queue_mu_);
  while (!queued_.ops().empty() && !write_failed_) {
    message.Swap(&queued_);
    queued_bytes_ = 0;
    queue_mu_.Unlock();
    // A failed write means the call is over; the reader then resolves the futures with
    // the call's status.
    const bool written = stream_->Write(message);
    message.Clear();
    queue_mu_.Lock();
    if (!written) write_failed_ = true;
  }
  queued_.Clear();
  queued_bytes_ = 0;
  writing_ = false;
}

void Session::AwaitWrittenLocked() {
  queue_mu_.Await(absl::Condition(
      +[](bool* writing) { return !*writing; }, &writing_));
}

void Session::ReadAnswers() {
  v1::SessionResponse message;
  while (stream_->Read(&message)) {
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
  absl::Status status = FromGrpcStatus(stream_->Finish());
  FailPending(status.ok() ? absl::UnavailableError("the session ended before answering") : status);
  absl::MutexLock lock(&mu_);
  end_status_ = status;
}

void Session::FailPending(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  ended_ = true;
  for (auto& [tag, promise] : pending_) promise.set_value(status);
  pending_.clear();
}

absl::Status Session::Join() {
  if (reader_.joinable()) reader_.join();
  absl::MutexLock lock(&mu_);
  return end_status_;
}

absl::Status Session::Close() {
  {
    absl::MutexLock lock(&queue_mu_);
    if (!writes_done_) {
      writes_done_ = true;
      AwaitWrittenLocked();  // the operations already queued go first
      if (!write_failed_) (void)stream_->WritesDone();
    }
  }
  return Join();
}

absl::Status Session::Cancel() {
  {
    absl::MutexLock lock(&queue_mu_);
    writes_done_ = true;
  }
  context_.TryCancel();
  {
    // A write in flight fails once the call is cancelled.
    absl::MutexLock lock(&queue_mu_);
    AwaitWrittenLocked();
  }
  return Join();
}

std::string Chain::Add(v1::SubmitRequest op, std::string tag) {
  if (tag.empty()) tag = absl::StrCat("#", request_.steps_size() + 1);
  v1::ChainStep* step = request_.add_steps();
  step->set_tag(tag);
  *step->mutable_op() = std::move(op);
  return tag;
}

Chain& Chain::Keep(std::string_view tag) {
  request_.add_keep(std::string(tag));
  return *this;
}

Chain& Chain::OnStream(std::string_view stream_id) {
  request_.set_stream_id(std::string(stream_id));
  return *this;
}

absl::StatusOr<v1::ChainResponse> Chain::Run(Client& client) const {
  std::unique_ptr<v1::SessionService::Stub> stub = v1::SessionService::NewStub(client.channel());
  grpc::ClientContext context;
  NameClient(client.options(), &context);
  if (client.options().timeout != absl::InfiniteDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + client.options().timeout));
  }
  v1::ChainResponse response;
  grpc::Status status = stub->RunChain(&context, request_, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

}  // namespace gpucompute
