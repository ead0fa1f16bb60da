#include "server/persistence/persistence.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "server/util/log.h"
#include "server/persistence/persist_format.h"
#include "server/tenancy/auth.h"
#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

// Host staging block the payload moves through, so that a buffer of any size costs
// this much host memory to write or restore.
constexpr uint64_t kChunkBytes = uint64_t{16} << 20;

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// Closes a file descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now, reporting a failure (a delayed write error shows up here).
  bool Close() { return close(std::exchange(fd_, -1)) == 0; }

 private:
  int fd_;
};

absl::Status ReadFull(int fd, void* data, size_t size, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot read", path);
    if (n == 0) return absl::InvalidArgumentError("truncated: the file ends early");
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status WriteFull(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot write", path);
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  Fd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 || fsync(fd.get()) != 0) return Errno("cannot sync directory", dir);
  return absl::OkStatus();
}

// Enqueues a copy with `enqueue` on `stream` and waits for it.
absl::Status CopyAndWait(Stream& stream, absl::FunctionRef<absl::Status()> enqueue) {
  RETURN_IF_ERROR(enqueue());
  absl::Notification done;
  absl::Status result;
  RETURN_IF_ERROR(stream.OnComplete([&](absl::Status s) {
    result = std::move(s);
    done.Notify();
  }));
  done.WaitForNotification();
  return result;
}

std::string Join(const std::string& dir, absl::string_view name) {
  return absl::StrCat(dir, "/", name);
}

}  // namespace

absl::StatusOr<BufferPersister::Restored> BufferPersister::Restore(
    bool authenticated, absl::string_view unauthenticated_tenant) {
  if (mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) return Errno("cannot create", dir_);
  std::vector<std::string> names;
  {
    DIR* d = opendir(dir_.c_str());
    if (d == nullptr) return Errno("cannot open", dir_);
    while (dirent* e = readdir(d)) names.emplace_back(e->d_name);
    closedir(d);
  }
  // In name order: the same files restore the same way, whatever the directory's order.
  std::sort(names.begin(), names.end());
  Restored restored;
  absl::MutexLock lock(&mu_);
  for (const std::string& name : names) {
    const std::string path = Join(dir_, name);
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (absl::EndsWith(name, kPersistTempSuffix)) {
      // A write the last server did not finish; the file it would have replaced is intact.
      Log(LogLevel::kWarning, absl::StrCat(path, ": removing an unfinished write"));
      unlink(path.c_str());
      continue;
    }
    bool stranded = false;
    if (absl::Status s = RestoreFile(path, authenticated, unauthenticated_tenant, &stranded);
        !s.ok()) {
      Log(LogLevel::kWarning, absl::StrCat(path, ": not restored: ", s.message()));
      continue;
    }
    known_files_.insert(name);
    ++restored.buffers;
    restored.stranded += stranded;
  }
  return restored;
}

absl::Status BufferPersister::RestoreFile(const std::string& path, bool authenticated,
                                          absl::string_view unauthenticated_tenant,
                                          bool* stranded) {
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Errno("cannot open", path);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return Errno("cannot stat", path);
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  std::string header(std::min<uint64_t>(file_bytes, kPersistPrefixBytes), '\0');
  RETURN_IF_ERROR(ReadFull(fd.get(), header.data(), header.size(), path));
  ASSIGN_OR_RETURN(size_t header_bytes, DecodePersistPrefix(header));
  if (file_bytes < header_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("truncated: the header needs ", header_bytes,
                                                   " bytes, the file has ", file_bytes));
  }
  header.resize(header_bytes);
  RETURN_IF_ERROR(ReadFull(fd.get(), header.data() + kPersistPrefixBytes,
                           header_bytes - kPersistPrefixBytes, path));
  ASSIGN_OR_RETURN(PersistedHeader h, DecodePersistHeader(header));
  // Persisted without authentication: its scope is its client's name alone.
  const bool unauthenticated = authenticated && TenantOfScope(h.scope).empty();
  if (unauthenticated && !unauthenticated_tenant.empty()) {
    h.scope = ScopeOf(unauthenticated_tenant, h.scope);
  }
  const uint64_t rest = file_bytes - header_bytes;
  if (rest < 4 || rest - 4 != h.payload_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(rest < 4 || rest - 4 < h.payload_bytes ? "truncated" : "too long",
                     ": the header promises ", h.payload_bytes,
                     " payload bytes and a CRC, the file has ", rest, " bytes after the header"));
  }
  const int device = h.device < static_cast<int>(backend_.devices().size())
                         ? h.device
                         : executor_.default_device();
  // Allocate checks the name (taken, or too many buffers) and the memory limit.
  ASSIGN_OR_RETURN(BufferHandle entry,
                   registry_.Allocate(h.scope, h.name, h.dtype, h.shape, h.layout, device));
  entry->id = h.id;  // clients hold the id across the restart
  // The time the server was down does not count against the lease.
  entry->lease.Set(h.ttl_nanos, SteadyNanos());
  if (h.payload_bytes > 0) {
    ASSIGN_OR_RETURN(DeviceMemory staging,
                     backend_.AllocateHostStaging(std::min(h.payload_bytes, kChunkBytes)));
    Stream& stream = executor_.TransferStream(device);
    uint32_t crc = 0;
    for (uint64_t offset = 0; offset < h.payload_bytes; offset += kChunkBytes) {
      const uint64_t n = std::min(kChunkBytes, h.payload_bytes - offset);
      RETURN_IF_ERROR(ReadFull(fd.get(), staging.data(), n, path));
      crc = ExtendCrc32c(crc, staging.data(), n);
      RETURN_IF_ERROR(CopyAndWait(stream, [&] {
        return backend_.CopyFromPinnedHost(stream, staging.data(), entry->memory, offset, n);
      }));
    }
    unsigned char stored[4];
    RETURN_IF_ERROR(ReadFull(fd.get(), stored, 4, path));
    const uint32_t expected =
        stored[0] | stored[1] << 8 | stored[2] << 16 | static_cast<uint32_t>(stored[3]) << 24;
    if (crc != expected) {
      return absl::DataLossError("the payload's CRC32C does not match: the file is corrupt");
    }
  } else {
    unsigned char stored[4];
    RETURN_IF_ERROR(ReadFull(fd.get(), stored, 4, path));
    if (stored[0] != 0 || stored[1] != 0 || stored[2] != 0 || stored[3] != 0) {
      return absl::DataLossError("the payload's CRC32C does not match: the file is corrupt");
    }
  }
  RETURN_IF_ERROR(registry_.Register(entry));
  *stranded = unauthenticated && unauthenticated_tenant.empty();
  return absl::OkStatus();
}

absl::Status BufferPersister::WriteBuffer(const BufferHandle& buffer) {
  PersistedHeader h;
  h.scope = buffer->client;
  h.id = buffer->id;
  h.name = buffer->name;
  h.dtype = buffer->dtype;
  h.layout = buffer->layout;
  h.shape = buffer->shape;
  h.device = buffer->device;
  h.payload_bytes = buffer->size_bytes();
  h.ttl_nanos = buffer->lease.ttl_nanos.load();
  ASSIGN_OR_RETURN(std::string header, EncodePersistHeader(h));
  const std::string temp = Join(dir_, absl::StrCat(buffer->id, kPersistTempSuffix));
  const std::string final_path = Join(dir_, absl::StrCat(buffer->id, kPersistSuffix));
  absl::Status status = [&]() -> absl::Status {
    Fd fd(open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (fd.get() < 0) return Errno("cannot create", temp);
    RETURN_IF_ERROR(WriteFull(fd.get(), header.data(), header.size(), temp));
    uint32_t crc = 0;
    if (h.payload_bytes > 0) {
      ASSIGN_OR_RETURN(DeviceMemory staging,
                       backend_.AllocateHostStaging(std::min(h.payload_bytes, kChunkBytes)));
      // Reads the buffer as a download does: after the writes queued before, and with
      // later writes waiting until the copy is done.
      struct Ready {
        absl::Notification notification;
      };
      auto ready = std::make_shared<Ready>();
      std::shared_ptr<HostAccess> access = executor_.AcquireHostAccess(
          {{buffer, false}},
          [ready](const std::shared_ptr<HostAccess>&) { ready->notification.Notify(); });
      ready->notification.WaitForNotification();
      Stream& stream = executor_.TransferStream(buffer->device);
      absl::Status copied;
      for (uint64_t offset = 0; copied.ok() && offset < h.payload_bytes; offset += kChunkBytes) {
        const uint64_t n = std::min(kChunkBytes, h.payload_bytes - offset);
        copied = CopyAndWait(stream, [&] {
          return backend_.CopyToPinnedHost(stream, buffer->memory, offset, staging.data(), n);
        });
        if (copied.ok()) {
          crc = ExtendCrc32c(crc, staging.data(), n);
          copied = WriteFull(fd.get(), staging.data(), n, temp);
        }
      }
      executor_.Release(access);
      RETURN_IF_ERROR(copied);
    }
    const unsigned char trailer[4] = {
        static_cast<unsigned char>(crc), static_cast<unsigned char>(crc >> 8),
        static_cast<unsigned char>(crc >> 16), static_cast<unsigned char>(crc >> 24)};
    RETURN_IF_ERROR(WriteFull(fd.get(), trailer, 4, temp));
    if (fsync(fd.get()) != 0) return Errno("cannot sync", temp);
    if (!fd.Close()) return Errno("cannot close", temp);
    if (rename(temp.c_str(), final_path.c_str()) != 0) return Errno("cannot rename", temp);
    return absl::OkStatus();
  }();
  if (!status.ok()) unlink(temp.c_str());
  return status;
}

absl::StatusOr<size_t> BufferPersister::Snapshot() {
  absl::MutexLock lock(&mu_);
  if (absl::Status health = backend_.health(); !health.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("the backend has failed (", health.message(),
                                                      "); keeping the files written before"));
  }
  absl::flat_hash_set<std::string> current;
  size_t written = 0;
  for (const BufferHandle& buffer : registry_.ListNamed()) {
    const std::string name = absl::StrCat(buffer->id, kPersistSuffix);
    current.insert(name);
    if (absl::Status s = WriteBuffer(buffer); !s.ok()) {
      Log(LogLevel::kError, absl::StrCat("buffer ", buffer->id,
                                         " not persisted (its last file stays): ", s.message()));
      continue;
    }
    known_files_.insert(name);
    ++written;
  }
  // The renames must be durable before the files they supersede go.
  RETURN_IF_ERROR(SyncDir(dir_));
  std::vector<std::string> stale;
  for (const std::string& name : known_files_) {
    if (!current.contains(name)) stale.push_back(name);
  }
  for (const std::string& name : stale) {
    const std::string path = Join(dir_, name);
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      Log(LogLevel::kError, absl::StrCat("cannot remove ", path, ": ", std::strerror(errno)));
      continue;
    }
    known_files_.erase(name);
  }
  if (!stale.empty()) RETURN_IF_ERROR(SyncDir(dir_));
  return written;
}

void BufferPersister::StartPeriodic(absl::Duration interval) {
  periodic_ = std::thread([this, interval] {
    while (!stop_.WaitForNotificationWithTimeout(interval)) {
      absl::StatusOr<size_t> written = Snapshot();
      if (!written.ok()) {
        Log(LogLevel::kError,
            absl::StrCat("snapshot to ", dir_, " failed: ", written.status().message()));
      }
    }
  });
}

void BufferPersister::StopPeriodic() {
  if (!periodic_.joinable()) return;
  stop_.Notify();
  periodic_.join();
}

}  // namespace gpucompute
