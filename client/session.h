// Sessions and chains (SessionService): many small operations without a round trip
// each.
//
// A Session is one bidirectional stream. Submit sends an operation and returns at once
// with its tag and a future; the server answers each operation as it completes, and a
// reader thread resolves the futures. Operations submitted while a message is being
// written go together in the next one, and answers come packed the same way, so a busy
// session costs a message per batch rather than per operation. Later operations can use an earlier
// one's output before it exists, through TagRef(tag) in any buffer reference. A Chain is a list of
// such operations sent in one request and answered once.
//
//   auto session = Session::Open(client);
//   auto sum = (*session)->Submit(Reduce(v1::REDUCE_KIND_SUM, "x"));
//   auto y = (*session)->Submit(Elementwise("x / s", {{"x", BufferOperand("x")},
//                                                      {"s", BufferOperand(sum.Ref())}}));
//   y.result.Get();  // the finished operation
#ifndef GPUCOMPUTE_CLIENT_SESSION_H_
#define GPUCOMPUTE_CLIENT_SESSION_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "gpucompute/v1/gpucompute.grpc.pb.h"

namespace gpucompute {

// "tag:<tag>": a buffer reference to what the operation tagged `tag` writes.
std::string TagRef(std::string_view tag);

class Session {
 public:
  // Called with each answer as it arrives, on the session's reader thread, before the
  // operation's future resolves.
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
  // A call that finds no message being written writes one, with every operation queued
  // until the stream takes it; other calls queue theirs and return. A call blocks only
  // while a full message waits (kMaxBatchOps or kMaxBatchBytes) or the server holds the
  // session back (Limits.max_session_in_flight).
  Submitted Submit(v1::SubmitRequest request, std::string tag = {});

  // Ends the submissions, waits for every answer, and returns the session's status.
  absl::Status Close();
  // Cancels the session: unanswered futures resolve to CANCELLED. The server frees the
  // session's temporaries; operations already queued still run.
  absl::Status Cancel();

 private:
  Session(Client& client, AnswerFn on_answer);
  void ReadAnswers();
  // Resolves every unanswered future with `status`.
  void FailPending(const absl::Status& status);
  absl::Status Join();

  std::unique_ptr<v1::SessionService::Stub> stub_;
  const AnswerFn on_answer_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> stream_;
  std::thread reader_;

  // Writes the queued operations, message by message, until none are left. Called by
  // the Submit that became the writer.
  void WriteQueued() ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Waits until no thread is writing.
  void AwaitWrittenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_);

  // The operations not yet written. One thread at a time writes (writing_): the stream
  // takes one write at a time.
  absl::Mutex queue_mu_;
  v1::SessionRequest queued_ ABSL_GUARDED_BY(queue_mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(queue_mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(queue_mu_) = false;
  uint64_t submitted_ ABSL_GUARDED_BY(queue_mu_) = 0;
  bool writes_done_ ABSL_GUARDED_BY(queue_mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(queue_mu_) = false;

  absl::Mutex mu_;
  std::map<std::string, std::promise<absl::StatusOr<v1::Operation>>, std::less<>> pending_
      ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
};

// A chain of operations that feed each other by tag, run by the server without a round
// trip between steps (SessionService.RunChain).
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

  const v1::ChainRequest& request() const { return request_; }
  // Runs the chain: the result of every step in order, or the error of the call (an
  // invalid step rejects the whole chain before anything runs).
  absl::StatusOr<v1::ChainResponse> Run(Client& client) const;

 private:
  v1::ChainRequest request_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_CLIENT_SESSION_H_
