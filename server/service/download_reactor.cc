// BufferService.Download's reactor (transfer_reactors.h).
#include <algorithm>
#include <chrono>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/service/proto_conversions.h"
#include "server/service/services.h"
#include "server/service/transfer_reactors.h"

namespace gpucompute {
namespace {

using Clock = std::chrono::steady_clock;

// Waits for the buffer's pending writers, then streams the range in chunks, copying
// chunk k+1 off the device while chunk k is on the wire.
class DownloadReactor final : public grpc::ServerWriteReactor<v1::DownloadResponse> {
 public:
  DownloadReactor(ServiceContext& ctx, BufferHandle buffer, uint64_t offset, uint64_t size, uint64_t chunk)
      : state_(std::make_shared<State>(ctx, std::move(buffer), offset, size, chunk)) {
    {
      absl::MutexLock lock(&state_->mu);
      state_->reactor = this;
    }
    StatePtr s = state_;
    std::shared_ptr<HostAccess> access =
        ctx.executor.AcquireHostAccess({{state_->buffer, false}}, [s](const std::shared_ptr<HostAccess>&) {
          absl::MutexLock lock(&s->mu);
          s->ready = true;
          PumpLocked(s);
        });
    absl::MutexLock lock(&state_->mu);
    state_->access = std::move(access);
  }

  void OnCancel() override {
    absl::MutexLock lock(&state_->mu);
    FinishLocked(state_, ToGrpcStatus(absl::CancelledError("the download was cancelled")));
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&state_->mu);
    state_->writing = false;
    if (!ok) {
      // The client went away; nothing more can be sent.
      FinishLocked(state_, ToGrpcStatus(absl::CancelledError("the download was cancelled")));
      return;
    }
    state_->slots[state_->write_slot].filled = false;
    state_->write_slot ^= 1;
    PumpLocked(state_);
  }

  void OnDone() override {
    std::shared_ptr<HostAccess> access;
    {
      absl::MutexLock lock(&state_->mu);
      state_->reactor = nullptr;
      access = state_->access;
    }
    if (access != nullptr) state_->ctx.executor.Release(access);
    delete this;
  }

 private:
  struct Slot {
    v1::DownloadResponse message;
    bool copying = false;
    bool filled = false;
  };
  struct State {
    State(ServiceContext& c, BufferHandle b, uint64_t off, uint64_t sz, uint64_t ch)
        : ctx(c),
          buffer(std::move(b)),
          offset(off),
          end(off + sz),
          chunk(ch),
          range_name(absl::StrCat("download ", buffer->id)),
          next(off) {}
    ServiceContext& ctx;
    BufferHandle buffer;
    const uint64_t offset;
    const uint64_t end;
    const uint64_t chunk;
    const std::string range_name;  // "download buf-..." around each chunk's copy
    absl::Mutex mu;
    DownloadReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
    std::shared_ptr<HostAccess> access ABSL_GUARDED_BY(mu);
    bool ready ABSL_GUARDED_BY(mu) = false;
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool finished ABSL_GUARDED_BY(mu) = false;
    bool sent_any ABSL_GUARDED_BY(mu) = false;
    uint64_t next ABSL_GUARDED_BY(mu);  // next byte to copy off the device
    Slot slots[2] ABSL_GUARDED_BY(mu);
    int fill_slot ABSL_GUARDED_BY(mu) = 0;
    int write_slot ABSL_GUARDED_BY(mu) = 0;
    absl::Status copy_error ABSL_GUARDED_BY(mu);
    Clock::time_point start = Clock::now();
  };
  using StatePtr = std::shared_ptr<State>;

  static void FinishLocked(const StatePtr& s, grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    if (s->finished || s->reactor == nullptr) return;
    s->finished = true;
    s->reactor->Finish(std::move(status));
  }

  // Starts copies into free slots and the write of the next filled slot.
  static void PumpLocked(const StatePtr& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    if (!s->ready || s->finished || s->reactor == nullptr) return;
    if (!s->copy_error.ok()) return FinishLocked(s, ToGrpcStatus(s->copy_error));
    Slot& w = s->slots[s->write_slot];
    while (s->next < s->end || (!s->sent_any && s->end == s->offset)) {
      Slot& f = s->slots[s->fill_slot];
      if (f.copying || f.filled) break;
      const uint64_t n = std::min(s->chunk, s->end - s->next);
      f.message.Clear();
      f.message.set_offset_bytes(s->next);
      std::string* data = f.message.mutable_data();
      data->resize(n);
      if (!s->sent_any && s->next == s->offset) ToProto(*s->buffer, f.message.mutable_buffer());
      s->next += n;
      s->sent_any = true;
      if (n == 0) {
        f.filled = true;
        break;
      }
      f.copying = true;
      Stream& stream = s->ctx.executor.TransferStream(s->buffer->device);
      absl::Status st;
      {
        ScopedRange range(s->ctx.backend, s->range_name);
        st = s->ctx.backend.CopyToHost(stream, s->buffer->memory, f.message.offset_bytes(), data->data(), n);
      }
      Slot* slot = &f;
      if (st.ok()) {
        st = stream.OnComplete([s, slot](absl::Status status) {
          absl::MutexLock lock(&s->mu);
          slot->copying = false;
          slot->filled = true;
          if (!status.ok() && s->copy_error.ok()) s->copy_error = status;
          PumpLocked(s);
        });
      }
      if (!st.ok()) {
        f.copying = false;
        return FinishLocked(s, ToGrpcStatus(st));
      }
      s->fill_slot ^= 1;
    }
    if (s->writing) return;
    if (w.filled) {
      const bool last = w.message.offset_bytes() + w.message.data().size() == s->end && s->next == s->end;
      if (last) {
        const uint64_t bytes = s->end - s->offset;
        SetTransferStats(bytes, s->start, w.message.mutable_transfer());
        s->ctx.executor.RecordTransfer(OpKind::kDownload, bytes);
      }
      s->writing = true;
      s->reactor->StartWrite(&w.message);
      return;
    }
    const bool all_sent = s->sent_any && s->next == s->end && !s->slots[0].filled && !s->slots[1].filled &&
                          !s->slots[0].copying && !s->slots[1].copying;
    if (all_sent) FinishLocked(s, grpc::Status::OK);
  }

  StatePtr state_;
};

}  // namespace

grpc::ServerWriteReactor<v1::DownloadResponse>* NewDownloadReactor(ServiceContext& ctx, BufferHandle buffer,
                                                                   uint64_t offset, uint64_t size,
                                                                   uint64_t chunk) {
  return new DownloadReactor(ctx, std::move(buffer), offset, size, chunk);
}

}  // namespace gpucompute
