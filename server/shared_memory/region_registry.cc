#include "server/shared_memory/region_registry.h"

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <utility>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "server/util/ids.h"
#include "server/util/log.h"
#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

// The longest name shm_open takes, its leading '/' included (NAME_MAX).
constexpr size_t kMaxShmNameBytes = 255;

absl::Status ValidateShmName(absl::string_view name) {
  if (name.size() < 2 || name.size() > kMaxShmNameBytes || name[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory name must be '/' and 1 to ", kMaxShmNameBytes - 1,
                     " more characters, e.g. '/my-region'"));
  }
  for (char c : name.substr(1)) {
    // shm_open names one file of /dev/shm: no directories, no control characters.
    if (c == '/' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(
          "shared-memory name may contain no '/' after the first and no control characters");
    }
  }
  return absl::OkStatus();
}

absl::Status ErrnoStatus(int error, absl::string_view call, absl::string_view name) {
  const std::string what = absl::StrCat(call, " of shared-memory object '", name, "': ",
                                        std::strerror(error));
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(absl::StrCat(what, " (is the client on the server's host?)"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(what);
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(what);
    case ELOOP:  // O_NOFOLLOW met a link
      return absl::InvalidArgumentError(absl::StrCat(
          "'", name, "' is a symbolic link, not a shared-memory object; the server follows none"));
    default:
      return absl::InvalidArgumentError(what);
  }
}

// The refusal of a file of /dev/shm that is not a regular file, saying what it is.
absl::Status NotAnObject(absl::string_view name, mode_t mode) {
  const char* kind = S_ISFIFO(mode)   ? "a FIFO"
                     : S_ISDIR(mode)  ? "a directory"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                     : S_ISSOCK(mode) ? "a socket"
                                      : "a file of another kind";
  return absl::InvalidArgumentError(
      absl::StrCat("'", name, "' is not a shared-memory object but ", kind,
                   "; register an object made with shm_open and ftruncate"));
}

// Closes a file descriptor on every way out.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// --- Copies that survive a shrunk object (ReadRegion, WriteRegion).
//
// A thread inside GuardedCopy points t_copy_escape at its jump buffer; the SIGBUS
// handler jumps back there, out of the faulting memcpy, and GuardedCopy fails. The
// memcpy holds no lock and owns nothing, so leaving it midway leaks nothing.

thread_local sigjmp_buf* volatile t_copy_escape = nullptr;
struct sigaction previous_sigbus_action;

void OnSigbus(int signal, siginfo_t* info, void* context) {
  if (sigjmp_buf* escape = t_copy_escape; escape != nullptr) {
    t_copy_escape = nullptr;
    siglongjmp(*escape, 1);
  }
  // Not a region copy's: as it would have gone without this handler.
  const struct sigaction& previous = previous_sigbus_action;
  const bool sent = info == nullptr || info->si_code <= 0;  // by kill(), not a fault
  if ((previous.sa_flags & SA_SIGINFO) != 0) {
    previous.sa_sigaction(signal, info, context);
    return;
  }
  if (previous.sa_handler == SIG_IGN && sent) return;
  if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(signal);
    return;
  }
  // The default action: a fault happens again on return, and ends the process with a
  // core as it would have; a sent signal is sent again.
  struct sigaction fallback = {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  sigaction(SIGBUS, &fallback, nullptr);
  if (sent) raise(signal);
}

// Once per process, before the first region is mapped; keeps the handler found.
void InstallSigbusHandler() {
  static absl::once_flag once;
  absl::call_once(once, [] {
    struct sigaction action = {};
    action.sa_sigaction = &OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGBUS, &action, &previous_sigbus_action) != 0) {
      Log(LogLevel::kError, "cannot install the SIGBUS handler: a client that shrinks a "
                            "shared-memory object can end the server",
          {{"error", std::strerror(errno)}});
    }
  });
}

// memcpy, but false rather than the end of the process when it meets SIGBUS.
bool GuardedCopy(void* dst, const void* src, size_t bytes) {
  sigjmp_buf escape;
  if (sigsetjmp(escape, /*savemask=*/1) != 0) return false;  // the handler jumped here
  t_copy_escape = &escape;
  // The handler must see the escape set for the whole copy: no moving it across.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, bytes);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_copy_escape = nullptr;
  return true;
}

absl::Status Truncated(const Region& region, uint64_t offset, uint64_t bytes) {
  return absl::FailedPreconditionError(absl::StrCat(
      "region ", region.id, ": shared-memory object '", region.shm_name,
      "' no longer holds its bytes [", region.shm_offset + offset, ", +", bytes,
      "), which the region maps: it was truncated after the region was registered. "
      "Unregister the region, and register it again once the object has its size"));
}

absl::Status CopyWithRegion(const Region& region, uint64_t offset, uint64_t bytes, void* dst,
                            const void* src) {
  RETURN_IF_ERROR(CheckByteRange(offset, bytes, region.size, absl::StrCat("region ", region.id)));
  if (GuardedCopy(dst, src, bytes)) return absl::OkStatus();
  return Truncated(region, offset, bytes);
}

}  // namespace

absl::Status ReadRegion(const Region& region, uint64_t offset, void* dst, uint64_t bytes) {
  return CopyWithRegion(region, offset, bytes, dst, region.mapping->data() + offset);
}

absl::Status WriteRegion(const Region& region, uint64_t offset, const void* src, uint64_t bytes) {
  return CopyWithRegion(region, offset, bytes, region.mapping->data() + offset, src);
}

bool DmaCopy(const Region& region, uint64_t bytes) {
  return region.mapping != nullptr && region.mapping->dma() && bytes >= kMinDmaCopyBytes;
}

absl::Status CheckRegionHolds(const Region& region, uint64_t offset, uint64_t bytes) {
  RETURN_IF_ERROR(CheckByteRange(offset, bytes, region.size, absl::StrCat("region ", region.id)));
  struct stat st;
  if (fstat(region.mapping->fd(), &st) != 0) {
    return ErrnoStatus(errno, "fstat", region.shm_name);
  }
  // offset + bytes <= region.size, and shm_offset + region.size fit at registration.
  if (region.shm_offset + offset + bytes > static_cast<uint64_t>(st.st_size)) {
    return Truncated(region, offset, bytes);
  }
  return absl::OkStatus();
}

absl::Status CheckByteRange(uint64_t offset, uint64_t size, uint64_t total,
                            absl::string_view what) {
  if (offset > total || size > total - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes [", offset, ", +", size, ") are outside ", what, " of ", total,
                     " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SharedMapping>> SharedMapping::Open(Backend& backend,
                                                                   absl::string_view name,
                                                                   uint64_t offset, uint64_t size,
                                                                   bool read_only) {
  RETURN_IF_ERROR(ValidateShmName(name));
  if (size == 0) return absl::InvalidArgumentError("a shared-memory region needs size_bytes > 0");
  const std::string path(name);
  // Anyone who may write /dev/shm can put any file there. O_NONBLOCK: opening a FIFO
  // read-only would otherwise wait for a writer forever, holding an RPC thread that no
  // shutdown can take back; it changes nothing for a regular file, whose mapping is all
  // the server uses. O_NOFOLLOW: a link could name any file the server may open.
  constexpr int kFlags = O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC;
  ScopedFd fd(shm_open(path.c_str(), (read_only ? O_RDONLY : O_RDWR) | kFlags, 0));
  struct stat st;
  if (fd.get() < 0) {
    const int error = errno;
    // shm_open answers EINVAL for a directory opened to write (for open's EISDIR): say so.
    ScopedFd probe(error == EINVAL && !read_only ? shm_open(path.c_str(), O_RDONLY | kFlags, 0)
                                                 : -1);
    if (probe.get() >= 0 && fstat(probe.get(), &st) == 0 && !S_ISREG(st.st_mode)) {
      return NotAnObject(name, st.st_mode);
    }
    return ErrnoStatus(error, "shm_open", name);
  }
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat", name);
  if (!S_ISREG(st.st_mode)) return NotAnObject(name, st.st_mode);
  RETURN_IF_ERROR(CheckByteRange(offset, size, static_cast<uint64_t>(st.st_size),
                                 absl::StrCat("shared-memory object '", name, "'")));
  InstallSigbusHandler();
  // mmap maps whole pages: map from the page holding `offset`.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = offset - offset % page;
  const size_t length = static_cast<size_t>(offset - start + size);  // <= st_size: no overflow
  void* base = mmap(nullptr, length, read_only ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED,
                    fd.get(), static_cast<off_t>(start));
  if (base == MAP_FAILED) return ErrnoStatus(errno, "mmap", name);
  std::unique_ptr<SharedMapping> mapping(
      new SharedMapping(backend, base, length, static_cast<char*>(base) + (offset - start), size));
  // Pinning makes a copy one DMA; a backend that cannot pin this mapping still copies
  // through its staging memory, so a failure here only costs speed.
  absl::Status pinned = backend.PinHostMemory(base, length, read_only);
  if (pinned.ok()) {
    mapping->pinned_ = true;
    // The CPU backend pins nothing (its default PinHostMemory succeeds doing nothing):
    // its copies are memcpys by its own threads.
    mapping->dma_ = backend.name() != "cpu";
    // Kept for CheckRegionHolds; only a DMA copy needs it.
    if (mapping->dma_) mapping->fd_ = fd.release();
  } else {
    Log(LogLevel::kWarning, "not pinning a shared-memory object",
        {{"path", path}, {"error", pinned.ToString()}});
  }
  return mapping;
}

SharedMapping::~SharedMapping() {
  if (pinned_) backend_.UnpinHostMemory(base_);
  munmap(base_, length_);
  if (fd_ >= 0) close(fd_);
}

RegionRegistry::RegionRegistry(absl::Duration idle_timeout) : idle_timeout_(idle_timeout) {
  if (idle_timeout_ > absl::ZeroDuration()) sweeper_ = std::thread([this] { SweepLoop(); });
}

RegionRegistry::~RegionRegistry() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (sweeper_.joinable()) sweeper_.join();
  absl::flat_hash_map<std::string, Entry> released;
  {
    absl::MutexLock lock(&mu_);
    released.swap(by_id_);
    count_by_client_.clear();
  }
}

void RegionRegistry::SweepLoop() {
  // Checks a few times per timeout, so that a region goes at most a quarter late, and at
  // least once a second.
  const absl::Duration period =
      std::clamp(idle_timeout_ / 4, absl::Milliseconds(10), absl::Seconds(1));
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), period);
    if (stopping_) break;
    mu_.Unlock();
    ReleaseIdle(absl::Now());
    mu_.Lock();
  }
}

// A request that must name a region and names none is malformed, not a lookup that
// failed: INVALID_ARGUMENT, as for an empty buffer reference.
absl::Status RegionRegistry::NamesNoRegion() {
  return absl::InvalidArgumentError("the request names no region: set 'region_id'");
}

absl::Status RegionRegistry::NotFound(absl::string_view id) {
  return absl::NotFoundError(absl::StrCat("region ", id, " not found"));
}

absl::StatusOr<RegionHandle> RegionRegistry::Add(std::unique_ptr<Region> region) {
  region->id = NewId("shm-");
  region->create_time_unix_nanos = absl::ToUnixNanos(absl::Now());
  RegionHandle handle(std::move(region));
  absl::MutexLock lock(&mu_);
  size_t& count = count_by_client_[handle->client];
  if (count >= kMaxRegionsPerClient) {
    if (count == 0) count_by_client_.erase(handle->client);
    return absl::ResourceExhaustedError(absl::StrCat(
        "a client may hold at most ", kMaxRegionsPerClient, " regions; unregister some first"));
  }
  ++count;
  by_id_.emplace(handle->id, Entry{handle, absl::Now()});
  return handle;
}

absl::StatusOr<RegionHandle> RegionRegistry::Lookup(absl::string_view client,
                                                    absl::string_view id) {
  if (id.empty()) return NamesNoRegion();
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end() || it->second.region->client != client) return NotFound(id);
  it->second.last_use = absl::Now();
  return it->second.region;
}

absl::StatusOr<RegionHandle> RegionRegistry::Remove(absl::string_view client,
                                                    absl::string_view id) {
  if (id.empty()) return NamesNoRegion();
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end() || it->second.region->client != client) return NotFound(id);
  RegionHandle region = std::move(it->second.region);
  by_id_.erase(it);
  auto count = count_by_client_.find(region->client);
  if (--count->second == 0) count_by_client_.erase(count);
  return region;
}

std::vector<RegionHandle> RegionRegistry::List(absl::string_view client) const {
  std::vector<RegionHandle> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, entry] : by_id_) {
      if (entry.region->client == client) out.push_back(entry.region);
    }
  }
  std::sort(out.begin(), out.end(), [](const RegionHandle& a, const RegionHandle& b) {
    return std::tie(a->create_time_unix_nanos, a->id) < std::tie(b->create_time_unix_nanos, b->id);
  });
  return out;
}

size_t RegionRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return by_id_.size();
}

size_t RegionRegistry::ReleaseIdle(absl::Time now) {
  if (idle_timeout_ <= absl::ZeroDuration()) return 0;
  // Unmapping and unpinning take time: the regions go after the lock is released.
  std::vector<RegionHandle> released;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = by_id_.begin(); it != by_id_.end();) {
      if (now - it->second.last_use < idle_timeout_) {
        ++it;
        continue;
      }
      auto count = count_by_client_.find(it->second.region->client);
      if (--count->second == 0) count_by_client_.erase(count);
      released.push_back(std::move(it->second.region));
      by_id_.erase(it++);
    }
  }
  return released.size();
}

}  // namespace gpucompute
