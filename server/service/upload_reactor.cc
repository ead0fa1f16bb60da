// BufferService.Upload's reactor (transfer_reactors.h).
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/wire_format.h"
#include "server/service/proto_conversions.h"
#include "server/service/transfer_reactors.h"
#include "server/service/upload_transfer.h"

namespace gpucompute {
namespace {

using Clock = std::chrono::steady_clock;

// Receives one stream of an upload: the header, then chunks, each copied by a copier
// thread straight from the slices gRPC received it in into a host staging block, and
// from there to the upload's destination, while this stream reads the next chunk. The upload (UploadTransfer) decides
// when the bytes become visible, and answers this stream with the outcome.
class UploadReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  UploadReactor(ServiceContext& ctx, std::shared_ptr<UploadTransferTable> table,
                grpc::CallbackServerContext* context, Caller caller, grpc::ByteBuffer* response)
      : state_(std::make_shared<State>(ctx, std::move(table), context, std::move(caller.scope),
                                       std::move(caller.credential), response)),
        admission_(std::move(caller.admission)) {
    absl::MutexLock lock(&state_->mu);
    state_->reactor = this;
    StartRead(&state_->slots[0].message);
    state_->reading = true;
  }

  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&state_->mu);
    state_->reading = false;
    // Answered already (cancelled, or failed): a message that arrived meanwhile must not
    // start an upload that no stream would ever finish.
    if (state_->finished) return;
    if (!ok) {
      state_->closed = true;
      if (state_->context->IsCancelled()) return FailLocked(state_, CancelledError());
      return MaybeRangeDoneLocked(state_);
    }
    if (absl::Status s = HandleMessageLocked(state_); !s.ok()) return FailLocked(state_, s);
    ReadNextLocked(state_);
  }

  // Also after this stream's range arrived whole: the upload is not committed yet, and a
  // client that gives up on any of its streams gives up on the upload.
  void OnCancel() override {
    absl::MutexLock lock(&state_->mu);
    if (state_->transfer != nullptr) state_->reported = false;
    FailLocked(state_, CancelledError());
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&state_->mu);
      state_->reactor = nullptr;
    }
    delete this;
  }

 private:
  struct Slot {
    grpc::ByteBuffer message;
    wire::UploadMessage parsed;
    HostStagingPool::Block staging;
    bool busy = false;  // a copy from `staging` is in flight
  };
  struct State {
    State(ServiceContext& c, std::shared_ptr<UploadTransferTable> t,
          grpc::CallbackServerContext* cx, std::string cl, Credential cr, grpc::ByteBuffer* r)
        : ctx(c),
          table(std::move(t)),
          context(cx),
          client(std::move(cl)),
          credential(std::move(cr)),
          response(r) {}
    ServiceContext& ctx;
    const std::shared_ptr<UploadTransferTable> table;
    grpc::CallbackServerContext* const context;  // valid while reactor is set
    const std::string client;
    const Credential credential;  // the token the stream was opened with
    grpc::ByteBuffer* const response;
    absl::Mutex mu;
    UploadReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;  // null once the call is over
    Slot slots[2] ABSL_GUARDED_BY(mu);
    int read_slot ABSL_GUARDED_BY(mu) = 0;
    bool reading ABSL_GUARDED_BY(mu) = false;
    bool closed ABSL_GUARDED_BY(mu) = false;
    bool finished ABSL_GUARDED_BY(mu) = false;
    // Set once the header has been accepted: the upload this stream writes a range of.
    std::shared_ptr<UploadTransfer> transfer ABSL_GUARDED_BY(mu);
    bool have_header ABSL_GUARDED_BY(mu) = false;
    bool reported ABSL_GUARDED_BY(mu) = false;  // RangeDone or Fail sent to the transfer
    uint64_t range_offset ABSL_GUARDED_BY(mu) = 0;
    uint64_t range_size ABSL_GUARDED_BY(mu) = 0;
    uint64_t received ABSL_GUARDED_BY(mu) = 0;  // bytes handed to the transfer
  };
  using StatePtr = std::shared_ptr<State>;

  static absl::Status CancelledError() {
    return absl::CancelledError("an upload stream was cancelled; nothing was changed");
  }

  static void FinishLocked(const StatePtr& s, grpc::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    if (s->finished || s->reactor == nullptr) return;
    s->finished = true;
    s->reactor->Finish(std::move(status));
  }

  // Fails the whole upload, which answers this stream too once its memory is free; a
  // stream that failed before it joined an upload answers at once.
  static void FailLocked(const StatePtr& s, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    if (s->transfer == nullptr) return FinishLocked(s, ToGrpcStatus(status));
    if (s->reported) return;
    s->reported = true;
    s->transfer->Fail(std::move(status));
  }

  // The transfer's listener: the upload's outcome.
  static UploadTransfer::Listener Listener(const StatePtr& s) {
    return [s](const absl::Status& status, const v1::UploadResponse& response) {
      absl::MutexLock lock(&s->mu);
      if (status.ok()) *s->response = wire::Serialize(response);
      FinishLocked(s, ToGrpcStatus(status));
    };
  }

  static absl::Status HandleHeaderLocked(const StatePtr& s, const v1::UploadHeader& header)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    s->have_header = true;
    std::shared_ptr<UploadTransfer> transfer;
    if (header.transfer_id().empty()) {
      absl::StatusOr<std::shared_ptr<UploadTransfer>> t =
          UploadTransfer::Start(s->ctx, s->client, header);
      if (!t.ok()) return t.status();
      transfer = *std::move(t);
      s->range_offset = 0;
      s->range_size = transfer->size();
      transfer->WatchIdle(absl::ToChronoNanoseconds(s->ctx.upload_idle_timeout));
    } else {
      if (header.target_case() != v1::UploadHeader::TARGET_NOT_SET) {
        return absl::InvalidArgumentError(
            "a range stream's header names its transfer_id and no target");
      }
      absl::StatusOr<std::shared_ptr<UploadTransfer>> t =
          s->table->Lookup(s->client, header.transfer_id());
      if (!t.ok()) return t.status();
      transfer = *std::move(t);
      s->range_offset = header.offset_bytes();
      s->range_size = header.size_bytes();
    }
    absl::Status st = transfer->AddRange(s->range_offset, s->range_size, Listener(s));
    // NOT_FOUND: the upload was over and never took the listener; otherwise the upload
    // answers, also when the range was bad.
    if (st.code() != absl::StatusCode::kNotFound) {
      s->transfer = std::move(transfer);
      if (!st.ok()) s->reported = true;
    }
    return st;
  }

  static absl::Status HandleMessageLocked(const StatePtr& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    Slot& slot = s->slots[s->read_slot];
    absl::Status parsed = wire::ParseUploadRequest(slot.message, &slot.parsed);
    slot.message.Clear();  // the parsed slices keep the bytes
    if (!parsed.ok()) return parsed;
    const wire::UploadMessage& msg = slot.parsed;
    // Per message, header and chunk alike (one atomic load): a stream outlives the reload
    // that revokes its token, and the upload it belongs to fails with it. A range stream
    // whose header is read only after the reload fails the upload it names as well.
    if (s->credential.revoked()) {
      if (!s->have_header && msg.kind == wire::UploadMessage::Kind::kHeader &&
          !msg.header.transfer_id().empty()) {
        absl::StatusOr<std::shared_ptr<UploadTransfer>> named =
            s->table->Lookup(s->client, msg.header.transfer_id());
        if (named.ok()) (*named)->Fail(TokenRevokedError());
      }
      return TokenRevokedError();
    }
    if (!s->have_header) {
      if (msg.kind != wire::UploadMessage::Kind::kHeader) {
        return absl::InvalidArgumentError("the first upload message must be the header");
      }
      return HandleHeaderLocked(s, msg.header);
    }
    if (msg.kind != wire::UploadMessage::Kind::kChunk) {
      return absl::InvalidArgumentError("only chunks may follow the upload header");
    }
    const uint64_t n = msg.chunk.size;
    // gRPC refuses a message over the limit; a chunk that fits one only because its
    // framing is small is refused here, so that the reported chunk limit is the one kept.
    if (n > s->ctx.limits.max_chunk_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "an upload chunk of ", n, " bytes is larger than the server's max_chunk_bytes of ",
          s->ctx.limits.max_chunk_bytes(), " (--max-message-bytes less ", kChunkOverheadBytes,
          " bytes of framing); send smaller chunks"));
    }
    if (n > s->range_size - s->received) {
      return absl::InvalidArgumentError(absl::StrCat("the upload stream sent more than the ",
                                                     s->range_size, " bytes it declared"));
    }
    if (msg.chunk_crc32c.has_value() && *msg.chunk_crc32c != msg.chunk.Crc32c()) {
      return absl::DataLossError(
          absl::StrCat("the chunk at byte ", s->range_offset + s->received,
                       " of the upload does not match its CRC32C; nothing was changed"));
    }
    if (n == 0) return absl::OkStatus();
    if (slot.staging == nullptr || slot.staging->size() < n) {
      absl::StatusOr<HostStagingPool::Block> block = s->ctx.staging->Acquire(n);
      if (!block.ok()) return block.status();
      slot.staging = *std::move(block);
    }
    slot.busy = true;
    const int index = s->read_slot;
    const uint64_t offset = s->range_offset + s->received;
    s->received += n;
    // The chunk goes to staging memory on a copier thread, and from there to the upload,
    // while this thread reads the next chunk into the other slot. The job owns the
    // received slices; the slot stays busy, keeping its staging block, until the write
    // is done. The write's completion takes this stream's lock, so the job holds none.
    s->ctx.chunk_copiers->Run([s, index, offset, n, transfer = s->transfer,
                               staging = slot.staging->data(), chunk = std::move(slot.parsed.chunk),
                               slices = std::move(slot.parsed.slices)]() mutable {
      chunk.CopyTo(staging);
      chunk = {};
      slices.clear();
      transfer->Write(offset, staging, UploadTransfer::HostMemory::kStaging, n,
                      [s, index](absl::Status) {
                        absl::MutexLock lock(&s->mu);
                        s->slots[index].busy = false;
                        if (!s->reading && !s->closed) ReadNextLocked(s);
                        MaybeRangeDoneLocked(s);
                      });
    });
    slot.parsed.slices.clear();
    return absl::OkStatus();
  }

  // Starts the next read into a slot whose copy is done, if there is one.
  static void ReadNextLocked(const StatePtr& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    if (s->finished || s->reactor == nullptr || s->reading || s->reported) return;
    for (int i = 0; i < 2; ++i) {
      const int slot = (s->read_slot + 1 + i) % 2;
      if (!s->slots[slot].busy) {
        s->read_slot = slot;
        s->reading = true;
        s->reactor->StartRead(&s->slots[slot].message);
        return;
      }
    }
  }

  // Once the stream has half-closed and its copies are done, tells the upload whether
  // its range arrived whole.
  static void MaybeRangeDoneLocked(const StatePtr& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    if (!s->closed || s->reported || s->slots[0].busy || s->slots[1].busy) return;
    if (!s->have_header) {
      return FinishLocked(s, ToGrpcStatus(absl::InvalidArgumentError("the upload sent no header")));
    }
    if (s->transfer == nullptr) return;
    s->reported = true;
    if (s->received != s->range_size) {
      return s->transfer->Fail(absl::InvalidArgumentError(
          absl::StrCat("an upload stream ended after ", s->received, " of the ", s->range_size,
                       " bytes it declared; nothing was changed")));
    }
    s->transfer->RangeDone();
  }

  StatePtr state_;
  std::shared_ptr<const void> admission_;  // the call's, until OnDone
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* NewUploadReactor(
    ServiceContext& ctx, std::shared_ptr<UploadTransferTable> table,
    grpc::CallbackServerContext* context, Caller caller, grpc::ByteBuffer* response) {
  return new UploadReactor(ctx, std::move(table), context, std::move(caller), response);
}

void SetTransferStats(uint64_t bytes, Clock::time_point start, v1::TransferStats* stats) {
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  stats->set_bytes(bytes);
  stats->set_seconds(seconds);
  if (seconds > 0) stats->set_gbps(static_cast<double>(bytes) / seconds / 1e9);
}

}  // namespace gpucompute
