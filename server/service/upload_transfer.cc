#include "server/service/upload_transfer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/util/ids.h"
#include "server/service/operation_planner.h"
#include "server/service/proto_conversions.h"
#include "server/service/transfer_reactors.h"
#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

// The bytes a new buffer of `request` takes, its dtype and shape checked as
// AllocateFromRequest checks them (so a bad one gets the same answer).
absl::StatusOr<uint64_t> CreatedBytes(const ServiceContext& ctx,
                                      const v1::CreateBufferRequest& request) {
  BufferMeta meta;
  ASSIGN_OR_RETURN(meta.dtype, FromProto(request.dtype()));
  meta.shape.assign(request.shape().begin(), request.shape().end());
  RETURN_IF_ERROR(CheckShape(ctx.limits, meta.shape));
  return meta.size_bytes();  // at most 2^48 elements of 16 bytes: no overflow
}

}  // namespace

using Clock = std::chrono::steady_clock;

absl::Status UploadTransfer::ReserveBytes(uint64_t bytes) {
  if (ctx_.admission == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(reservation_, ctx_.admission->Reserve(TenantOfScope(client_), bytes));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<UploadTransfer>> UploadTransfer::Start(
    ServiceContext& ctx, std::string client, const v1::UploadHeader& header) {
  if (!header.transfer_id().empty()) {
    return absl::InvalidArgumentError("a new upload's header may not name a transfer_id");
  }
  std::shared_ptr<UploadTransfer> t(new UploadTransfer(ctx, std::move(client)));
  if (ctx.admission != nullptr) {
    ASSIGN_OR_RETURN(
        t->place_, ctx.admission->Admit(TenantAdmission::Kind::kUpload, TenantOfScope(t->client_)));
  }
  switch (header.target_case()) {
    case v1::UploadHeader::kCreate: {
      if (header.offset_bytes() != 0) {
        return absl::InvalidArgumentError("an upload that creates a buffer must start at offset 0");
      }
      if (header.create().has_fill()) {
        return absl::InvalidArgumentError("an upload provides the contents; 'fill' is not allowed");
      }
      ASSIGN_OR_RETURN(const uint64_t bytes, CreatedBytes(ctx, header.create()));
      RETURN_IF_ERROR(t->ReserveBytes(bytes));
      ASSIGN_OR_RETURN(BufferHandle b, AllocateFromRequest(ctx, t->client_, header.create()));
      const uint64_t size = b->size_bytes();
      if (header.size_bytes() != 0 && header.size_bytes() != size) {
        return absl::InvalidArgumentError(
            absl::StrCat("size_bytes is ", header.size_bytes(), " but a ", DTypeName(b->dtype),
                         " buffer of that shape holds ", size, " bytes"));
      }
      t->created_ = std::move(b);
      t->size_ = size;
      t->destination_ = &t->created_->memory;
      return t;
    }
    case v1::UploadHeader::kBuffer: {
      ASSIGN_OR_RETURN(BufferHandle b, ctx.registry.Lookup(t->client_, header.buffer()));
      const uint64_t size = b->size_bytes();
      if (header.offset_bytes() > size || header.size_bytes() > size - header.offset_bytes()) {
        return absl::InvalidArgumentError(absl::StrCat("bytes [", header.offset_bytes(), ", +",
                                                       header.size_bytes(), ") are outside buffer ",
                                                       b->id, " of ", size, " bytes"));
      }
      RETURN_IF_ERROR(t->ReserveBytes(header.size_bytes()));
      ASSIGN_OR_RETURN(t->staging_charge_, ctx.registry.ChargeFor(t->client_, header.size_bytes()));
      ASSIGN_OR_RETURN(t->device_staging_, ctx.backend.Allocate(b->device, header.size_bytes()));
      t->target_ = std::move(b);
      t->target_offset_ = header.offset_bytes();
      t->size_ = header.size_bytes();
      t->destination_ = &t->device_staging_;
      return t;
    }
    case v1::UploadHeader::TARGET_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("the upload header names no target: set 'create' or 'buffer'");
}

void UploadTransfer::Publish(std::shared_ptr<UploadTransferTable> table,
                             std::chrono::nanoseconds idle_timeout) {
  id_ = NewId("upl-");
  table->Add(shared_from_this());
  {
    absl::MutexLock lock(&mu_);
    table_ = std::move(table);
  }
  WatchIdle(idle_timeout);
}

void UploadTransfer::WatchIdle(std::chrono::nanoseconds idle_timeout) {
  if (idle_timeout <= std::chrono::nanoseconds::zero()) return;
  absl::MutexLock lock(&mu_);
  idle_timeout_ = idle_timeout;
  ScheduleIdleCheckLocked();
}

std::chrono::nanoseconds UploadTransfer::IdleTimeoutLocked() const {
  // Once a range has joined, the client's death cancels its call, which fails the
  // upload. Before that (a client killed right after BeginUpload, or whose calls never
  // reached the server) only this timeout gives the memory back, and the client's own
  // (a minute by default) must not hold it past the operator's bound.
  const std::chrono::nanoseconds server = absl::ToChronoNanoseconds(ctx_.upload_idle_timeout);
  if (ranges_.empty() && server > std::chrono::nanoseconds::zero() && server < idle_timeout_) {
    return server;
  }
  return idle_timeout_;
}

void UploadTransfer::ScheduleIdleCheckLocked() {
  std::weak_ptr<UploadTransfer> weak = weak_from_this();
  ctx_.timer.Schedule(last_activity_ + IdleTimeoutLocked(), [weak] {
    std::shared_ptr<UploadTransfer> self = weak.lock();
    if (self == nullptr) return;
    absl::MutexLock lock(&self->mu_);
    if (self->finished_ || self->committing_ || !self->error_.ok()) return;
    const std::chrono::nanoseconds idle_timeout = self->IdleTimeoutLocked();
    if (Clock::now() - self->last_activity_ < idle_timeout) {
      return self->ScheduleIdleCheckLocked();
    }
    self->error_ = absl::DeadlineExceededError(absl::StrCat(
        "upload ", self->id_.empty() ? "" : absl::StrCat(self->id_, " "), "received no data for ",
        std::chrono::duration<double>(idle_timeout).count(),
        " s (the server's idle timeout); its memory was released and nothing was changed"));
    self->MaybeFinishLocked();
  });
}

absl::Status UploadTransfer::AddRange(uint64_t offset, uint64_t size, Listener listener) {
  absl::MutexLock lock(&mu_);
  if (finished_ || committing_ || !error_.ok()) {
    return absl::NotFoundError(absl::StrCat("upload ", id_, " is over"));
  }
  listeners_.push_back(std::move(listener));
  last_activity_ = Clock::now();
  absl::Status bad;
  if (offset > size_ || size > size_ - offset) {
    bad = absl::InvalidArgumentError(absl::StrCat("range [", offset, ", +", size,
                                                  ") is outside the upload's ", size_, " bytes"));
  } else if (size == 0 && size_ != 0) {
    bad = absl::InvalidArgumentError("a range stream must carry at least one byte");
  } else if (ranges_.size() >= kMaxUploadRanges) {
    bad = absl::InvalidArgumentError(
        absl::StrCat("an upload may have at most ", kMaxUploadRanges, " ranges"));
  } else if (size != 0) {
    // The claimed range after `offset`, and the one before it.
    auto next = ranges_.lower_bound(offset);
    const bool overlaps_next = next != ranges_.end() && next->first < offset + size;
    const bool overlaps_previous =
        next != ranges_.begin() && std::prev(next)->first + std::prev(next)->second > offset;
    if (overlaps_next || overlaps_previous) {
      bad = absl::InvalidArgumentError(absl::StrCat(
          "range [", offset, ", +", size, ") overlaps a range of the upload already claimed"));
    }
  }
  if (!bad.ok()) {
    error_ = absl::Status(bad.code(), absl::StrCat(bad.message(), "; nothing was changed"));
    MaybeFinishLocked();
    return bad;
  }
  ranges_.emplace(offset, size);
  ++open_ranges_;
  return absl::OkStatus();
}

void UploadTransfer::Write(uint64_t offset, const void* src, HostMemory memory, uint64_t bytes,
                           absl::AnyInvocable<void(absl::Status) &&> done) {
  absl::Status st;
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok() || finished_) {
      st = absl::AbortedError("the upload has failed");
    } else {
      ++copies_in_flight_;
      last_activity_ = Clock::now();
    }
  }
  if (!st.ok()) return std::move(done)(st);
  Stream& stream = ctx_.executor.TransferStream(destination_->device());
  {
    // Named after the buffer the bytes are for, as the executor names operations.
    ScopedRange range(ctx_.backend,
                      absl::StrCat("upload ", (created_ != nullptr ? created_ : target_)->id));
    switch (memory) {
      case HostMemory::kStaging:  // host staging is pinned memory too
      case HostMemory::kPinned:
        st = ctx_.backend.CopyFromPinnedHost(stream, src, *destination_, offset, bytes);
        break;
      case HostMemory::kPageable:
        // Through the backend's own staging on CUDA: one DMA needs pinned memory.
        st = ctx_.backend.CopyFromHost(stream, src, *destination_, offset, bytes);
        break;
    }
  }
  if (st.ok()) {
    st = stream.OnComplete(
        [self = shared_from_this(), done = std::move(done), bytes](absl::Status status) mutable {
          std::move(done)(status);
          if (status.ok()) {
            absl::MutexLock lock(&self->mu_);
            self->received_ += bytes;
          }
          self->CopyDone(status);
        });
    if (st.ok()) return;
  }
  // Nothing was enqueued that would call `done`. (A copy enqueued without its
  // completion is ordered before later work on the stream, which the release waits for.)
  std::move(done)(st);
  CopyDone(st);
}

void UploadTransfer::CopyDone(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  --copies_in_flight_;
  if (!status.ok() && error_.ok()) error_ = status;
  MaybeFinishLocked();
}

void UploadTransfer::RangeDone() {
  absl::MutexLock lock(&mu_);
  --open_ranges_;
  last_activity_ = Clock::now();
  MaybeFinishLocked();
}

void UploadTransfer::Fail(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (finished_ || committing_ || !error_.ok()) return;
  error_ = std::move(status);
  MaybeFinishLocked();
}

void UploadTransfer::MaybeFinishLocked() {
  if (finished_ || committing_ || copies_in_flight_ > 0) return;
  if (!error_.ok()) return FinishLocked(error_);
  if (open_ranges_ == 0 && received_ == size_ && !listeners_.empty()) CommitLocked();
}

void UploadTransfer::CommitLocked() {
  committing_ = true;
  if (table_ != nullptr) table_->Remove(id_);
  if (created_ != nullptr) {
    absl::Status st = ctx_.registry.Register(created_);
    if (st.ok()) ctx_.executor.RecordTransfer(client_, OperationKind::kUpload, size_);
    return FinishLocked(std::move(st));
  }
  // Overwrite the range in stream order with everything else that touches the buffer.
  Executor::OpSpec spec;
  spec.kind = OperationKind::kCopy;
  spec.accesses = {{target_, true}};
  spec.bytes_read = size_;
  spec.bytes_written = size_;
  spec.outputs.push_back(*target_);
  spec.launch = [self = shared_from_this()](Stream& stream,
                                            OpResult&) -> absl::StatusOr<LaunchInfo> {
    RETURN_IF_ERROR(self->ctx_.backend.Copy(stream, self->device_staging_, 0, self->target_->memory,
                                            self->target_offset_, self->size_));
    return LaunchInfo{};
  };
  absl::StatusOr<std::shared_ptr<Operation>> op =
      ctx_.executor.Submit(client_, "", std::move(spec));
  if (!op.ok()) return FinishLocked(op.status());
  // OnDone runs the callback at once if the copy is already done. Nothing else changes
  // the upload while it commits.
  mu_.Unlock();
  ctx_.executor.OnDone(*op, [self = shared_from_this(), op = *op] {
    absl::MutexLock lock(&self->mu_);
    const absl::Status error = self->ctx_.executor.GetStatus(*op).error;
    if (error.ok())
      self->ctx_.executor.RecordTransfer(self->client_, OperationKind::kUpload, self->size_);
    self->FinishLocked(error);
  });
  mu_.Lock();
}

void UploadTransfer::FinishLocked(absl::Status status) {
  if (finished_) return;
  finished_ = true;
  if (!status.ok()) ctx_.executor.RecordFailedTransfer(client_, OperationKind::kUpload, status);
  if (table_ != nullptr) table_->Remove(id_);
  table_.reset();
  v1::UploadResponse response;
  if (status.ok()) {
    ToProto(created_ != nullptr ? *created_ : *target_, response.mutable_buffer());
    SetTransferStats(size_, start_, response.mutable_transfer());
  }
  // The memory goes back before anyone hears the outcome (a registered buffer keeps its
  // own reference).
  destination_ = nullptr;
  created_.reset();
  target_.reset();
  device_staging_ = DeviceMemory();
  staging_charge_ = MemoryLimiter::Charge();
  place_.reset();
  reservation_.reset();
  std::vector<Listener> listeners = std::move(listeners_);
  listeners_.clear();
  ctx_.timer.Post([listeners = std::move(listeners), status = std::move(status),
                   response = std::move(response)]() mutable {
    for (Listener& l : listeners) std::move(l)(status, response);
  });
}

void UploadTransferTable::Add(std::shared_ptr<UploadTransfer> transfer) {
  absl::MutexLock lock(&mu_);
  transfers_[transfer->id()] = std::move(transfer);
}

absl::StatusOr<std::shared_ptr<UploadTransfer>> UploadTransferTable::Lookup(
    const std::string& client, const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(id);
  if (it == transfers_.end() || it->second->client() != client) {
    return absl::NotFoundError(absl::StrCat("no upload in progress has transfer id '", id, "'"));
  }
  return it->second;
}

void UploadTransferTable::FailAll(const absl::Status& status) {
  std::map<std::string, std::shared_ptr<UploadTransfer>> transfers;
  {
    absl::MutexLock lock(&mu_);
    transfers.swap(transfers_);
  }
  // Outside the table's lock: a failing upload leaves the table itself.
  for (auto& [id, transfer] : transfers) transfer->Fail(status);
}

void UploadTransferTable::Remove(const std::string& id) {
  absl::MutexLock lock(&mu_);
  transfers_.erase(id);
}

size_t UploadTransferTable::size() {
  absl::MutexLock lock(&mu_);
  return transfers_.size();
}

}  // namespace gpucompute
