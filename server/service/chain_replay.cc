#include "server/service/chain_replay.h"

#include <algorithm>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "server/service/proto_conversions.h"
#include "server/util/status_macros.h"

namespace gpucompute {

bool ReportsOutput(const ChainStepPlan& step, const BufferMeta& output) {
  return !step.temporary || output.id != step.written->id;
}

void BeginStepResult(const ChainStepPlan& step, v1::ChainResponse* response) {
  v1::ChainStepResult* result = response->add_steps();
  result->set_tag(step.tag);
  v1::Operation* op = result->mutable_operation();
  op->set_kind(ToProto(step.plan.spec.kind));
  for (const BufferMeta& m : step.plan.spec.outputs) {
    if (ReportsOutput(step, m)) ToProto(m, op->add_outputs());
  }
}

void ReportStepLeases(const ChainStepPlan& step, const OperationStatus& status, v1::Operation* op) {
  int k = 0;
  for (const BufferMeta& m : status.outputs) {
    if (ReportsOutput(step, m) && k < op->outputs_size()) {
      LiveLeaseToProto(m, op->mutable_outputs(k++));
    }
  }
}

// --- PreparedChain

absl::Status PreparedChain::Preparable(const std::vector<ChainStepPlan>& steps,
                                       uint64_t max_temporary_bytes) {
  uint64_t temporary_bytes = 0;
  const int device = steps.front().written->device;
  for (const ChainStepPlan& step : steps) {
    if (step.kept != nullptr) return absl::FailedPreconditionError("it keeps a new buffer");
    if (step.stream_id != steps.front().stream_id) {
      return absl::FailedPreconditionError("its steps run on several streams");
    }
    for (const Executor::Access& a : step.plan.spec.accesses) {
      if (a.buffer->device != device) {
        return absl::FailedPreconditionError("its steps run on several devices");
      }
    }
    if (step.temporary) temporary_bytes += step.written->size_bytes();
  }
  if (temporary_bytes > max_temporary_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "its temporaries take ", temporary_bytes, " bytes; at most ", max_temporary_bytes,
        " are kept"));
  }
  return absl::OkStatus();
}

PreparedChain::PreparedChain(std::vector<ChainStepPlan>& steps, std::vector<ResolvedRef> refs,
                             std::string stream_id, size_t record_min_steps)
    : stream_id_(std::move(stream_id)), refs_(std::move(refs)), answer_(steps) {
  for (const ChainStepPlan& planned : steps) {
    if (!planned.temporary) continue;
    temporaries_.push_back(planned.written);
    temporary_bytes_ += planned.written->size_bytes();
  }
  // Only its runs touch its temporaries, so the executor needs to order a run after
  // the run before it, not to track every temporary: one written stands for them all.
  absl::flat_hash_set<const BufferEntry*> untracked;
  for (size_t i = 1; i < temporaries_.size(); ++i) untracked.insert(temporaries_[i].get());
  steps_.reserve(steps.size());
  for (ChainStepPlan& planned : steps) {
    Executor::OpSpec& spec = planned.plan.spec;
    members_.push_back({spec.kind, spec.bytes_read, spec.bytes_written, spec.flops});
    steps_.push_back({spec.capturable, std::move(spec.launch)});
    for (const Executor::Access& a : spec.accesses) {
      if (untracked.contains(a.buffer.get())) continue;
      auto same = [&](const Executor::Access& b) { return b.buffer == a.buffer; };
      auto it = std::find_if(accesses_.begin(), accesses_.end(), same);
      if (it == accesses_.end()) {
        accesses_.push_back(a);
      } else {
        it->write = it->write || a.write;
      }
    }
    for (const BufferMeta& m : spec.outputs) {
      const bool temporary = planned.temporary && m.id == planned.written->id;
      const bool listed = std::any_of(outputs_.begin(), outputs_.end(),
                                      [&](const BufferMeta& o) { return o.id == m.id; });
      if (!temporary && !listed) outputs_.push_back(m);
    }
  }
  // Runs of capturable steps long enough to record; the rest one by one.
  for (size_t i = 0; i < steps_.size();) {
    size_t end = i + 1;
    while (end < steps_.size() && steps_[end].capturable == steps_[i].capturable) ++end;
    const bool record = steps_[i].capturable && record_min_steps != 0 &&
                        end - i >= std::max<size_t>(2, record_min_steps);
    Segment& segment = segments_.emplace_back();
    segment.begin = i;
    segment.end = end;
    segment.record = record;
    i = end;
  }
}

bool PreparedChain::Names(const BufferEntry* entry) const {
  return std::any_of(refs_.begin(), refs_.end(),
                     [&](const ResolvedRef& r) { return r.buffer.get() == entry; });
}

bool PreparedChain::StillResolves(const BufferRegistry& registry, absl::string_view client) const {
  for (const ResolvedRef& r : refs_) {
    absl::StatusOr<BufferHandle> now = registry.Lookup(client, r.ref);
    if (!now.ok() || *now != r.buffer) return false;
  }
  return true;
}

Executor::OpSpec PreparedChain::Spec(const std::shared_ptr<PreparedChain>& self,
                                     const std::shared_ptr<std::vector<OpResult>>& results) const {
  Executor::OpSpec spec;
  spec.kind = members_.front().kind;
  spec.accesses = accesses_;
  spec.outputs = outputs_;
  spec.members = members_;
  for (const OperationMember& m : members_) {
    spec.bytes_read += m.bytes_read;
    spec.bytes_written += m.bytes_written;
    spec.flops += m.flops;
  }
  // It records its own runs (Launch): the executor must not record it among others.
  spec.capturable = false;
  spec.launch = [self, results](Stream& stream, OpResult&) { return self->Launch(stream, *results); };
  return spec;
}

absl::StatusOr<LaunchInfo> PreparedChain::LaunchSteps(Stream& stream, const Segment& segment,
                                                      std::vector<OpResult>& results) {
  for (size_t i = segment.begin; i < segment.end; ++i) {
    RETURN_IF_ERROR(steps_[i].launch(stream, results[i]).status());
  }
  return LaunchInfo{};
}

absl::StatusOr<std::unique_ptr<Recording>> PreparedChain::Record(Stream& stream, Segment& segment,
                                                                 std::vector<OpResult>& results) {
  RETURN_IF_ERROR(stream.BeginCapture());
  const absl::Status launched = LaunchSteps(stream, segment, results).status();
  absl::StatusOr<std::unique_ptr<Recording>> recording = stream.EndRecording();
  RETURN_IF_ERROR(launched);
  if (recording.ok()) {
    for (size_t i = segment.begin; i < segment.end; ++i) {
      segment.next_offsets.push_back(results[i].next_offset);
    }
  }
  return recording;
}

absl::StatusOr<LaunchInfo> PreparedChain::Launch(Stream& stream, std::vector<OpResult>& results) {
  absl::MutexLock lock(&mu_);
  LaunchInfo info;
  // Recorded at the first run, before anything runs. A step that fails to record (or a
  // recording that fails) leaves its segment to run one by one, which then reports the
  // step's error.
  bool recorded = false;
  for (Segment& segment : segments_) {
    if (!segment.record || segment.failed || segment.recording != nullptr || !stream.CanCapture()) {
      continue;
    }
    absl::StatusOr<std::unique_ptr<Recording>> recording = Record(stream, segment, results);
    if (recording.ok()) {
      segment.recording = *std::move(recording);
    } else {
      segment.failed = true;
    }
    recorded = true;
  }
  // The run is timed from here: the recording was the host's work, not the device's.
  if (recorded) {
    ASSIGN_OR_RETURN(info.started, stream.Record());
  }
  for (Segment& segment : segments_) {
    if (segment.recording == nullptr) {
      RETURN_IF_ERROR(LaunchSteps(stream, segment, results).status());
      continue;
    }
    RETURN_IF_ERROR(stream.LaunchRecording(*segment.recording));
    // What the recorded launches left besides device work (random fills' next offsets).
    for (size_t i = segment.begin; i < segment.end; ++i) {
      results[i].next_offset = segment.next_offsets[i - segment.begin];
    }
  }
  return info;
}

// --- ChainCache

std::shared_ptr<ChainCache> MakeChainCache(BufferRegistry& registry) {
  return std::make_shared<ChainCache>(registry);
}

ChainCache::ChainCache(BufferRegistry& registry) : registry_(registry) {
  registry_.SetRemovalListener([this](const BufferEntry& entry) { Forget(entry); });
}

ChainCache::~ChainCache() { registry_.SetRemovalListener(nullptr); }

std::shared_ptr<PreparedChain> ChainCache::Find(const std::string& key, absl::string_view client) {
  std::shared_ptr<PreparedChain> chain;
  {
    absl::MutexLock lock(&mu_);
    auto it = chains_.find(key);
    if (it == chains_.end()) return nullptr;
    chain = it->second.chain;
    lru_.splice(lru_.begin(), lru_, it->second.position);
  }
  // Outside the lock: the registry's removals call Forget.
  if (chain->StillResolves(registry_, client)) return chain;
  absl::MutexLock lock(&mu_);
  auto it = chains_.find(key);
  if (it != chains_.end() && it->second.chain == chain) EraseLocked(it);
  return nullptr;  // `chain`, the last reference, goes after the lock
}

bool ChainCache::SeenBefore(const std::string& key) {
  const size_t hash = absl::HashOf(key);
  absl::MutexLock lock(&mu_);
  if (seen_.contains(hash)) return true;
  if (seen_.size() >= kMaxSeen) seen_.clear();
  seen_.insert(hash);
  return false;
}

void ChainCache::Insert(const std::string& key, std::shared_ptr<PreparedChain> chain) {
  // Those forgotten go after the lock: the last reference frees their temporaries.
  std::vector<std::shared_ptr<PreparedChain>> gone;
  absl::MutexLock lock(&mu_);
  if (auto it = chains_.find(key); it != chains_.end()) gone.push_back(EraseLocked(it));
  while (!lru_.empty() &&
         (chains_.size() >= kMaxChains || total_bytes_ + chain->temporary_bytes() > kMaxTotalBytes)) {
    gone.push_back(EraseLocked(chains_.find(lru_.back())));
  }
  total_bytes_ += chain->temporary_bytes();
  lru_.push_front(key);
  chains_.emplace(key, Kept{std::move(chain), lru_.begin()});
}

void ChainCache::Forget(const BufferEntry& entry) {
  std::vector<std::shared_ptr<PreparedChain>> gone;  // dropped after the lock, as above
  absl::MutexLock lock(&mu_);
  for (auto it = chains_.begin(); it != chains_.end();) {
    auto next = std::next(it);
    if (it->second.chain->Names(&entry)) gone.push_back(EraseLocked(it));
    it = next;
  }
}

size_t ChainCache::size() const {
  absl::MutexLock lock(&mu_);
  return chains_.size();
}

std::shared_ptr<PreparedChain> ChainCache::EraseLocked(
    absl::flat_hash_map<std::string, Kept>::iterator it) {
  std::shared_ptr<PreparedChain> chain = std::move(it->second.chain);
  total_bytes_ -= chain->temporary_bytes();
  lru_.erase(it->second.position);
  chains_.erase(it);
  return chain;
}

}  // namespace gpucompute
