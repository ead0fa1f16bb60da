#include "server/service/session_core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/service/services.h"
#include "server/service/tagged_ops.h"

namespace gpucompute {
namespace {

// Answers per message: enough that a busy session writes few messages, few enough that
// a message stays far below any client's receive limit.
constexpr size_t kMaxAnswersPerMessage = 256;

}  // namespace

void SessionCore::Start() {
  {
    absl::MutexLock lock(&mu_);
    reading_ = true;
  }
  io_->Read(&request_);
}

void SessionCore::OnReadDone(bool ok) {
  absl::Status refusal;
  const int ops = ok ? request_.ops_size() : 0;
  if (ok && credential_.revoked()) {
    // Checked per message, not per operation: one atomic load.
    refusal = TokenRevokedError();
  } else if (ops > static_cast<int>(kMaxSessionInFlight)) {
    // The bound on what a session holds is checked between messages, so one message may
    // not carry more than it.
    refusal = absl::InvalidArgumentError(
        absl::StrCat("a session request carried ", ops, " operations; at most ",
                     kMaxSessionInFlight, " (Limits.max_session_in_flight) fit in one"));
  }
  if (ok && refusal.ok()) {
    // A message's operations are launched together once all are queued.
    Executor::LaunchBatch batch(ctx_.executor);
    for (const v1::ChainStep& step : request_.ops()) {
      // A cancelled session plans and queues nothing more.
      if (absl::MutexLock lock(&mu_); StoppedLocked()) break;
      Accept(step);
    }
    SubmitAccepted();
  }
  request_.Clear();
  ReadFinished(ok, std::move(refusal));
}

void SessionCore::OnReadRefused(absl::Status why) {
  request_.Clear();
  ReadFinished(true, std::move(why));
}

void SessionCore::ReadFinished(bool ok, absl::Status refusal) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    reading_ = false;
    if (!refusal.ok()) {
      refused_ = std::move(refusal);
      DropQueuedLocked();
    } else if (ok) {
      want_read_ = true;
    } else {
      read_closed_ = true;
    }
    actions = NextActionsLocked();
  }
  Run(std::move(actions));
}

void SessionCore::Accept(const v1::ChainStep& request) {
  const std::string& name = request.tag();
  absl::Status rejected = CheckBackendHealthy(ctx_.backend);
  if (rejected.ok()) rejected = CheckTag(name);
  bool duplicate = false;
  {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
    if (rejected.ok() && tags_.contains(name)) {
      duplicate = true;
      rejected = absl::InvalidArgumentError(
          absl::StrCat("tag '", name, "' is already used in this session"));
    }
  }
  auto owned = std::make_unique<Tag>();
  Tag* const tag = owned.get();
  tag->name = name;
  if (rejected.ok()) {
    std::vector<std::string> dep_names;
    absl::StatusOr<Plan> plan = PlanTagged(
        ctx_, client_, request.op(), [this](absl::string_view t) { return FindTag(t); },
        &dep_names);
    if (plan.ok()) {
      // The tag is known, with its dependencies, before its operation is queued: the
      // operation may be done, and OnExecuted called, before SubmitPlan returns.
      {
        absl::MutexLock lock(&mu_);
        tag->output = WrittenBuffer(*plan);
        tag->published = plan->created == nullptr;
        for (const std::string& d : dep_names) tag->deps.push_back(tags_.at(d).get());
        tags_.emplace(name, std::move(owned));
        ++executing_;
      }
      plan->spec.on_done = [self = shared_from_this(), tag](const std::shared_ptr<Operation>& op) {
        self->OnExecuted(tag, op);
      };
      Accepted& accepted = accepted_.emplace_back(Accepted{
          tag, RequestKind(request.op()), request.op().stream_id(), *std::move(plan)});
      // A new buffer's name is taken now, as it would be if it were queued now.
      if (absl::Status taken = ReserveCreated(ctx_, accepted.plan); !taken.ok()) {
        accepted_.pop_back();
        Refuse(tag, RequestKind(request.op()), taken);
        return;
      }
      // A new named buffer is queued at once, so that the operations after it in the
      // message find it by its name, as they would if each were queued in turn.
      if (accepted.plan.created != nullptr && !accepted.plan.created->name.empty()) {
        SubmitAccepted();
      }
      return;
    }
    rejected = plan.status();
  }
  absl::MutexLock lock(&mu_);
  if (duplicate || name.empty()) {
    v1::Operation answer;
    answer.set_kind(RequestKind(request.op()));
    MarkFailed(rejected, &answer);
    AnswerLocked(name, std::move(answer));
    return;
  }
  // A rejected tag stays known, so that its dependents fail naming it.
  tags_.emplace(name, std::move(owned));
  RejectLocked(tag, RequestKind(request.op()), rejected);
}

void SessionCore::SubmitAccepted() {
  if (accepted_.empty()) return;
  std::vector<Executor::SubmitItem> items;
  items.reserve(accepted_.size());
  for (Accepted& a : accepted_) items.push_back({a.stream_id, &a.plan.spec});
  Executor::Submitted submitted = ctx_.executor.SubmitAll(client_, items);
  const size_t queued = submitted.operations.size();
  for (size_t i = 0; i < queued; ++i) Published(accepted_[i]);
  if (queued < accepted_.size()) {
    if (accepted_[queued].plan.created != nullptr) {
      ctx_.registry.Unreserve(accepted_[queued].plan.created);
    }
    Refuse(accepted_[queued].tag, accepted_[queued].kind, submitted.refused);
    // The rest were planned before that refusal, which fails those that depend on it;
    // the others are queued one by one.
    for (size_t i = queued + 1; i < accepted_.size(); ++i) {
      Accepted& a = accepted_[i];
      absl::Status failed_dependency;
      {
        absl::MutexLock lock(&mu_);
        for (const Tag* dep : a.tag->deps) {
          if (dep->decided && !dep->error.ok()) {
            failed_dependency = FailedDependencyError(dep->name, dep->error);
            break;
          }
        }
      }
      if (!failed_dependency.ok()) {
        if (a.plan.created != nullptr) ctx_.registry.Unreserve(a.plan.created);
        Refuse(a.tag, a.kind, failed_dependency);
        continue;
      }
      const BufferHandle created = a.plan.created;
      absl::StatusOr<std::shared_ptr<Operation>> op =
          SubmitReserved(ctx_, client_, a.stream_id, std::move(a.plan));
      if (op.ok()) {
        a.plan.created = created;
        RecordTemporary(a);
        MarkPublished(a.tag);
      } else {
        Refuse(a.tag, a.kind, op.status());
      }
    }
  }
  accepted_.clear();
}

void SessionCore::Published(Accepted& accepted) {
  if (accepted.plan.created == nullptr) return;
  // Published only once its writer is queued (SubmitReserved says why).
  ctx_.registry.Publish(accepted.plan.created);
  RecordTemporary(accepted);
  MarkPublished(accepted.tag);
}

void SessionCore::MarkPublished(Tag* tag) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    tag->published = true;
    // The operation may have finished before its output was published: its answer,
    // and those of its dependents, were held back until now.
    DecideLocked(tag);
    actions = NextActionsLocked();
  }
  Run(std::move(actions));
}

void SessionCore::RecordTemporary(const Accepted& accepted) {
  if (accepted.plan.created == nullptr || !accepted.plan.created->name.empty()) return;
  absl::MutexLock lock(&mu_);
  temporaries_.push_back(accepted.plan.created->id);
}

void SessionCore::Refuse(Tag* tag, v1::OperationKind kind, const absl::Status& error) {
  // Nothing ran, and whatever depends on it is refused in turn: it becomes a rejected tag.
  absl::MutexLock lock(&mu_);
  --executing_;
  tag->deps.clear();
  RejectLocked(tag, kind, error);
}

void SessionCore::RejectLocked(Tag* tag, v1::OperationKind kind, const absl::Status& error) {
  v1::Operation answer;
  answer.set_kind(kind);
  MarkFailed(error, &answer);
  AnswerLocked(tag->name, std::move(answer));
  tag->decided = true;
  tag->error = error;
}

absl::StatusOr<BufferHandle> SessionCore::FindTag(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  auto it = tags_.find(name);
  if (it == tags_.end()) return UnknownTagError(name);
  const Tag& tag = *it->second;
  if (tag.decided && !tag.error.ok()) return FailedDependencyError(name, tag.error);
  BufferHandle output = tag.output.lock();
  if (output == nullptr) {
    return absl::NotFoundError(absl::StrCat("the buffer tag '", name, "' wrote was deleted"));
  }
  return output;
}

void SessionCore::OnExecuted(Tag* tag, const std::shared_ptr<Operation>& op) {
  v1::Operation result;
  ToProto(Executor::FinalStatus(*op), &result);
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    tag->executed = true;
    --executing_;
    tag->result = std::move(result);
    DecideLocked(tag);
    actions = NextActionsLocked();
  }
  Run(std::move(actions));
}

void SessionCore::DecideLocked(Tag* first) {
  std::vector<Tag*> work = {first};
  while (!work.empty()) {
    Tag* tag = work.back();
    work.pop_back();
    if (tag->decided || !tag->executed || !tag->published) continue;
    auto undecided =
        std::find_if(tag->deps.begin(), tag->deps.end(), [](const Tag* d) { return !d->decided; });
    if (undecided != tag->deps.end()) {
      (*undecided)->waiters.push_back(tag);
      continue;
    }
    auto failed = std::find_if(tag->deps.begin(), tag->deps.end(),
                               [](const Tag* d) { return !d->error.ok(); });
    if (failed != tag->deps.end()) {
      MarkFailed(FailedDependencyError((*failed)->name, (*failed)->error), &tag->result);
    }
    tag->error = OperationError(tag->result);
    tag->decided = true;
    tag->deps.clear();
    AnswerLocked(tag->name, std::move(tag->result));
    tag->result.Clear();
    work.insert(work.end(), tag->waiters.begin(), tag->waiters.end());
    tag->waiters.clear();
  }
}

void SessionCore::AnswerLocked(absl::string_view tag, v1::Operation op) {
  if (StoppedLocked()) {
    --in_flight_;  // nobody will read it
    return;
  }
  v1::ChainStepResult& answer = answers_.emplace_back();
  answer.set_tag(std::string(tag));
  *answer.mutable_operation() = std::move(op);
}

void SessionCore::OnWriteDone(bool ok) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    in_flight_ -= out_.answers_size();
    out_.Clear();
    writing_ = false;
    if (!ok) {
      broken_ = true;
      DropQueuedLocked();
    }
    actions = NextActionsLocked();
  }
  Run(std::move(actions));
}

void SessionCore::OnCancel() {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    DropQueuedLocked();
    actions = NextActionsLocked();
  }
  Run(std::move(actions));
}

void SessionCore::DropQueuedLocked() {
  // The message being written stays until its OnWriteDone.
  in_flight_ -= answers_.size();
  answers_.clear();
}

void SessionCore::Detach() {
  absl::MutexLock lock(&mu_);
  io_ = nullptr;
}

SessionCore::Actions SessionCore::NextActionsLocked() {
  Actions actions;
  if (finished_) return actions;
  if (!writing_ && !StoppedLocked() && !answers_.empty()) {
    writing_ = true;
    const size_t n = std::min(answers_.size(), kMaxAnswersPerMessage);
    out_.mutable_answers()->Reserve(static_cast<int>(n));
    for (size_t i = 0; i < n; ++i) *out_.add_answers() = std::move(answers_[i]);
    answers_.erase(answers_.begin(), answers_.begin() + static_cast<ptrdiff_t>(n));
    actions.write = &out_;
  }
  if (want_read_ && !reading_ && !read_closed_ && !StoppedLocked() &&
      in_flight_ < kMaxSessionInFlight) {
    want_read_ = false;
    reading_ = true;
    actions.read = true;
  }
  if (!writing_ && !reading_ && executing_ == 0 &&
      (StoppedLocked() || (read_closed_ && in_flight_ == 0))) {
    finished_ = true;
    actions.finish = true;
    actions.status = cancelled_ || broken_
                         ? grpc::Status(grpc::StatusCode::CANCELLED, "the session was cancelled")
                         : ToGrpcStatus(refused_);
    actions.temporaries = std::move(temporaries_);
  }
  return actions;
}

void SessionCore::Run(Actions actions) {
  if (actions.write != nullptr) io_->Write(actions.write);
  if (actions.read) io_->Read(&request_);
  if (actions.finish) {
    // The temporaries go before the call ends, so a client sees them gone once it has
    // its status; queued work still using one keeps its memory until it completes.
    for (const std::string& id : actions.temporaries) (void)ctx_.registry.Remove(client_, id);
    io_->End(std::move(actions.status));
  }
}

}  // namespace gpucompute
