// The executor owns the streams, the operations in flight and the hazard tracking that
// orders conflicting accesses to a buffer across streams. It is written against the
// Backend interface alone.
//
// Ordering. Work on one stream is dispatched to the backend in submission order. Each
// submission reads the hazard state of the buffers it touches: a reader depends on the
// buffer's last writer (read after write); a writer depends on the last writer and on
// every reader since (write after write, write after read). A dependency on another
// stream becomes a backend-side wait on that work's end event once it is dispatched, so
// the host never waits for the device; until then, the dependent stays queued here.
// Dependencies only point to earlier submissions, so there are no cycles.
//
// Host accesses (downloads, deletes) take part in the same hazard tracking: they start
// once conflicting earlier work is done, and later conflicting work waits for them.
#ifndef GPUCOMPUTE_SERVER_CORE_EXECUTOR_H_
#define GPUCOMPUTE_SERVER_CORE_EXECUTOR_H_

#include <array>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/core/backend.h"
#include "server/core/buffer_registry.h"
#include "server/tenancy/quotas.h"

namespace gpucompute {

enum class OperationKind : uint8_t {
  kElementwise,
  kGemv,
  kReduce,
  kRandom,
  kFill,
  kCopy,
  kUpload,
  kDownload,
  kMatmul,
};
inline constexpr int kNumOperationKinds = 9;

// "elementwise", "gemv", ...: as the API's OperationKind, in lower case.
absl::string_view OperationKindName(OperationKind kind);

// OK when `device` is one of the backend's devices, else INVALID_ARGUMENT saying how
// many there are.
absl::Status CheckDeviceIndex(const Backend& backend, int device);

// Names the work the backend is asked to enqueue on this thread in this scope
// (Backend::PushRange and PopRange), so that a profiler trace shows what each call did.
class ScopedRange {
 public:
  ScopedRange(Backend& backend, const std::string& name) : backend_(backend) {
    backend_.PushRange(name);
  }
  ~ScopedRange() { backend_.PopRange(); }
  ScopedRange(const ScopedRange&) = delete;
  ScopedRange& operator=(const ScopedRange&) = delete;

 private:
  Backend& backend_;
};

// Traffic and timing of one operation.
struct OpTiming {
  double queued_seconds = 0;
  double device_seconds = 0;
  double compile_seconds = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t flops = 0;
  // Operations launched together as one recorded unit (a CUDA graph), this one
  // included; 0 when launched on its own. The unit is timed as a whole, so
  // device_seconds is then an even share of its time.
  uint32_t graph_operations = 0;
};

// Results an operation's launch can leave for its caller, besides its output buffers.
struct OpResult {
  // Inline values (small reductions): raw elements of `values_dtype`. The launch
  // enqueues the copy into `values`, which stays put until the operation completes.
  DType values_dtype = DType::kFloat64;
  std::vector<uint8_t> values;
  uint64_t next_offset = 0;  // random fills
};

struct StreamState;
struct QueuedLaunch;
struct TenantTally;

// A node in the dependency graph: an operation or a host access. Its fields belong to
// the Executor that made it and are guarded by that executor's mutex, which mu_ refers
// to. Executor::AssertWorkLocked tells the lock analysis that the executor's mu_ and
// this mu_ are one mutex, which it cannot see.
class Work {
 public:
  virtual ~Work() = default;

 protected:
  explicit Work(absl::Mutex& executor_mu) : mu_(executor_mu) {}

 private:
  friend class Executor;
  // kLaunching: taken off its stream's queue, its launch not yet enqueued on the device.
  enum class Phase : uint8_t { kPending, kLaunching, kDispatched, kDone };

  // The completion of a dispatched operation reads its end event without the mutex: the
  // event is set, under the mutex, before that completion is enqueued on the stream, and
  // cleared only by the completion itself (Executor::CompleteLocked), after this read.
  const std::shared_ptr<Event>& end_event_at_completion() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return end_event_;
  }

  absl::Mutex& mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kPending;
  StreamState* stream_ ABSL_GUARDED_BY(mu_) = nullptr;  // null for host accesses
  std::shared_ptr<Event> end_event_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Work>> deps_ ABSL_GUARDED_BY(mu_);
  // Called under the executor's mutex when this work is dispatched or done.
  std::vector<absl::AnyInvocable<void()>> listeners_ ABSL_GUARDED_BY(mu_);
};

// One of the API's operations that an executor operation runs among others, as one unit
// (a chain replayed: server/service/chain_replay.h).
struct OperationMember {
  OperationKind kind = OperationKind::kElementwise;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t flops = 0;
};

// How many of the API's operations an executor operation with `members` stands for.
inline size_t Weight(const std::vector<OperationMember>& members) {
  return members.empty() ? 1 : members.size();
}

// What a caller sees of an operation.
struct OperationStatus {
  enum class State : uint8_t { kQueued, kRunning, kSucceeded, kFailed };
  std::string id;
  OperationKind kind = OperationKind::kElementwise;
  std::string stream_id;
  int device = 0;
  State state = State::kQueued;
  absl::Status error;
  OpTiming timing;
  std::vector<BufferMeta> outputs;
  OpResult result;
  // OpSpec::members: empty unless it stands for several of the API's operations.
  std::vector<OperationMember> members;
  // How many of the API's operations it stands for.
  size_t weight() const { return Weight(members); }
  // The API's operations it stands for: its members, or else itself as one, written to
  // `one` (which the span then points to). Each has an even share of the device time.
  std::span<const OperationMember> Operations(OperationMember& one) const {
    if (!members.empty()) return members;
    one = {kind, timing.bytes_read, timing.bytes_written, timing.flops};
    return {&one, 1};
  }
  bool done() const { return state == State::kSucceeded || state == State::kFailed; }
};

class Operation final : public Work {
 public:
  // Made by the Executor, with its mutex.
  explicit Operation(absl::Mutex& executor_mu) : Work(executor_mu) {}

  const std::string& id() const { return status_.id; }
  // Set when it is submitted, then never changed.
  const std::string& stream_id() const { return status_.stream_id; }
  // The bytes it reads and writes (OpSpec's): set before it is submitted, then never
  // changed.
  uint64_t traffic_bytes() const {
    return status_.timing.bytes_read + status_.timing.bytes_written;
  }

 private:
  friend class Executor;
  using Clock = std::chrono::steady_clock;
  OperationStatus status_;
  // Set once the operation is done, after which status_ never changes again: readers
  // that see it set read status_ without the executor's mutex.
  std::atomic<bool> final_{false};
  std::string scope_;  // of the client that submitted it (server/tenancy/auth.h)
  TenantTally* tenant_ = nullptr;  // set at submission
  std::shared_ptr<StreamState> stream_state_;
  std::vector<BufferHandle> buffers_;  // kept alive until the operation completes
  // The leases of the buffers it writes, held from its submission to its completion
  // (Lease::Hold); buffers_ keeps them alive.
  std::vector<Lease*> held_leases_;
  absl::AnyInvocable<absl::StatusOr<LaunchInfo>(Stream&, OpResult&)> launch_;
  bool capturable_ = false;  // OpSpec::capturable
  // The profiler range of its launch: "elementwise buf-a buf-b -> buf-c".
  std::string range_name_;
  Clock::time_point submit_time_;
  std::shared_ptr<Event> start_event_;
  std::vector<absl::AnyInvocable<void() &&>> on_done_;
  // OpSpec::on_done, run once it is done, after the mutex is released (see Guard).
  absl::AnyInvocable<void(const std::shared_ptr<Operation>&) &&> own_done_;
};

class HostAccess final : public Work {
 public:
  // Made by the Executor, with its mutex.
  explicit HostAccess(absl::Mutex& executor_mu) : Work(executor_mu) {}

 private:
  friend class Executor;
  std::vector<BufferHandle> buffers_;
  absl::AnyInvocable<void(const std::shared_ptr<HostAccess>&) &&> ready_;
};

struct StreamInfo {
  std::string id;
  int device = 0;
  bool is_default = false;
  uint64_t pending_operations = 0;
};

// Told of each operation as it is submitted, handed to the backend, and completed (for
// metrics). It must be quick, and must not call into the executor. OnSubmitted and
// OnDispatched are called under the executor's mutex; OnCompleted just after it is
// released, with the final status, always after the operation's OnDispatched.
class OperationObserver {
 public:
  virtual ~OperationObserver() = default;
  virtual void OnSubmitted(const OperationStatus& op) = 0;
  virtual void OnDispatched(const OperationStatus& op) = 0;
  virtual void OnCompleted(const OperationStatus& op) = 0;
};

struct KindStats {
  uint64_t count = 0;
  uint64_t failed = 0;
  double device_seconds = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t flops = 0;
  // Transfers only, each also counted in `failed`: those the client cancelled or broke
  // off, and those that timed out waiting for the client.
  uint64_t cancelled = 0;
  uint64_t timed_out = 0;
};

// A tenant's operations in flight (for its quota) and its statistics: the Executor's.
struct TenantTally {
  uint64_t in_flight = 0;
  std::array<KindStats, kNumOperationKinds> stats{};
};

class Executor {
 public:
  static constexpr size_t kMaxStreamsPerClient = 64;
  // Streams of all clients together (default streams included), unless Create is told
  // otherwise. On the CPU backend each stream is a thread.
  static constexpr size_t kDefaultMaxStreams = 1024;
  // Finished operations stay queryable until either bound is passed; the oldest go
  // first. The second bounds the memory inline results can hold.
  static constexpr size_t kRetainedOperations = 65536;
  static constexpr size_t kRetainedValueBytes = 64 << 20;

  // Creates the executor and one transfer stream per device of `backend`.
  // At most `max_streams` streams exist at once; a client's default stream that is idle
  // is reclaimed to make room (it is created again on its next use).
  static absl::StatusOr<std::unique_ptr<Executor>> Create(Backend& backend, int default_device = 0,
                                                          size_t max_streams = kDefaultMaxStreams);
  // Waits for all submitted work to finish.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  Backend& backend() { return backend_; }
  int default_device() const { return default_device_; }
  size_t max_streams() const { return max_streams_; }

  // --- Shutdown.
  // Whether every submitted operation finished before `deadline`.
  bool WaitIdle(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Operations not yet on the device fail with `status` (in their streams' order, after
  // the work before them), and so do those submitted later; work already on the device
  // finishes. Returns how many queued operations it failed.
  size_t CancelQueued(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);

  // --- Streams. Ids are global and unguessable; listings are per client. `client` is
  // the caller's scope (server/tenancy/auth.h): a stream or operation of another tenant is
  // NOT_FOUND, exactly as an unknown id is. Where a stream or an operation must be named,
  // an empty id is INVALID_ARGUMENT (the request names none); a submission's stream_id
  // alone may be empty, for the client's default stream.
  absl::StatusOr<StreamInfo> CreateStream(absl::string_view client, int device);
  // The client's default stream on `device`, created on first use.
  absl::StatusOr<StreamInfo> DefaultStream(absl::string_view client, int device);
  // Forgets the stream at once; `done` runs once the work queued on it has finished.
  absl::Status DeleteStream(absl::string_view client, absl::string_view stream_id,
                            absl::AnyInvocable<void() &&> done);
  // `done` runs once every operation submitted to the stream so far has finished.
  absl::Status Synchronize(absl::string_view client, absl::string_view stream_id,
                           absl::AnyInvocable<void() &&> done);
  std::vector<StreamInfo> ListStreams(absl::string_view client);

  // --- Operations.
  struct Access {
    BufferHandle buffer;
    bool write = false;
  };
  struct OpSpec {
    OperationKind kind = OperationKind::kElementwise;
    std::vector<Access> accesses;
    // Traffic and flops, known before launch.
    uint64_t bytes_read = 0;
    uint64_t bytes_written = 0;
    uint64_t flops = 0;
    // Buffers reported as the operation's outputs.
    std::vector<BufferMeta> outputs;
    // Seconds spent compiling for it before submission (Backend::PrepareElementwise),
    // added to what the launch reports.
    double compile_seconds = 0;
    // Enqueues the operation's work on the stream. Runs outside the executor's mutex, on
    // the one thread at a time that launches the stream's work, in the stream's order:
    // it must only enqueue, never wait.
    absl::AnyInvocable<absl::StatusOr<LaunchInfo>(Stream&, OpResult&)> launch;
    // The launch enqueues device work alone (kernels and device copies: no host work,
    // allocation or inline results), and enqueues the same again if called again, so
    // that it may be recorded with its neighbours and launched as one unit
    // (Stream::BeginCapture), or, should the recording fail, launched on its own.
    bool capturable = false;
    // The API's operations it stands for, when it runs several as one unit; empty: it
    // is one, of `kind`, with the traffic above. Each member counts as one operation in
    // the tenant's operations quota and in the statistics, with its own kind and traffic
    // and an even share of the device time; `kind` and the traffic above then describe
    // the whole, as GetStatus reports it.
    std::vector<OperationMember> members;
    // Runs once the operation is done, with it, as OnDone's callbacks do; registered
    // with the submission, under the same lock, only if it is accepted.
    absl::AnyInvocable<void(const std::shared_ptr<Operation>&) &&> on_done;
  };
  // Queues an operation on `stream_id` (empty: the client's default stream on the
  // device of the buffers it touches). All accessed buffers must be on the stream's
  // device.
  absl::StatusOr<std::shared_ptr<Operation>> Submit(absl::string_view client,
                                                    absl::string_view stream_id, OpSpec spec);
  // Several submissions of one client under one hold of the mutex, in order, as
  // Submit one after another would queue them; they stop at the first refused. A spec is
  // taken only if its submission is accepted.
  struct SubmitItem {
    absl::string_view stream_id;
    OpSpec* spec = nullptr;
  };
  struct Submitted {
    std::vector<std::shared_ptr<Operation>> operations;  // of the first items, in order
    // Why item operations.size() was refused, if one was; the items after it are
    // untouched.
    absl::Status refused;
  };
  Submitted SubmitAll(absl::string_view client, std::span<SubmitItem> items);
  // What SubmitAll would refuse of `items` as things stand, without queueing anything: a
  // stream that is not the client's or not on the device of the item's buffers, buffers
  // on two devices, more operations than the client's quota leaves room for, shutdown.
  // On refusal, *refused is the index of the first item refused. Others' work can still
  // change the answer before the items are submitted (a stream deleted meanwhile).
  absl::Status CheckSubmitAll(absl::string_view client, std::span<const SubmitItem> items,
                              size_t* refused);
  absl::StatusOr<std::shared_ptr<Operation>> FindOperation(absl::string_view client,
                                                           absl::string_view id);
  OperationStatus GetStatus(const Operation& op);
  // The status of an operation known to be done (in a callback of OnDone or of
  // OpSpec::on_done), read in place: it never changes again. Aborts if it is not done.
  static const OperationStatus& FinalStatus(const Operation& op);
  // Runs fn once the operation is done: at once, on this thread, if it already is.
  void OnDone(const std::shared_ptr<Operation>& op, absl::AnyInvocable<void() &&> fn);

  // --- Host accesses: `ready` runs (possibly at once, on this thread) when all
  // conflicting earlier work is done. Later conflicting work waits for Release.
  using ReadyFn = absl::AnyInvocable<void(const std::shared_ptr<HostAccess>&) &&>;
  std::shared_ptr<HostAccess> AcquireHostAccess(std::vector<Access> accesses, ReadyFn ready);
  void Release(const std::shared_ptr<HostAccess>& access);
  // A stream for staging transfers to and from `device`, outside any client's order.
  Stream& TransferStream(int device);

  // While one lives on a thread, the launches that this thread's submissions to this
  // executor start on streams that can record work wait for it to end: operations
  // submitted together (a chain, a session's message) are then launched together, and
  // a run of them may be recorded as one unit. Nests.
  class LaunchBatch {
   public:
    explicit LaunchBatch(Executor& executor);
    ~LaunchBatch();  // launches what waited
    LaunchBatch(const LaunchBatch&) = delete;
    LaunchBatch& operator=(const LaunchBatch&) = delete;

   private:
    friend class Executor;
    Executor& executor_;
    LaunchBatch* const outer_;
    std::vector<absl::AnyInvocable<void() &&>> launches_;
  };

  // Runs of at least `min_ops` capturable operations that are launched together on a
  // stream are recorded and launched as one unit where the backend can (0: never). Set
  // before any work is submitted.
  void SetCaptureMinOps(size_t min_ops) { capture_min_ops_ = min_ops; }
  size_t capture_min_ops() const { return capture_min_ops_; }
  // Set before any work is submitted; the observer must outlive the executor.
  void SetObserver(OperationObserver* observer) { observer_ = observer; }
  // Enforces the tenants' streams and operations quotas (null: none). Set before any
  // work is submitted; `quotas` must outlive the executor.
  void SetQuotas(const Quotas* quotas) { quotas_ = quotas; }

  // The server's statistics, or with `tenant` set those of that tenant's operations.
  std::array<KindStats, kNumOperationKinds> Stats(
      std::optional<absl::string_view> tenant = std::nullopt);
  // Counts a finished upload or download by the client of `scope` in the statistics.
  void RecordTransfer(absl::string_view scope, OperationKind kind, uint64_t bytes);
  // Counts an upload or download by the client of `scope` that ended without completing,
  // failed with `error`: CANCELLED counts as cancelled, DEADLINE_EXCEEDED as timed out.
  void RecordFailedTransfer(absl::string_view scope, OperationKind kind, const absl::Status& error);

 private:
  using Clock = std::chrono::steady_clock;
  class Guard;

  // Under the mutex: the tenant of `scope`, made on first use.
  TenantTally& TenantLocked(absl::string_view scope) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The hazard state of one buffer: the last work that writes it, and the work
  // reading it since. Kept here, under the executor's mutex, keyed by the buffer; an
  // entry goes once all of its work is done.
  struct Hazards {
    std::shared_ptr<Work> last_writer;
    // Oldest first. Done readers leave from the front (PopDoneReadersLocked): work finishes
    // mostly in submission order, so that costs O(1) an access where a scan cost one
    // step per reader in flight, a thousand for a busy session's input. One done behind
    // one still running stays until the one before it is done; AddDependencyLocked
    // skips it.
    std::deque<std::shared_ptr<Work>> readers;
  };
  void PopDoneReadersLocked(Hazards& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Work's fields are guarded by Work::mu_, which refers to this mu_: says so to the lock
  // analysis, which cannot see that the two name one mutex. Costs nothing at run time.
  void AssertWorkLocked(const Work& work) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)
      ABSL_ASSERT_EXCLUSIVE_LOCK(work.mu_) {
    assert(&work.mu_ == &mu_);
  }
  bool WorkDoneLocked(const Work& work) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    AssertWorkLocked(work);
    return work.phase_ == Work::Phase::kDone;
  }

  Executor(Backend& backend, int default_device, size_t max_streams,
           std::vector<std::unique_ptr<Stream>> transfer_streams);

  absl::StatusOr<std::shared_ptr<StreamState>> NewStreamLocked(absl::string_view client, int device,
                                                               bool is_default)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The operations quota of the client's tenant; 0: none.
  uint64_t OperationsQuota(absl::string_view client) const;
  // The device an operation runs on: its buffers' (all on one), else the default.
  absl::StatusOr<int> DeviceOf(const OpSpec& spec) const;
  // The client's stream `stream_id` (not empty) on `device`, else NOT_FOUND or
  // INVALID_ARGUMENT as Submit reports them.
  absl::StatusOr<std::shared_ptr<StreamState>> FindStreamLocked(absl::string_view client,
                                                                absl::string_view stream_id,
                                                                int device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<StreamState>> ResolveStreamLocked(absl::string_view client,
                                                                   absl::string_view stream_id,
                                                                   int device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `op`, made for `item` and listed, or says why it may not be: the client's
  // tenant has `tenant_tally` and its operations quota is `quota` (0: none).
  absl::Status SubmitLocked(absl::string_view client, const SubmitItem& item,
                            const std::shared_ptr<Operation>& op, TenantTally& tenant_tally,
                            uint64_t quota) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `work` wait for `dep`, unless dep is done (or is work itself).
  void AddDependencyLocked(Work& work, const std::shared_ptr<Work>& dep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds the hazards of `accesses` to work's dependencies and records work as the
  // buffers' newest reader or writer.
  void TrackHazardsLocked(const std::shared_ptr<Work>& work, const std::vector<Access>& accesses)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the hazard entries of `buffers` whose work is all done.
  void ForgetFinishedHazardsLocked(const std::vector<BufferHandle>& buffers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the stream's operations that may start (their dependencies on other streams
  // enqueued, room in the dispatch window) to its launch queue, and has a thread launch
  // them once the mutex is released, unless one already does.
  void PumpLocked(const std::shared_ptr<StreamState>& stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Launches the stream's queued operations until none are left. CUDA calls take
  // microseconds each, so they run outside the mutex; one thread at a time per stream
  // keeps them in the stream's order.
  void LaunchQueued(const std::shared_ptr<StreamState>& stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Enqueues one operation of a batch LaunchQueued took: its waits, its start event, its
  // launch and its end event, each only if all before succeeded.
  void LaunchOne(Stream& stream, QueuedLaunch& l, const absl::Status& cancelled)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Records a run of capturable operations and launches it as one unit; false when the
  // recording failed before anything ran (the caller then launches them one by one).
  bool LaunchRecorded(Stream& stream, std::span<QueuedLaunch> run) ABSL_LOCKS_EXCLUDED(mu_);
  void CheckHostAccessLocked(const std::shared_ptr<HostAccess>& access)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteOperation(const std::shared_ptr<Operation>& op, absl::Status status)
      ABSL_LOCKS_EXCLUDED(mu_);
  // An operation of a recorded run, with the status of its launch.
  using RunMember = std::pair<std::shared_ptr<Operation>, absl::Status>;
  // Completes the operations of a recorded run, which finished together, in order, each
  // with an even share of the run's device time.
  void CompleteRecordedRun(const std::vector<RunMember>& run, const absl::Status& device_status)
      ABSL_LOCKS_EXCLUDED(mu_);
  void CompleteLocked(const std::shared_ptr<Operation>& op, absl::Status status,
                      double device_seconds) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The device time between the operation's start and end events; 0 without them.
  double DeviceSeconds(const Operation& op, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Completes an operation with its device time.
  // Marks work done or dispatched and wakes whatever waits on it.
  void NotifyLocked(Work& work) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  StreamInfo InfoLocked(const StreamState& s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets `s` at once; its backend stream is retired, and `done` runs, once the work
  // queued on it has finished.
  void RetireStreamLocked(std::shared_ptr<StreamState> s, absl::AnyInvocable<void() &&> done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReapRetiredStreams() ABSL_LOCKS_EXCLUDED(mu_);
  // Makes room for one more stream under max_streams_, reclaiming an idle default stream
  // if need be; RESOURCE_EXHAUSTED when every stream is busy or not a default one.
  absl::Status ReserveStreamLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Backend& backend_;
  const int default_device_;
  const size_t max_streams_;
  const int dispatch_window_;
  // One per device; created at start and never changed, so read without the lock.
  const std::vector<std::unique_ptr<Stream>> transfer_streams_;
  absl::Mutex mu_;
  uint64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // operations submitted and not done
  int launchers_ ABSL_GUARDED_BY(mu_) = 0;       // threads in LaunchQueued
  // Set by CancelQueued: what queued and later operations fail with.
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<StreamState>> streams_ ABSL_GUARDED_BY(mu_);
  // (client, device) -> default stream id.
  absl::flat_hash_map<std::string, std::string> default_streams_ ABSL_GUARDED_BY(mu_);
  // The operations that can be found by id: those in flight and the last finished ones.
  // A lock of their own, so that listing a submission and finding an operation do not
  // wait for the executor's mutex; taken inside mu_ where both are needed.
  absl::Mutex ops_mu_ ABSL_ACQUIRED_AFTER(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Operation>> operations_
      ABSL_GUARDED_BY(ops_mu_);
  // For retention, oldest first; each is in operations_, which keeps it alive.
  std::deque<const Operation*> finished_order_ ABSL_GUARDED_BY(ops_mu_);
  size_t retained_value_bytes_ ABSL_GUARDED_BY(ops_mu_) = 0;
  // The hazard state of each buffer with work not yet done. Keyed by the buffer itself:
  // an entry lives only while work of its own, which holds the buffer, is not done, so
  // no other buffer can have its address meanwhile.
  absl::flat_hash_map<const BufferEntry*, Hazards> hazards_ ABSL_GUARDED_BY(mu_);
  // Backend streams of forgotten StreamStates, whose work is done. The reaper destroys
  // them: never on their own thread (a CPU stream joins its thread), never in a CUDA
  // callback, and soon, since each may hold a thread.
  std::vector<std::unique_ptr<Stream>> retired_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Callbacks to run once the mutex is released (see Guard).
  std::vector<absl::AnyInvocable<void() &&>> deferred_ ABSL_GUARDED_BY(mu_);
  // Operations completed meanwhile, for the observer and their own callbacks, and
  // references dropped meanwhile (operations no longer retained, their buffers and
  // events): both are dealt with once the mutex is released (see Guard), since a last
  // reference may free memory.
  std::vector<std::shared_ptr<Operation>> completed_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<const void>> dropped_ ABSL_GUARDED_BY(mu_);
  std::array<KindStats, kNumOperationKinds> stats_ ABSL_GUARDED_BY(mu_){};
  // Per tenant, never erased; nodes, so that an operation may keep a pointer to its own.
  absl::node_hash_map<std::string, TenantTally> tenants_ ABSL_GUARDED_BY(mu_);
  // Set before any work is submitted, then only read.
  OperationObserver* observer_ = nullptr;
  const Quotas* quotas_ = nullptr;
  size_t capture_min_ops_ = 0;
  std::thread reaper_;  // last: it runs on the members above
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_CORE_EXECUTOR_H_
