// A session's logic, apart from how its stream is served: its tags and their
// dependencies, its answers, its temporaries. SessionService.Session serves it through
// gRPC's callback API (session_service.cc).
#ifndef GPUCOMPUTE_SERVER_SERVICE_SESSION_CORE_H_
#define GPUCOMPUTE_SERVER_SERVICE_SESSION_CORE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "server/service/operation_planner.h"
#include "server/service/service_context.h"

namespace gpucompute {

// What a session asks of its stream. At most one Read and one Write are outstanding at a
// time; each completes by calling the core's OnReadDone or OnWriteDone, on any thread and
// never from inside the call. End comes once, with neither outstanding.
class SessionIo {
 public:
  virtual ~SessionIo() = default;
  virtual void Read(v1::SessionRequest* request) = 0;
  virtual void Write(const v1::SessionResponse* response) = 0;
  virtual void End(grpc::Status status) = 0;
};

// One session: its tags, its answers waiting to be written, its temporaries. Shared by
// the handler and by the completion callbacks of its operations, which may outlive the
// handler. Every call on the stream (SessionIo's Read, Write, End) is decided under the
// mutex and made after it is released (Run), one write and one read at a time.
class SessionCore : public std::enable_shared_from_this<SessionCore> {
 public:
  // `credential`: the token the session was opened with, whose revocation refuses the
  // requests after it.
  SessionCore(ServiceContext& ctx, std::string client, Credential credential, SessionIo* io)
      : ctx_(ctx), client_(std::move(client)), credential_(std::move(credential)), io_(io) {}

  void Start();
  void OnReadDone(bool ok);
  // The read completed with a message that cannot be served (`why`, e.g. bytes that do
  // not parse): the session ends with that status once its operations are done.
  void OnReadRefused(absl::Status why);
  void OnWriteDone(bool ok);
  void OnCancel();
  // The stream is gone (the call is over): nothing may call it any more.
  void Detach();

 private:
  struct Tag {
    std::string name;
    // The buffer the tag's operation writes. Weak: the registry (named buffers and the
    // session's temporaries) or queued work keeps it alive, not the tag.
    std::weak_ptr<BufferEntry> output;
    std::vector<Tag*> deps;  // until decided
    bool executed = false;
    // False while the new buffer the operation creates is queued but not yet in the
    // registry: the answer waits for it, so that a client holding the answer always
    // finds the buffer by its id.
    bool published = true;
    v1::Operation result;  // once executed, until decided
    bool decided = false;
    absl::Status error;         // once decided
    std::vector<Tag*> waiters;  // undecided operations that depend on this one
  };
  // What to do on the stream once the mutex is released.
  struct Actions {
    const v1::SessionResponse* write = nullptr;
    bool read = false;
    bool finish = false;
    grpc::Status status;
    std::vector<std::string> temporaries;
  };

  // An operation planned, its tag known, waiting to be queued with the others of its
  // message.
  struct Accepted {
    Tag* tag;
    v1::OperationKind kind;
    std::string stream_id;
    Plan plan;
  };
  // Plans one operation and adds it to accepted_ (reads come one at a time, so never
  // concurrently).
  void Accept(const v1::ChainStep& step);
  // After a read: stops the session with `refusal` unless it is OK, else reads on (`ok`)
  // or takes the end of the client's requests.
  void ReadFinished(bool ok, absl::Status refusal) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues accepted_ in order, under one hold of the executor's mutex (SubmitAll); those
  // after a refused one are queued one by one, or refused if they depend on it.
  void SubmitAccepted();
  void Published(Accepted& accepted);
  // The tag's new output is in the registry: its answer may go.
  void MarkPublished(Tag* tag);
  void RecordTemporary(const Accepted& accepted);
  // A tag whose operation was planned and then refused: answered as failed.
  void Refuse(Tag* tag, v1::OperationKind kind, const absl::Status& error) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<BufferHandle> FindTag(absl::string_view tag);
  void OnExecuted(Tag* tag, const std::shared_ptr<Operation>& op);
  // Answers a known tag whose operation was refused; its dependents fail naming it.
  void RejectLocked(Tag* tag, v1::OperationKind kind, const absl::Status& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  const Credential credential_;
  // Valid until Detach; only Run calls it, and never after it has called End.
  SessionIo* io_;
  // Filled by the read in flight; read only by OnReadDone.
  v1::SessionRequest request_;
  // Touched only by the thread handling a read (OnReadDone), one at a time.
  std::vector<Accepted> accepted_;

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
  // The client broke the protocol, or its token was revoked.
  absl::Status refused_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_SESSION_CORE_H_
