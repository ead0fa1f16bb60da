// BufferService.Download's reactor (transfer_reactors.h).
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/crc32c.h"
#include "common/grpc_status.h"
#include "common/wire_format.h"
#include "server/service/proto_conversions.h"
#include "server/service/services.h"
#include "server/service/transfer_reactors.h"

namespace gpucompute {
namespace {

using Clock = std::chrono::steady_clock;

// Waits for the buffer's pending writers, then streams the range in chunks, copying
// chunk k+1 off the device while chunk k is on the wire. Each chunk is copied into a
// host staging block and sent from there: the message's data is a slice over the block,
// which the slice keeps alive until gRPC is done with it.
class DownloadReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  DownloadReactor(ServiceContext& ctx, DownloadSource source, uint64_t chunk, bool checksums,
                  std::shared_ptr<const void> admission)
      : state_(std::make_shared<State>(ctx, std::move(source), chunk, checksums)),
        admission_(std::move(admission)) {
    {
      absl::MutexLock lock(&state_->mu);
      state_->reactor = this;
    }
    StatePtr s = state_;
    std::shared_ptr<HostAccess> access = ctx.executor.AcquireHostAccess(
        {{state_->buffer, false}}, [s](const std::shared_ptr<HostAccess>&) {
          absl::MutexLock lock(&s->mu);
          // The producer wrote the buffer, so it is done by now.
          if (s->producer != nullptr) {
            const OperationStatus& copy = Executor::FinalStatus(*s->producer);
            if (copy.state == OperationStatus::State::kFailed && s->copy_error.ok()) {
              s->copy_error = absl::Status(copy.error.code(),
                                           absl::StrCat("copying the view in C order: ",
                                                        copy.error.message()));
            }
            s->producer.reset();
          }
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
    state_->slots[state_->write_slot].message.Clear();
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
    grpc::ByteBuffer message;
    HostStagingPool::Block staging;
    uint64_t offset = 0;  // in the buffer
    uint64_t bytes = 0;
    bool first = false;  // carries the buffer's info
    bool copying = false;
    bool filled = false;
  };
  struct State {
    State(ServiceContext& c, DownloadSource source, uint64_t ch, bool crc)
        : ctx(c),
          buffer(std::move(source.buffer)),
          named(std::move(source.named)),
          view_shape(std::move(source.view_shape)),
          producer(std::move(source.producer)),
          scope(buffer->client),
          offset(source.offset),
          end(source.offset + source.size),
          origin(source.origin),
          chunk(ch),
          checksums(crc),
          range_name(absl::StrCat("download ", buffer->id)),
          next(source.offset) {}
    ServiceContext& ctx;
    BufferHandle buffer;
    BufferHandle named;  // reported instead of `buffer` when set (a view's download)
    const std::optional<std::vector<uint64_t>> view_shape;  // reported with `named`
    std::shared_ptr<Operation> producer ABSL_GUARDED_BY(mu);  // DownloadSource's
    // The buffer's owner, whose tenant the transfer is counted for (the buffer itself is
    // let go before the last answer).
    const std::string scope;
    const uint64_t offset;
    const uint64_t end;
    const uint64_t origin;  // offsets are reported from here
    const uint64_t chunk;
    const bool checksums;
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

  static void FinishLocked(const StatePtr& s, grpc::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    if (s->finished || s->reactor == nullptr) return;
    s->finished = true;
    if (!status.ok()) {
      s->ctx.executor.RecordFailedTransfer(s->scope, OperationKind::kDownload,
                                           FromGrpcStatus(status));
    }
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
      f.offset = s->next;
      f.bytes = n;
      f.first = !s->sent_any;
      f.staging.reset();
      if (n != 0) {
        absl::StatusOr<HostStagingPool::Block> block = s->ctx.staging->Acquire(n);
        if (!block.ok()) return FinishLocked(s, ToGrpcStatus(block.status()));
        f.staging = *std::move(block);
      }
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
        st =
            s->ctx.backend.CopyToPinnedHost(stream, s->buffer->memory, f.offset, f.staging->data(), n);
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
      const bool last = w.offset + w.bytes == s->end && s->next == s->end;
      v1::TransferStats stats;
      if (last) {
        const uint64_t bytes = s->end - s->offset;
        SetTransferStats(bytes, s->start, &stats);
        s->ctx.executor.RecordTransfer(s->scope, OperationKind::kDownload, bytes);
      }
      v1::BufferInfo info;
      if (w.first) DescribeSource(*s, &info);
      BuildMessage(s->checksums, w, s->origin, w.first ? &info : nullptr,
                   last ? &stats : nullptr);
      s->writing = true;
      s->reactor->StartWrite(&w.message);
      return;
    }
    const bool all_sent = s->sent_any && s->next == s->end && !s->slots[0].filled &&
                          !s->slots[1].filled && !s->slots[0].copying && !s->slots[1].copying;
    if (all_sent) {
      // Nothing reads the buffer any more: let it go before the client hears the answer,
      // so that a delete right after the download finds it free (OnDone's Release is
      // then a no-op).
      if (s->access != nullptr) s->ctx.executor.Release(s->access);
      s->buffer.reset();
      s->named.reset();
      FinishLocked(s, grpc::Status::OK);
    }
  }

  // The buffer read, as the first message reports it: for a view, the named buffer as
  // the view, whose bytes the download counts.
  static void DescribeSource(const State& s, v1::BufferInfo* info) {
    ToProto(s.named != nullptr ? *s.named : *s.buffer, info);
    if (!s.view_shape.has_value()) return;
    info->clear_shape();
    uint64_t bytes = DTypeSize(s.buffer->dtype);
    for (uint64_t extent : *s.view_shape) {
      info->add_shape(extent);
      bytes *= extent;  // within the buffer's size: a view never reaches outside it
    }
    info->set_layout(v1::LAYOUT_C);
    info->set_size_bytes(bytes);
  }

  // The slot's message: its data is a slice over the staging block, holding a
  // reference to it, so the block outlives any use gRPC makes of the slice.
  static void BuildMessage(bool checksums, Slot& slot, uint64_t origin,
                           const v1::BufferInfo* info, const v1::TransferStats* stats) {
    grpc::Slice data;
    std::optional<uint32_t> crc;
    if (slot.bytes != 0) {
      auto* owner = new HostStagingPool::Block(std::move(slot.staging));
      data = grpc::Slice((*owner)->data(), static_cast<size_t>(slot.bytes),
                         [](void* p) { delete static_cast<HostStagingPool::Block*>(p); }, owner);
      if (checksums) crc = ExtendCrc32c(0, (*owner)->data(), static_cast<size_t>(slot.bytes));
    } else if (checksums) {
      crc = 0;
    }
    slot.message = wire::DownloadChunk(info, slot.offset - origin, stats, crc, data);
  }

  StatePtr state_;
  std::shared_ptr<const void> admission_;  // the call's, until OnDone
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewDownloadReactor(
    ServiceContext& ctx, DownloadSource source, uint64_t chunk, bool checksums,
    std::shared_ptr<const void> admission) {
  return new DownloadReactor(ctx, std::move(source), chunk, checksums, std::move(admission));
}

}  // namespace gpucompute
