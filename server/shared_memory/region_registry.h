// Memory a client shares with the server (SharedMemoryService): ranges of POSIX
// shared-memory objects mapped into the server, client device allocations opened from
// CUDA IPC handles, and buffers the server exported as CUDA IPC handles. Each is a
// Region, owned by the client that registered it, until it is unregistered, goes unused
// for the idle timeout, or the registry is destroyed (at shutdown).
#ifndef GPUCOMPUTE_SERVER_SHARED_MEMORY_REGION_REGISTRY_H_
#define GPUCOMPUTE_SERVER_SHARED_MEMORY_REGION_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/core/backend.h"
#include "server/core/buffer_registry.h"

namespace gpucompute {

// What the server allows (ServerOptions, reported in ServerInfo).
struct SharedMemoryPolicy {
  bool allow_system = false;    // --allow-shared-memory
  bool allow_cuda_ipc = false;  // --allow-cuda-ipc
  // A region unused this long is released; zero never releases one.
  absl::Duration idle_timeout = absl::Minutes(10);
};

inline constexpr size_t kMaxRegionsPerClient = 256;
inline constexpr char kAllowSharedMemoryFlag[] = "--allow-shared-memory";
inline constexpr char kAllowCudaIpcFlag[] = "--allow-cuda-ipc";

// OK when `offset` and `size` describe bytes inside [0, total): checked without
// overflow. Otherwise INVALID_ARGUMENT naming `what` ("buffer buf-..."), as the API
// answers for every byte range beyond an object.
absl::Status CheckByteRange(uint64_t offset, uint64_t size, uint64_t total, absl::string_view what);

// A range of a POSIX shared-memory object mapped into this process (and pinned for DMA
// where the backend can); unpinned and unmapped on destruction. Holding it keeps the
// memory valid even after the client unlinks the object or exits.
class SharedMapping {
 public:
  // Opens the object `name` ("/name", as shm_open takes it) read-only or read-write and
  // maps bytes [offset, offset + size) of it. NOT_FOUND when no such object exists,
  // PERMISSION_DENIED when the server may not open it, INVALID_ARGUMENT for a malformed
  // name, a range outside the object, or a file that is no regular file (a FIFO, a
  // directory, a symbolic link...), refused at once without waiting on it.
  static absl::StatusOr<std::unique_ptr<SharedMapping>> Open(Backend& backend,
                                                             absl::string_view name,
                                                             uint64_t offset, uint64_t size,
                                                             bool read_only);
  ~SharedMapping();
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  char* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Whether the backend pinned it (PinHostMemory succeeded).
  bool pinned() const { return pinned_; }
  // Whether the backend moves its bytes by DMA, no server thread touching the mapping:
  // a mapping pinned by a device backend, copied with Backend::CopyFromPinnedHost and
  // CopyToPinnedHost. Otherwise (the CPU backend, an unpinned mapping) every copy stages
  // through ReadRegion and WriteRegion below.
  //
  // A client that shrinks the object takes the pages past its new end out of its file
  // and out of every mapping, but they stay pinned for the GPU until the server unpins
  // them: a DMA would read stale bytes or write bytes the client no longer sees, so a
  // DMA copy checks the object's size first (CheckRegionHolds). And the CPU must never
  // touch them, which the CUDA driver does for a small copy: see DmaCopy.
  bool dma() const { return dma_; }
  // The object's descriptor, kept open for its size (fstat) at each DMA copy.
  int fd() const { return fd_; }

 private:
  SharedMapping(Backend& backend, void* base, size_t length, char* data, uint64_t size)
      : backend_(backend), base_(base), length_(length), data_(data), size_(size) {}
  int fd_ = -1;

  Backend& backend_;
  void* const base_;     // the page-aligned mapping
  const size_t length_;  // its length
  char* const data_;     // the registered range inside it
  const uint64_t size_;
  bool pinned_ = false;
  bool dma_ = false;
};

enum class RegionKind : uint8_t { kSystem, kCudaIpc, kExport };

// One region. Its description is immutable after registration; the memory lives while
// anyone holds the RegionHandle (copies in flight hold one until they complete). The
// object behind a system region may shrink while it is registered: a copy that meets
// the missing bytes then fails with FAILED_PRECONDITION (ReadRegion, WriteRegion).
struct Region {
  std::string id;  // "shm-" and 32 hex digits
  std::string client;
  RegionKind kind = RegionKind::kSystem;
  uint64_t size = 0;
  int64_t create_time_unix_nanos = 0;
  // kSystem: the object and range.
  std::string shm_name;
  uint64_t shm_offset = 0;
  bool read_only = false;
  std::unique_ptr<SharedMapping> mapping;
  // kCudaIpc: the client's allocation, mapped; kExport: the device. Both on `device`.
  int device = 0;
  DeviceMemory ipc_memory;
  // kExport: the buffer whose memory the export keeps alive, and its handle.
  BufferHandle exported;
  std::string ipc_handle;
};

using RegionHandle = std::shared_ptr<Region>;

// Copy bytes [offset, offset + bytes) of a system region out to `dst` and in from `src`,
// on the calling thread. The object is the client's, which may shrink it (ftruncate)
// while the region is registered; touching the mapping past the object's new end then
// raises SIGBUS, which would end the server. These copies survive it: the copy fails
// with FAILED_PRECONDITION naming the region and the object, having written part of
// `dst` (or of the region) perhaps, and the server goes on. A SIGBUS outside them keeps
// its effect (the handler in force before, else the default: the process ends).
// Whenever the server's CPU touches a region's mapping, it is through one of them.
absl::Status ReadRegion(const Region& region, uint64_t offset, void* dst, uint64_t bytes);
absl::Status WriteRegion(const Region& region, uint64_t offset, const void* src, uint64_t bytes);

// Copies of at least this many bytes between a DMA-capable mapping (SharedMapping::dma)
// and the device go by DMA, straight from or to the mapping. Smaller ones stage through
// ReadRegion and WriteRegion: the CUDA driver moves a small copy from pinned host memory
// with the CPU, through its command buffer, where a page the client truncated away would
// raise SIGBUS inside the driver, past any guard.
inline constexpr uint64_t kMinDmaCopyBytes = uint64_t{1} << 20;
// Whether a copy of `bytes` with `region` goes by DMA (see kMinDmaCopyBytes).
bool DmaCopy(const Region& region, uint64_t bytes);
// Before a DMA copy of bytes [offset, offset + bytes) of a system region: whether the
// object still holds them (its size, now). FAILED_PRECONDITION as ReadRegion's if not.
// A client that shrinks the object after the check only gets stale bytes, or loses what
// the copy writes: no CPU touches the pages, so the server does not fault.
absl::Status CheckRegionHolds(const Region& region, uint64_t offset, uint64_t bytes);

class RegionRegistry {
 public:
  // With a non-zero idle timeout, a thread of the registry's own releases regions
  // unused for that long.
  explicit RegionRegistry(absl::Duration idle_timeout);
  // Releases every region (the memory goes with the last handle held elsewhere).
  ~RegionRegistry();
  RegionRegistry(const RegionRegistry&) = delete;
  RegionRegistry& operator=(const RegionRegistry&) = delete;

  // Gives `region` an id and makes it visible to its client. RESOURCE_EXHAUSTED when the
  // client holds kMaxRegionsPerClient already.
  absl::StatusOr<RegionHandle> Add(std::unique_ptr<Region> region) ABSL_LOCKS_EXCLUDED(mu_);
  // The client's region `id`, marked as used now. Another client's region is NOT_FOUND,
  // exactly as an unknown id is; an empty id is INVALID_ARGUMENT (the request names no
  // region). Remove answers alike.
  absl::StatusOr<RegionHandle> Lookup(absl::string_view client, absl::string_view id)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<RegionHandle> Remove(absl::string_view client, absl::string_view id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The client's regions, oldest first.
  std::vector<RegionHandle> List(absl::string_view client) const ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  // Releases the regions last used before `now - idle_timeout`; returns how many.
  size_t ReleaseIdle(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    RegionHandle region;
    absl::Time last_use;
  };

  void SweepLoop() ABSL_LOCKS_EXCLUDED(mu_);
  static absl::Status NamesNoRegion();
  static absl::Status NotFound(absl::string_view id);

  const absl::Duration idle_timeout_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> by_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, size_t> count_by_client_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sweeper_;  // last: it runs on the members above
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SHARED_MEMORY_REGION_REGISTRY_H_
