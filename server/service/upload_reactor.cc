// BufferService.Upload's reactor (transfer_reactors.h).
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/service/operation_planner.h"
#include "server/service/proto_conversions.h"
#include "server/service/services.h"
#include "server/service/transfer_reactors.h"

namespace gpucompute {
namespace {

using Clock = std::chrono::steady_clock;

// Receives the header, then chunks into device memory through the transfer stream,
// reading the next chunk while the previous one is being copied. A new buffer is
// registered, and an existing one overwritten (by one ordered copy from staging
// memory), only once every declared byte has arrived.
class UploadReactor final : public grpc::ServerReadReactor<v1::UploadRequest> {
 public:
  UploadReactor(ServiceContext& ctx, std::string client, v1::UploadResponse* response)
      : state_(std::make_shared<State>(ctx, std::move(client), response)) {
    absl::MutexLock lock(&state_->mu);
    state_->reactor = this;
    StartRead(&state_->slots[0]);
    state_->reading = true;
  }

  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&state_->mu);
    state_->reading = false;
    if (!ok) {
      state_->closed = true;
      MaybeCommitLocked(state_);
      return;
    }
    if (absl::Status s = HandleMessageLocked(state_); !s.ok()) {
      FinishLocked(state_, ToGrpcStatus(s));
      return;
    }
    ReadNextLocked(state_);
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&state_->mu);
      state_->reactor = nullptr;
    }
    delete this;
  }

 private:
  struct State {
    State(ServiceContext& c, std::string cl, v1::UploadResponse* r) : ctx(c), client(std::move(cl)), response(r) {}
    ServiceContext& ctx;
    const std::string client;
    v1::UploadResponse* const response;
    absl::Mutex mu;
    UploadReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;  // null once the call is over
    v1::UploadRequest slots[2] ABSL_GUARDED_BY(mu);
    // A copy from this slot is in flight.
    bool slot_busy[2] ABSL_GUARDED_BY(mu) = {false, false};
    int read_slot ABSL_GUARDED_BY(mu) = 0;
    bool reading ABSL_GUARDED_BY(mu) = false;
    bool closed ABSL_GUARDED_BY(mu) = false;
    bool finished ABSL_GUARDED_BY(mu) = false;
    bool have_header ABSL_GUARDED_BY(mu) = false;
    const Clock::time_point start = Clock::now();
    uint64_t expected ABSL_GUARDED_BY(mu) = 0;
    uint64_t received ABSL_GUARDED_BY(mu) = 0;
    absl::Status copy_error ABSL_GUARDED_BY(mu);
    // A new buffer, or staging memory for a range of an existing one. The copy that
    // commits a range reads target, staging and its offsets after the call's last
    // message, when nothing else writes them.
    BufferHandle created ABSL_GUARDED_BY(mu);
    BufferHandle target;
    uint64_t target_offset = 0;
    DeviceMemory staging;
    MemoryLimiter::Charge staging_charge ABSL_GUARDED_BY(mu);
    DeviceMemory* destination ABSL_GUARDED_BY(mu) = nullptr;
    std::string range_name ABSL_GUARDED_BY(mu);  // "upload buf-..." around each chunk's copy
  };
  using StatePtr = std::shared_ptr<State>;

  static void FinishLocked(const StatePtr& s, grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    if (s->finished || s->reactor == nullptr) return;
    s->finished = true;
    ReleaseMemoryLocked(s);
    s->reactor->Finish(std::move(status));
  }

  // Memory an upload holds is returned before its caller hears the answer, so that a
  // rejected upload leaves the memory in use as it found it. Copies still in flight
  // write into it, so the last of them releases it instead.
  static void ReleaseMemoryLocked(const StatePtr& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    if (s->slot_busy[0] || s->slot_busy[1]) return;
    s->destination = nullptr;
    s->created.reset();
    s->target.reset();
    s->staging = DeviceMemory();
    s->staging_charge = MemoryLimiter::Charge();
  }

  static absl::Status HandleHeaderLocked(const StatePtr& s, const v1::UploadHeader& header)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    s->have_header = true;
    ServiceContext& ctx = s->ctx;
    switch (header.target_case()) {
      case v1::UploadHeader::kCreate: {
        if (header.offset_bytes() != 0) {
          return absl::InvalidArgumentError("an upload that creates a buffer must start at offset 0");
        }
        absl::StatusOr<BufferHandle> b = AllocateFromRequest(ctx, s->client, header.create());
        if (!b.ok()) return b.status();
        if (header.create().has_fill()) {
          return absl::InvalidArgumentError("an upload provides the contents; 'fill' is not allowed");
        }
        const uint64_t size = (*b)->size_bytes();
        if (header.size_bytes() != 0 && header.size_bytes() != size) {
          return absl::InvalidArgumentError(absl::StrCat("size_bytes is ", header.size_bytes(), " but a ",
                                                         DTypeName((*b)->dtype), " buffer of that shape holds ",
                                                         size, " bytes"));
        }
        s->created = *b;
        s->range_name = absl::StrCat("upload ", (*b)->id);
        s->expected = size;
        s->destination = &s->created->memory;
        return absl::OkStatus();
      }
      case v1::UploadHeader::kBuffer: {
        absl::StatusOr<BufferHandle> b = ctx.registry.Lookup(s->client, header.buffer());
        if (!b.ok()) return b.status();
        const uint64_t size = (*b)->size_bytes();
        if (header.offset_bytes() > size || header.size_bytes() > size - header.offset_bytes()) {
          return absl::InvalidArgumentError(absl::StrCat("bytes [", header.offset_bytes(), ", +",
                                                         header.size_bytes(), ") are outside buffer ", (*b)->id,
                                                         " of ", size, " bytes"));
        }
        absl::StatusOr<MemoryLimiter::Charge> charge = ctx.limiter.TryCharge(header.size_bytes());
        if (!charge.ok()) return charge.status();
        absl::StatusOr<DeviceMemory> staging = ctx.backend.Allocate((*b)->device, header.size_bytes());
        if (!staging.ok()) return staging.status();
        s->target = *b;
        s->range_name = absl::StrCat("upload ", (*b)->id);
        s->target_offset = header.offset_bytes();
        s->staging = *std::move(staging);
        s->staging_charge = *std::move(charge);
        s->expected = header.size_bytes();
        s->destination = &s->staging;
        return absl::OkStatus();
      }
      case v1::UploadHeader::TARGET_NOT_SET:
        break;
    }
    return absl::InvalidArgumentError("the upload header names no target: set 'create' or 'buffer'");
  }

  static absl::Status HandleMessageLocked(const StatePtr& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    v1::UploadRequest& msg = s->slots[s->read_slot];
    if (!s->have_header) {
      if (msg.part_case() != v1::UploadRequest::kHeader) {
        return absl::InvalidArgumentError("the first upload message must be the header");
      }
      return HandleHeaderLocked(s, msg.header());
    }
    if (msg.part_case() != v1::UploadRequest::kChunk) {
      return absl::InvalidArgumentError("only chunks may follow the upload header");
    }
    const uint64_t n = msg.chunk().size();
    if (n > s->expected - s->received) {
      return absl::InvalidArgumentError(
          absl::StrCat("the upload sent more than the ", s->expected, " bytes it declared"));
    }
    if (n == 0) return absl::OkStatus();
    const int slot = s->read_slot;
    s->slot_busy[slot] = true;
    Stream& stream = s->ctx.executor.TransferStream(s->destination->device());
    absl::Status st;
    {
      ScopedRange range(s->ctx.backend, s->range_name);
      st = s->ctx.backend.CopyFromHost(stream, msg.chunk().data(), *s->destination, s->received, n);
    }
    if (st.ok()) {
      st = stream.OnComplete([s, slot](absl::Status status) {
        absl::MutexLock lock(&s->mu);
        s->slot_busy[slot] = false;
        if (!status.ok() && s->copy_error.ok()) s->copy_error = status;
        if (s->finished) return ReleaseMemoryLocked(s);
        if (!s->reading && !s->closed) ReadNextLocked(s);
        MaybeCommitLocked(s);
      });
    }
    if (!st.ok()) {
      s->slot_busy[slot] = false;
      return st;
    }
    s->received += n;
    return absl::OkStatus();
  }

  // Starts the next read into a slot whose copy is done, if there is one.
  static void ReadNextLocked(const StatePtr& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    if (s->finished || s->reactor == nullptr || s->reading) return;
    for (int i = 0; i < 2; ++i) {
      const int slot = (s->read_slot + 1 + i) % 2;
      if (!s->slot_busy[slot]) {
        s->read_slot = slot;
        s->reading = true;
        s->reactor->StartRead(&s->slots[slot]);
        return;
      }
    }
  }

  // May release the lock while it hands the commit to the executor, and takes it back.
  static void MaybeCommitLocked(const StatePtr& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    if (!s->closed || s->finished || s->slot_busy[0] || s->slot_busy[1]) return;
    if (!s->copy_error.ok()) return FinishLocked(s, ToGrpcStatus(s->copy_error));
    if (!s->have_header) {
      return FinishLocked(s, ToGrpcStatus(absl::InvalidArgumentError("the upload sent no header")));
    }
    if (s->received != s->expected) {
      return FinishLocked(s, ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat("the upload ended after ", s->received, " of the ",
                                                       s->expected, " bytes it declared; nothing was changed"))));
    }
    ServiceContext& ctx = s->ctx;
    if (s->created != nullptr) {
      absl::Status st = ctx.registry.Register(s->created);
      if (st.ok()) {
        ToProto(*s->created, s->response->mutable_buffer());
        SetTransferStats(s->received, s->start, s->response->mutable_transfer());
        ctx.executor.RecordTransfer(OpKind::kUpload, s->received);
      }
      return FinishLocked(s, ToGrpcStatus(st));
    }
    // Overwrite the range in stream order with everything else that touches the buffer.
    Executor::OpSpec spec;
    spec.kind = OpKind::kCopy;
    spec.accesses = {{s->target, true}};
    spec.bytes_read = s->expected;
    spec.bytes_written = s->expected;
    spec.outputs.push_back(*s->target);
    spec.launch = [&backend = ctx.backend, s, bytes = s->expected](Stream& stream,
                                                                    OpResult&) -> absl::StatusOr<LaunchInfo> {
      absl::Status st = backend.Copy(stream, s->staging, 0, s->target->memory, s->target_offset, bytes);
      if (!st.ok()) return st;
      return LaunchInfo{};
    };
    absl::StatusOr<std::shared_ptr<Operation>> op = ctx.executor.Submit(s->client, "", std::move(spec));
    if (!op.ok()) return FinishLocked(s, ToGrpcStatus(op.status()));
    s->mu.Unlock();
    ctx.executor.OnDone(*op, [s, op = *op] {
      absl::MutexLock lock(&s->mu);
      const OperationStatus done = s->ctx.executor.GetStatus(*op);
      if (done.error.ok() && s->target != nullptr) {
        ToProto(*s->target, s->response->mutable_buffer());
        SetTransferStats(s->received, s->start, s->response->mutable_transfer());
        s->ctx.executor.RecordTransfer(OpKind::kUpload, s->received);
      }
      FinishLocked(s, ToGrpcStatus(done.error));
    });
    s->mu.Lock();
  }

  StatePtr state_;
};

}  // namespace

grpc::ServerReadReactor<v1::UploadRequest>* NewUploadReactor(ServiceContext& ctx, std::string client,
                                                             v1::UploadResponse* response) {
  return new UploadReactor(ctx, std::move(client), response);
}

void SetTransferStats(uint64_t bytes, Clock::time_point start, v1::TransferStats* stats) {
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  stats->set_bytes(bytes);
  stats->set_seconds(seconds);
  if (seconds > 0) stats->set_gbps(static_cast<double>(bytes) / seconds / 1e9);
}

}  // namespace gpucompute
