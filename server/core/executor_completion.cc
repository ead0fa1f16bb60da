// Completion: an operation's end, its statistics and retention, and the work that waited
// for it.
#include <algorithm>
#include <chrono>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "server/core/executor.h"
#include "server/core/executor_internal.h"

namespace gpucompute {

double Executor::DeviceSeconds(const Operation& op, const absl::Status& status) {
  const std::shared_ptr<Event>& end = op.end_event_at_completion();
  if (!status.ok() || op.start_event_ == nullptr || end == nullptr) return 0;
  absl::StatusOr<double> elapsed = backend_.ElapsedSeconds(*op.start_event_, *end);
  return elapsed.ok() ? *elapsed : 0;
}

void Executor::CompleteOperation(const std::shared_ptr<Operation>& op, absl::Status status) {
  const double device_seconds = DeviceSeconds(*op, status);
  Guard guard(*this);
  CompleteLocked(op, std::move(status), device_seconds);
}

void Executor::CompleteRecordedRun(const std::vector<RunMember>& run,
                                   const absl::Status& device_status) {
  // They share their start and end events: the run is timed as a whole.
  const double share = DeviceSeconds(*run.front().first, device_status) / run.size();
  // Under one lock: the operations that wait for room in the dispatch window move to the
  // launch queue together, and may be recorded together in turn.
  Guard guard(*this);
  for (const auto& [op, launched] : run) {
    op->status_.timing.graph_operations = static_cast<uint32_t>(run.size());
    CompleteLocked(op, launched.ok() ? device_status : launched, launched.ok() ? share : 0);
  }
}

void Executor::CompleteLocked(const std::shared_ptr<Operation>& op, absl::Status status,
                              double device_seconds) {
  AssertWorkLocked(*op);
  const double since_submit =
      std::chrono::duration<double>(Clock::now() - op->submit_time_).count();
  OperationStatus& st = op->status_;
  st.timing.device_seconds = device_seconds;
  st.timing.queued_seconds = std::max(0.0, since_submit - device_seconds);
  st.state = status.ok() ? OperationStatus::State::kSucceeded : OperationStatus::State::kFailed;
  st.error = status;
  if (!status.ok()) st.result = OpResult{};
  // The leases of what it wrote start now, when the results exist, not at submission.
  const int64_t now = SteadyNanos();
  for (Lease* lease : op->held_leases_) lease->Unhold(now);
  op->held_leases_.clear();

  // Each of the API's operations it stands for, with an even share of the time.
  OperationMember one;
  const std::span<const OperationMember> members = st.Operations(one);
  const double share = device_seconds / members.size();
  for (const OperationMember& m : members) {
    for (KindStats* k : {&stats_[static_cast<int>(m.kind)],
                         &op->tenant_->stats[static_cast<int>(m.kind)]}) {
      ++k->count;
      k->failed += !status.ok();
      k->device_seconds += share;
      k->bytes_read += m.bytes_read;
      k->bytes_written += m.bytes_written;
      k->flops += m.flops;
    }
  }
  // The status is final: GetStatus may read it without the lock from here on.
  op->final_.store(true, std::memory_order_release);
  if (observer_ != nullptr || op->own_done_ != nullptr) completed_.push_back(op);

  op->phase_ = Work::Phase::kDone;
  ForgetFinishedHazardsLocked(op->buffers_);
  for (BufferHandle& buffer : op->buffers_) dropped_.push_back(std::move(buffer));
  op->buffers_.clear();
  if (op->start_event_ != nullptr) dropped_.push_back(std::move(op->start_event_));
  --op->stream_state_->unfinished;
  --op->stream_state_->dispatched;
  for (auto& fn : op->on_done_) deferred_.push_back(std::move(fn));
  op->on_done_.clear();
  NotifyLocked(*op);
  if (op->end_event_ != nullptr) dropped_.push_back(std::move(op->end_event_));
  if (!op->stream_state_->pending.empty()) PumpLocked(op->stream_state_);

  absl::MutexLock ops_lock(&ops_mu_);  // inside mu_, never the other way round
  finished_order_.push_back(op.get());
  retained_value_bytes_ += st.result.values.size();
  while (finished_order_.size() > kRetainedOperations ||
         retained_value_bytes_ > kRetainedValueBytes) {
    auto oldest = operations_.find(finished_order_.front()->id());
    retained_value_bytes_ -= oldest->second->status_.result.values.size();
    dropped_.push_back(std::move(oldest->second));
    operations_.erase(oldest);
    finished_order_.pop_front();
  }
  op->tenant_->in_flight -= op->status_.weight();
  --in_flight_;  // the destructor's LockWhen sees it reach zero
}

void Executor::NotifyLocked(Work& work) {
  AssertWorkLocked(work);
  std::vector<absl::AnyInvocable<void()>> listeners = std::move(work.listeners_);
  work.listeners_.clear();
  for (auto& l : listeners) l();
}

}  // namespace gpucompute
