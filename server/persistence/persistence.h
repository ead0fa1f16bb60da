// Named buffers that survive a restart (--persist-dir): written to one file each
// (server/persistence/persist_format.h) at shutdown and, optionally, periodically; restored at start
// before the server serves.
#ifndef GPUCOMPUTE_SERVER_PERSISTENCE_PERSISTENCE_H_
#define GPUCOMPUTE_SERVER_PERSISTENCE_PERSISTENCE_H_

#include <cstddef>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/core/backend.h"
#include "server/core/buffer_registry.h"
#include "server/core/executor.h"

namespace gpucompute {

class BufferPersister {
 public:
  BufferPersister(Backend& backend, Executor& executor, BufferRegistry& registry, std::string dir)
      : backend_(backend), executor_(executor), registry_(registry), dir_(std::move(dir)) {}
  ~BufferPersister() { StopPeriodic(); }
  BufferPersister(const BufferPersister&) = delete;
  BufferPersister& operator=(const BufferPersister&) = delete;

  // Creates the directory if needed and registers the buffer of every file in it, with
  // its id, name, owner scope, dtype, shape and layout. A file that cannot be restored
  // (foreign, corrupt, truncated, of another format version, its id or name taken, over
  // the memory limit) is reported on stderr, naming the file and why, and left as it
  // is; so is a temporary file of an interrupted write, which is removed. Fails only
  // when the directory cannot be used.
  //
  // A server without authentication files every buffer in the one unnamed tenant ""
  // (server/tenancy/auth.h). When this server authenticates its callers
  // (`authenticated`), such a buffer is restored into `unauthenticated_tenant`, its
  // client's name kept (and is written back there), or, with no such tenant, into the
  // unnamed tenant, which no token names: only an admin reaches it there, as
  // kUnauthenticatedTenantName, and it is counted as stranded.
  struct Restored {
    size_t buffers = 0;
    size_t stranded = 0;  // of them, left in the unnamed tenant behind authentication
  };
  absl::StatusOr<Restored> Restore(bool authenticated = false,
                                   absl::string_view unauthenticated_tenant = "");

  // Writes every named buffer (after the work writing it that was queued before), each
  // atomically: a temporary file in the directory, fsync, rename, fsync of the
  // directory. Then removes the files of buffers restored or written earlier that no
  // longer exist, so that deleted buffers do not come back. A buffer that cannot be
  // written keeps its previous file and is reported. Returns the buffers written.
  // Refuses (FAILED_PRECONDITION) while the backend has failed, keeping every file.
  absl::StatusOr<size_t> Snapshot();

  // Snapshots every `interval` on a thread of its own until StopPeriodic.
  void StartPeriodic(absl::Duration interval);
  void StopPeriodic();

  const std::string& dir() const { return dir_; }

 private:
  // Restores one file; *stranded tells whether the buffer was left in the unnamed tenant
  // behind authentication (see Restore).
  absl::Status RestoreFile(const std::string& path, bool authenticated,
                           absl::string_view unauthenticated_tenant, bool* stranded);
  absl::Status WriteBuffer(const BufferHandle& buffer);

  Backend& backend_;
  Executor& executor_;
  BufferRegistry& registry_;
  const std::string dir_;
  absl::Mutex mu_;  // one snapshot at a time
  // File names (within dir_) this server restored or wrote: the ones it may remove.
  // Files it skipped at start are not among them, and stay for an operator to inspect.
  absl::flat_hash_set<std::string> known_files_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread periodic_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_PERSISTENCE_PERSISTENCE_H_
