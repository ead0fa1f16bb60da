// Chains run again. A chain that a client submits a second time, byte for byte, is
// planned once more and then kept, with its temporaries, as a PreparedChain: one
// executor operation that launches every step (on CUDA, each run of kernels recorded
// once as a graph and launched again). Each later submission looks it up by its bytes,
// checks that the buffers it names still resolve to the buffers they did, and runs it
// again with no planning, no per-step queueing and no recording.
//
// What may be kept: a chain whose steps run on one stream and one device, that keeps no
// new buffer (a new buffer it keeps is new at every run), and whose temporaries are
// small (ChainCache::kMaxTemporaryBytes): replaying pays off for chains of small
// steps, where the host's work per step is the cost, and the cache must not hold much
// memory out of sight. Kept temporaries count against the server's memory limit and the
// tenant's device_bytes quota, as those of a chain in flight do.
#ifndef GPUCOMPUTE_SERVER_SERVICE_CHAIN_REPLAY_H_
#define GPUCOMPUTE_SERVER_SERVICE_CHAIN_REPLAY_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "server/core/backend.h"
#include "server/core/buffer_registry.h"
#include "server/core/executor.h"
#include "server/service/chain_answer.h"
#include "server/service/operation_planner.h"
#include "server/service/tagged_ops.h"

namespace gpucompute {

// A chain's step as planned (chain_service.cc).
struct ChainStepPlan {
  std::string tag;
  std::string stream_id;
  Plan plan;
  BufferHandle written;
  // The new buffer the step keeps (registers), if any; a new buffer not kept is a
  // temporary, alive only while the chain's work uses it.
  BufferHandle kept;
  bool temporary = false;
  std::vector<size_t> deps;  // indices of the steps it refers to by tag
};

// Whether the answer of `step` reports `output`, one of its outputs: a temporary is not
// reported.
bool ReportsOutput(const ChainStepPlan& step, const BufferMeta& output);
// Starts the answer of `step`: all but the outcome (ToProtoOutcome) and the outputs'
// leases, which are read when the chain answers (ReportStepLeases).
void BeginStepResult(const ChainStepPlan& step, v1::ChainResponse* response);
// Sets the leases of the outputs BeginStepResult reported in `op` as they are now, from
// `status`, the step's finished operation.
void ReportStepLeases(const ChainStepPlan& step, const OperationStatus& status, v1::Operation* op);

// A chain planned once, with its temporaries, run again as one executor operation.
class PreparedChain {
 public:
  // Takes the launches of `steps` (planned from one request; see Preparable) and the
  // buffers `refs` named. `record_min_steps`: runs of at least that many capturable
  // steps are recorded as one unit where the stream can (0: never).
  PreparedChain(std::vector<ChainStepPlan>& steps, std::vector<ResolvedRef> refs,
                std::string stream_id, size_t record_min_steps);
  PreparedChain(const PreparedChain&) = delete;
  PreparedChain& operator=(const PreparedChain&) = delete;

  // OK if `steps` may be kept: one stream, one device, no new buffer kept, temporaries
  // within `max_temporary_bytes`; else why not, for the server's log.
  static absl::Status Preparable(const std::vector<ChainStepPlan>& steps,
                                 uint64_t max_temporary_bytes);

  const std::string& stream_id() const { return stream_id_; }
  size_t size() const { return steps_.size(); }
  uint64_t temporary_bytes() const { return temporary_bytes_; }
  // Whether `entry` is one of the buffers the chain names.
  bool Names(const BufferEntry* entry) const;
  // Whether every buffer the chain names still resolves, for `client`, to the buffer it
  // did (renewing leases, as the lookups of a planned run do).
  bool StillResolves(const BufferRegistry& registry, absl::string_view client) const;

  // One run: an executor operation that stands for every step (OpSpec::members), whose
  // launch leaves each step's results in (*results)[i].
  Executor::OpSpec Spec(const std::shared_ptr<PreparedChain>& self,
                        const std::shared_ptr<std::vector<OpResult>>& results) const;
  // The answer (ChainResponse bytes) of finished `run` (FinalStatus), whose launches
  // left `results`: the run's id and stream once, each step with the run's state, an
  // even share of its device time, and its values; with each step's compile time where
  // `planned` (the run planned for its call).
  std::string EncodeAnswer(const Operation& run, const std::vector<OpResult>& results,
                           bool planned) const {
    return answer_.Encode(Executor::FinalStatus(run), results, planned);
  }

 private:
  struct Step {
    bool capturable = false;
    absl::AnyInvocable<absl::StatusOr<LaunchInfo>(Stream&, OpResult&)> launch;
  };
  // Consecutive steps launched as one recording, or one by one.
  struct Segment {
    size_t begin = 0;
    size_t end = 0;
    bool record = false;  // a run of capturable steps, long enough
    bool failed = false;  // its recording failed: launched one by one from now on
    std::unique_ptr<Recording> recording;
    // The steps' next offsets (random fills) as the recording's launches left them.
    std::vector<uint64_t> next_offsets;
  };

  absl::StatusOr<LaunchInfo> Launch(Stream& stream, std::vector<OpResult>& results);
  absl::StatusOr<LaunchInfo> LaunchSteps(Stream& stream, const Segment& segment,
                                         std::vector<OpResult>& results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the segment's launches (which also leave their results) as one unit.
  absl::StatusOr<std::unique_ptr<Recording>> Record(Stream& stream, Segment& segment,
                                                    std::vector<OpResult>& results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string stream_id_;
  std::vector<Step> steps_;
  std::vector<OperationMember> members_;  // of each step: its kind and traffic
  std::vector<ResolvedRef> refs_;
  std::vector<BufferHandle> temporaries_;
  uint64_t temporary_bytes_ = 0;
  std::vector<Executor::Access> accesses_;  // of all the steps, each buffer once
  std::vector<BufferMeta> outputs_;         // buffers written that outlive the chain
  ChainAnswer answer_;
  // Launches of one chain never overlap (each run writes the temporaries, so it waits
  // for the run before it to be launched); the lock makes that plain.
  absl::Mutex mu_;
  std::vector<Segment> segments_ ABSL_GUARDED_BY(mu_);
};

// The prepared chains of all clients, by key (the caller's scope and the request's
// bytes: chain_service.cc), least recently run first out. Thread-safe.
class ChainCache {
 public:
  static constexpr size_t kMaxChains = 64;
  // Of temporaries, per chain and in all.
  static constexpr uint64_t kMaxTemporaryBytes = 16 << 20;
  static constexpr uint64_t kMaxTotalBytes = 256 << 20;
  // Requests larger than this are never kept (their bytes are in the key).
  static constexpr size_t kMaxRequestBytes = 1 << 20;

  // Forgets the chains that name a buffer as soon as `registry` unregisters it.
  explicit ChainCache(BufferRegistry& registry);
  ~ChainCache();
  ChainCache(const ChainCache&) = delete;
  ChainCache& operator=(const ChainCache&) = delete;

  // The chain kept under `key`, if any and if it still resolves (StillResolves); one
  // that does not is forgotten.
  std::shared_ptr<PreparedChain> Find(const std::string& key, absl::string_view client)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `key` was seen before; remembers it (by hash, the last few thousand).
  bool SeenBefore(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps `chain` under `key`, forgetting the least recently run to stay within bounds.
  void Insert(const std::string& key, std::shared_ptr<PreparedChain> chain)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets the chains that name `entry`.
  void Forget(const BufferEntry& entry) ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  static constexpr size_t kMaxSeen = 4096;
  using Lru = std::list<std::string>;  // keys, most recently run first
  struct Kept {
    std::shared_ptr<PreparedChain> chain;
    Lru::iterator position;
  };
  // Returns the chain, for the caller to drop once the lock is released.
  std::shared_ptr<PreparedChain> EraseLocked(absl::flat_hash_map<std::string, Kept>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  BufferRegistry& registry_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Kept> chains_ ABSL_GUARDED_BY(mu_);
  Lru lru_ ABSL_GUARDED_BY(mu_);
  uint64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<size_t> seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_CHAIN_REPLAY_H_
