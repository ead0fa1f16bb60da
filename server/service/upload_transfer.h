// The destination and the all-or-nothing commit of one upload, shared by the Upload
// streams that carry its bytes: one stream for a plain Upload, several concurrent range
// streams for a multi-range upload (BufferService.BeginUpload, whose transfers live in
// an UploadTransferTable until they finish). A range of a multi-range upload may also
// come from shared memory, as a SharedMemoryService.CopyFromRegion call, which takes the
// part of a range stream.
#ifndef GPUCOMPUTE_SERVER_SERVICE_UPLOAD_TRANSFER_H_
#define GPUCOMPUTE_SERVER_SERVICE_UPLOAD_TRANSFER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "server/core/buffer_registry.h"
#include "server/service/service_context.h"

namespace gpucompute {

class UploadTransferTable;

// Bytes arrive in ranges, each claimed by one stream; a stream reports its range done
// once every byte of it has been copied and the stream has half-closed. When every
// byte of the upload has arrived, the upload commits: a new buffer is registered, or the
// staged bytes are copied over the existing buffer's range in stream order. Any failure
// (of any stream, a copy, or the idle timeout) fails the whole upload: the memory it
// reserved is freed once no copy writes into it any more, and only then does any of
// its streams hear the result, so that memory in use is back where it was before a
// failed upload's client learns of it.
class UploadTransfer : public std::enable_shared_from_this<UploadTransfer> {
 public:
  // Called once per stream, on the timer thread, with the upload's outcome.
  using Listener = absl::AnyInvocable<void(const absl::Status&, const v1::UploadResponse&) &&>;
  // The host memory a Write copies from, which decides the backend's copy: host staging
  // memory (Backend::AllocateHostStaging, an Upload stream's chunks), host memory pinned
  // with Backend::PinHostMemory (a pinned shared-memory region), or any other.
  enum class HostMemory { kStaging, kPinned, kPageable };

  // Checks `header` (an Upload header or BeginUpload's: a target, no transfer id), takes
  // a place among the tenant's uploads under way (RESOURCE_EXHAUSTED at
  // --max-uploads-per-tenant) and reserves the memory the upload writes into, charged
  // to the tenant from now on and counted against its bound on reservations
  // (RESOURCE_EXHAUSTED past --max-reserved-fraction-per-tenant of the memory limit).
  static absl::StatusOr<std::shared_ptr<UploadTransfer>> Start(ServiceContext& ctx,
                                                               std::string client,
                                                               const v1::UploadHeader& header);

  const std::string& id() const { return id_; }
  const std::string& client() const { return client_; }
  uint64_t size() const { return size_; }

  // Keeps the upload in `table` until it finishes, and fails it after `idle_timeout`
  // without data.
  void Publish(std::shared_ptr<UploadTransferTable> table, std::chrono::nanoseconds idle_timeout);
  // Fails the upload with DEADLINE_EXCEEDED once it has received nothing (no range, no
  // chunk) for `idle_timeout`, or, before its first range, for the server's
  // --upload-idle-timeout if that is shorter; zero: never. Call once, before data arrives.
  void WatchIdle(std::chrono::nanoseconds idle_timeout);

  // Claims bytes [offset, offset + size) of the upload for a stream. NOT_FOUND if the
  // upload is over (failed or committing); `listener` is then dropped and the stream
  // answers by itself. Otherwise `listener` will hear the outcome; a bad range fails the
  // whole upload, and this returns why.
  absl::Status AddRange(uint64_t offset, uint64_t size, Listener listener);
  // Enqueues the copy of `bytes` from host memory `src` of kind `memory` to upload
  // offset `offset`; `done` runs when it has completed (or could not be enqueued),
  // outside this upload's lock. The caller keeps `src` alive until then.
  void Write(uint64_t offset, const void* src, HostMemory memory, uint64_t bytes,
             absl::AnyInvocable<void(absl::Status) &&> done);
  // A stream's range has been copied and the stream half-closed.
  void RangeDone();
  // Fails the upload (the first failure is the one every stream hears).
  void Fail(absl::Status status);

 private:
  UploadTransfer(ServiceContext& ctx, std::string client) : ctx_(ctx), client_(std::move(client)) {}

  // Counts `bytes` against the tenant's bound on reservations, until the upload finishes.
  absl::Status ReserveBytes(uint64_t bytes);

  void CopyDone(const absl::Status& status);
  // May commit or finish; call after any change.
  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CommitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the memory, leaves the table and tells every stream.
  void FinishLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleIdleCheckLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::chrono::nanoseconds IdleTimeoutLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ServiceContext& ctx_;
  const std::string client_;
  std::string id_;
  uint64_t size_ = 0;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  // Where the bytes go: a new buffer's memory, or staging device memory of the upload's
  // size that the commit copies over `target` at `target_offset`. Written only before
  // the upload is shared.
  BufferHandle created_;
  BufferHandle target_;
  uint64_t target_offset_ = 0;
  DeviceMemory device_staging_;
  MemoryLimiter::Charge staging_charge_;
  DeviceMemory* destination_ = nullptr;
  // The upload's place among its tenant's uploads (TenantAdmission), until it finishes.
  std::shared_ptr<const void> place_;
  // Its bytes among its tenant's reservations (TenantAdmission::Reserve), as long.
  std::shared_ptr<const void> reservation_;

  absl::Mutex mu_;
  std::shared_ptr<UploadTransferTable> table_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, uint64_t> ranges_ ABSL_GUARDED_BY(mu_);  // offset -> size
  std::vector<Listener> listeners_ ABSL_GUARDED_BY(mu_);
  uint64_t received_ ABSL_GUARDED_BY(mu_) = 0;  // bytes whose copy completed
  int open_ranges_ ABSL_GUARDED_BY(mu_) = 0;    // claimed and not yet done
  int copies_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool committing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::chrono::nanoseconds idle_timeout_ ABSL_GUARDED_BY(mu_){0};
  std::chrono::steady_clock::time_point last_activity_ ABSL_GUARDED_BY(mu_) =
      std::chrono::steady_clock::now();
};

// The multi-range uploads in progress, by transfer id.
class UploadTransferTable {
 public:
  void Add(std::shared_ptr<UploadTransfer> transfer);
  // NOT_FOUND unless `id` is an upload of `client` still in progress.
  absl::StatusOr<std::shared_ptr<UploadTransfer>> Lookup(const std::string& client,
                                                         const std::string& id);
  void Remove(const std::string& id);
  // Fails every upload still in progress with `status` (at shutdown: an upload and its
  // table hold each other, and an upload no stream carries any more would otherwise
  // wait for its idle timeout).
  void FailAll(const absl::Status& status);
  size_t size();

 private:
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<UploadTransfer>> transfers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_UPLOAD_TRANSFER_H_
