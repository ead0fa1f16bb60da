// SessionService.Session: a bidirectional stream of tagged operations, each planned and
// queued as it arrives and answered as it completes (the contract is in the proto).
//
// A message costs far more than an operation: gRPC hands each read and each write to a
// thread of its own. So a request carries many operations, and while one answer message
// is on the wire the answers that complete meanwhile gather into the next.
#include <algorithm>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "server/service/services.h"
#include "server/service/tagged_ops.h"

namespace gpucompute {
namespace {

// Answers per message: enough that a busy session writes few messages, few enough that
// a message stays far below any client's receive limit.
constexpr size_t kMaxAnswersPerMessage = 256;

using SessionStream = grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>;

// One session: its tags, its answers waiting to be written, its temporaries. Shared by
// the reactor and by the completion callbacks of its operations, which may outlive the
// reactor. Every call on the reactor (StartRead, StartWrite, Finish) is decided under
// the mutex and made after it is released (Run), one write and one read at a time.
class SessionCore : public std::enable_shared_from_this<SessionCore> {
 public:
  SessionCore(ServiceContext& ctx, std::string client, SessionStream* reactor)
      : ctx_(ctx), client_(std::move(client)), reactor_(reactor) {}

  void Start();
  void OnReadDone(bool ok);
  void OnWriteDone(bool ok);
  void OnCancel();
  // The reactor is gone (OnDone): nothing may call it any more.
  void Detach();

 private:
  struct Tag {
    std::string name;
    // The buffer the tag's operation writes. Weak: the registry (named buffers and the
    // session's temporaries) or queued work keeps it alive, not the tag.
    std::weak_ptr<BufferEntry> output;
    std::shared_ptr<Operation> op;  // until decided
    std::vector<Tag*> deps;         // until decided
    bool executed = false;
    v1::Operation result;  // once executed, until decided
    bool decided = false;
    absl::Status error;         // once decided
    std::vector<Tag*> waiters;  // undecided operations that depend on this one
  };
  // What to do on the reactor once the mutex is released.
  struct Actions {
    const v1::SessionResponse* write = nullptr;
    bool read = false;
    bool finish = false;
    grpc::Status status;
    std::vector<std::string> temporaries;
  };

  // Plans and queues one operation (reads come one at a time, so never concurrently).
  void Accept(const v1::ChainStep& step);
  absl::StatusOr<BufferHandle> FindTag(absl::string_view tag);
  void OnExecuted(Tag* tag, const std::shared_ptr<Operation>& op);
  // Answers every operation that can be answered now, starting from `tag`: those done
  // whose dependencies are answered.
  void DecideLocked(Tag* tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AnswerLocked(absl::string_view tag, v1::Operation op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool StoppedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cancelled_ || broken_ || !refused_.ok();
  }
  void DropQueuedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Actions NextActionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(Actions actions) ABSL_LOCKS_EXCLUDED(mu_);

  ServiceContext& ctx_;
  const std::string client_;
  // Valid until Detach; only Run calls it, and never after it has called Finish.
  SessionStream* reactor_;
  // Filled by the read in flight; read only by OnReadDone.
  v1::SessionRequest request_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Tag>> tags_ ABSL_GUARDED_BY(mu_);
  // Answers not yet written, in completion order.
  std::deque<v1::ChainStepResult> answers_ ABSL_GUARDED_BY(mu_);
  // The message being written while writing_, and how many answers it holds.
  v1::SessionResponse out_ ABSL_GUARDED_BY(mu_);
  // Requests accepted and not yet answered on the wire: bounds what the session holds.
  uint32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Operations queued and not yet done. The call ends only once they are, cancelled or
  // not, so that no completion outlives the server that the session belongs to.
  uint32_t executing_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> temporaries_ ABSL_GUARDED_BY(mu_);  // buffer ids
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool want_read_ ABSL_GUARDED_BY(mu_) = false;  // held back by the in-flight bound
  bool read_closed_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;   // a write failed: the client is gone
  absl::Status refused_ ABSL_GUARDED_BY(mu_);  // the client broke the protocol
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

void SessionCore::Start() {
  {
    absl::MutexLock lock(&mu_);
    reading_ = true;
  }
  reactor_->StartRead(&request_);
}

void SessionCore::OnReadDone(bool ok) {
  // The bound on what a session holds is checked between messages, so one message may
  // not carry more than it.
  const int ops = ok ? request_.ops_size() : 0;
  const bool too_many = ops > static_cast<int>(kMaxSessionInFlight);
  if (ok && !too_many) {
    // A message's operations are launched together once all are queued.
    Executor::LaunchBatch batch(ctx_.executor);
    for (const v1::ChainStep& step : request_.ops()) {
      // A cancelled session plans and queues nothing more.
      if (absl::MutexLock lock(&mu_); StoppedLocked()) break;
      Accept(step);
    }
  }
  request_.Clear();
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    reading_ = false;
    if (too_many) {
      refused_ = absl::InvalidArgumentError(
          absl::StrCat("a session request carried ", ops, " operations; at most ",
                       kMaxSessionInFlight, " (Limits.max_session_in_flight) fit in one"));
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
  auto tag = std::make_unique<Tag>();
  tag->name = name;
  std::vector<std::string> dep_names;
  std::shared_ptr<Operation> op;
  BufferHandle written;
  std::string temporary;
  if (rejected.ok()) {
    absl::StatusOr<Plan> plan = PlanTagged(
        ctx_, client_, request.op(), [this](absl::string_view t) { return FindTag(t); },
        &dep_names);
    if (plan.ok()) {
      written = WrittenBuffer(*plan);
      if (plan->created != nullptr && plan->created->name.empty()) temporary = plan->created->id;
      absl::StatusOr<std::shared_ptr<Operation>> queued =
          SubmitPlan(ctx_, client_, request.op().stream_id(), *std::move(plan));
      if (queued.ok()) {
        op = *std::move(queued);
      } else {
        rejected = queued.status();
      }
    } else {
      rejected = plan.status();
    }
  }
  Tag* queued = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!rejected.ok()) {
      v1::Operation answer;
      answer.set_kind(RequestKind(request.op()));
      MarkFailed(rejected, &answer);
      AnswerLocked(name, std::move(answer));
      // A rejected tag stays known, so that its dependents fail naming it.
      if (!duplicate && !name.empty()) {
        tag->decided = true;
        tag->error = rejected;
        tags_.emplace(name, std::move(tag));
      }
    } else {
      tag->output = written;
      tag->op = op;
      for (const std::string& d : dep_names) tag->deps.push_back(tags_.at(d).get());
      if (!temporary.empty()) temporaries_.push_back(std::move(temporary));
      queued = tag.get();
      tags_.emplace(name, std::move(tag));
      ++executing_;
    }
  }
  // Outside the lock: OnDone runs the callback at once if the operation is done.
  if (queued != nullptr) {
    ctx_.executor.OnDone(op,
                         [self = shared_from_this(), queued, op] { self->OnExecuted(queued, op); });
  }
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
  ToProto(ctx_.executor.GetStatus(*op), &result);
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
    if (tag->decided || !tag->executed) continue;
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
    tag->op.reset();
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
  reactor_ = nullptr;
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
  if (actions.write != nullptr) reactor_->StartWrite(actions.write);
  if (actions.read) reactor_->StartRead(&request_);
  if (actions.finish) {
    // The temporaries go before the call ends, so a client sees them gone once it has
    // its status; queued work still using one keeps its memory until it completes.
    for (const std::string& id : actions.temporaries) (void)ctx_.registry.Remove(client_, id);
    reactor_->Finish(std::move(actions.status));
  }
}

class SessionReactor final : public SessionStream {
 public:
  SessionReactor(ServiceContext& ctx, Caller caller)
      : core_(std::make_shared<SessionCore>(ctx, std::move(caller.scope), this)),
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
  std::shared_ptr<SessionCore> core_;
  std::shared_ptr<const void> admission_;  // the call's, until OnDone
};

}  // namespace

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* SessionServiceImpl::Session(
    grpc::CallbackServerContext* context) {
  using Refuse = Refusal<SessionStream>;
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return new Refuse(caller.status());
  if (absl::Status s = CheckBackendHealthy(ctx_.backend); !s.ok()) return new Refuse(s);
  return new SessionReactor(ctx_, *std::move(caller));
}

}  // namespace gpucompute
