// Sessions and chains (SessionService): many small operations without a round trip
// each.
//
// A Session is one bidirectional stream. Submit queues an operation and returns at once
// with its tag and a future; the server answers each operation as it completes, and the
// futures resolve as the answers arrive. Writes never block the caller: the first
// operation goes out at once, and those submitted while a message is on its way go
// together in the next one, so a busy session costs a message per batch rather than per
// operation, even with one thread submitting. Answers come packed the same way. Later
// operations can use an earlier one's output before it exists, through TagRef(tag) in any
// buffer reference. A Chain is a list of such operations sent in one request and answered
// once.
//
//   auto session = Session::Open(client);
//   auto sum = (*session)->Submit(Reduce(v1::REDUCE_KIND_SUM, "x"));
//   auto y = (*session)->Submit(Elementwise("x / s", {{"x", BufferOperand("x")},
//                                                      {"s", BufferOperand(sum.Ref())}}));
//   y.result.Get();  // the finished operation
#ifndef GPUCOMPUTE_CLIENT_CPP_SESSION_H_
#define GPUCOMPUTE_CLIENT_CPP_SESSION_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/client.h"
#include "gpucompute/v1/gpucompute.grpc.pb.h"

namespace gpucompute {

// "tag:<tag>": a buffer reference to what the operation tagged `tag` writes.
std::string TagRef(std::string_view tag);

class Session {
 public:
  // Called with each answer as it arrives, before the operation's future resolves, on a
  // gRPC thread: it must not block.
  using AnswerFn = std::function<void(const std::string& tag, const v1::Operation& operation)>;

  // Opens a session on `client`'s channel, with its client name. The call has no
  // deadline: it lasts until Close or Cancel.
  static absl::StatusOr<std::unique_ptr<Session>> Open(Client& client, AnswerFn on_answer = {});

  // The most operations, and serialized bytes (one operation may exceed it alone), in
  // one message. The operation bound is the server's (Limits.max_session_in_flight); the
  // byte bound keeps a message far below the smallest message limit a server takes.
  static constexpr int kMaxBatchOps = 1024;
  static constexpr size_t kMaxBatchBytes = size_t{1} << 20;
  // Cancels the session unless it was closed.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  struct Submitted {
    std::string tag;
    // Resolves to the finished operation (its state may be FAILED), or to the error
    // that ended the session before it was answered.
    OperationFuture result;
    std::string Ref() const { return TagRef(tag); }
  };

  // Sends `request` (wait is ignored) tagged `tag`, or "#<n>" when empty, n counting
  // this session's submissions from 1. Tags must be unique within the session.
  // Safe to call from many threads; the operations reach the server in call order.
  // A call that finds no message being written starts writing its operation; the
  // operations queued meanwhile go in one message when that write is done. A call
  // blocks only while a full message waits (kMaxBatchOps or kMaxBatchBytes) behind the
  // write in flight, which flow control holds back while the server holds the session
  // back (Limits.max_session_in_flight).
  Submitted Submit(v1::SubmitRequest request, std::string tag = {});

  // Ends the submissions, waits for every answer, and returns the session's status.
  absl::Status Close();
  // Cancels the session: unanswered futures resolve to CANCELLED. The server frees the
  // session's temporaries; operations already queued still run.
  absl::Status Cancel();

 private:
  class Stream;  // the call's reactor

  Session(Client& client, AnswerFn on_answer);
  // The queued operations as the next message to write, if none is being written and
  // the writes may go on; the caller then starts its write outside the lock.
  const v1::SessionRequest* TakeQueuedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_);
  // Whether the writes end now: nothing is being written, and the session is closing, a
  // write failed or the server ended the call. The caller then calls EndWrites.
  bool EndWritesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_);
  // Sends WritesDone if asked, and releases the hold that kept the call open for writes.
  void EndWrites(bool send_writes_done) ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Reactions of the stream.
  void OnWriteDone(bool ok) ABSL_LOCKS_EXCLUDED(queue_mu_);
  void OnReadsEnded() ABSL_LOCKS_EXCLUDED(queue_mu_);
  void OnAnswers(v1::SessionResponse& message) ABSL_LOCKS_EXCLUDED(mu_);
  // Resolves every unanswered future with the call's status.
  void OnDone(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for the call to end and returns its status.
  absl::Status Join() ABSL_LOCKS_EXCLUDED(mu_);

  std::unique_ptr<v1::SessionService::Stub> stub_;
  const AnswerFn on_answer_;
  grpc::ClientContext context_;
  std::unique_ptr<Stream> stream_;

  // The operations not yet written, and the message being written (one at a time).
  absl::Mutex queue_mu_;
  v1::SessionRequest queued_ ABSL_GUARDED_BY(queue_mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(queue_mu_) = 0;
  v1::SessionRequest writing_message_ ABSL_GUARDED_BY(queue_mu_);
  bool writing_ ABSL_GUARDED_BY(queue_mu_) = false;
  uint64_t submitted_ ABSL_GUARDED_BY(queue_mu_) = 0;
  bool closing_ ABSL_GUARDED_BY(queue_mu_) = false;  // Close or Cancel was called
  bool write_failed_ ABSL_GUARDED_BY(queue_mu_) = false;
  bool reads_ended_ ABSL_GUARDED_BY(queue_mu_) = false;   // the server ended the call
  bool writes_ended_ ABSL_GUARDED_BY(queue_mu_) = false;  // nothing more is written

  absl::Mutex mu_;
  std::map<std::string, std::promise<absl::StatusOr<v1::Operation>>, std::less<>> pending_
      ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // OnDone ran
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
};

// A chain of operations that feed each other by tag, run by the server without a round
// trip between steps (SessionService.RunChain). A chain run again is serialized once:
// its request's bytes are kept from its first run until it changes, and shared by its
// copies. The server, for its part, runs a chain it has seen before prepared
// (chain_replay.h).
class Chain {
 public:
  // Adds a step and returns its tag: `tag`, or "#<n>" when empty (n counting steps
  // from 1).
  std::string Add(v1::SubmitRequest op, std::string tag = {});
  // Keeps the new unnamed output of step `tag` after the chain (named outputs always
  // stay; other new outputs are freed).
  Chain& Keep(std::string_view tag);
  // The stream the steps run on (default: the client's default stream).
  Chain& OnStream(std::string_view stream_id);
  // Launches every step on its own, never as one CUDA graph (ChainRequest's
  // separate_launches), e.g. to compare the two.
  Chain& SeparateLaunches(bool separate = true);

  const v1::ChainRequest& request() const { return request_; }
  // Runs the chain: the result of every step in order, or the error of the call (an
  // invalid step rejects the whole chain before anything runs). Every step's operation
  // has its id and stream, also where the answer gave them once (operation_id).
  absl::StatusOr<v1::ChainResponse> Run(Client& client) const;

 private:
  // The request's bytes, once serialized; a change to the chain drops them.
  struct Encoded {
    absl::Mutex mu;
    std::optional<grpc::ByteBuffer> bytes ABSL_GUARDED_BY(mu);
  };
  // The bytes of request_, serialized at the first call after a change (a copy of a
  // ByteBuffer shares its slices).
  grpc::ByteBuffer Bytes() const;
  // Before each change: the copies of this chain keep the bytes they share.
  void Changing() { encoded_ = std::make_shared<Encoded>(); }

  v1::ChainRequest request_;
  std::shared_ptr<Encoded> encoded_ = std::make_shared<Encoded>();
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_CLIENT_CPP_SESSION_H_
