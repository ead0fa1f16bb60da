// Dispatch: moving a stream's operations that may start to the device, one by one or
// recorded and launched as one unit (Stream::BeginCapture).
#include <algorithm>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "server/core/executor.h"
#include "server/core/executor_internal.h"

namespace gpucompute {
namespace {

// The innermost LaunchBatch alive on this thread.
thread_local Executor::LaunchBatch* current_launch_batch = nullptr;

}  // namespace

void Executor::PumpLocked(const std::shared_ptr<StreamState>& s) {
  if (s->pumping) {
    s->repump = true;
    return;
  }
  s->pumping = true;
  do {
    s->repump = false;
    while (!s->pending.empty() && (s->dispatched < dispatch_window_ || !cancelled_.ok())) {
      const std::shared_ptr<Operation> op = s->pending.front();
      AssertWorkLocked(*op);
      std::vector<std::shared_ptr<Event>> waits;
      Work* blocked = nullptr;
      // Cancelled work fails at once, behind what its stream already runs; it waits for
      // nothing else, since it touches no memory.
      for (size_t i = 0; cancelled_.ok() && i < op->deps_.size(); ++i) {
        const std::shared_ptr<Work>& dep = op->deps_[i];
        AssertWorkLocked(*dep);
        if (dep->phase_ == Work::Phase::kDone || dep->stream_ == s.get()) continue;
        if (dep->phase_ == Work::Phase::kDispatched && dep->end_event_ != nullptr) {
          waits.push_back(dep->end_event_);
          continue;
        }
        blocked = dep.get();
        break;
      }
      if (blocked != nullptr) {
        if (s->blocked_on != blocked) {
          s->blocked_on = blocked;
          Work& blocker = *blocked;
          AssertWorkLocked(blocker);
          blocker.listeners_.push_back([this, s] {
            mu_.AssertHeld();  // listeners run under the lock (NotifyLocked)
            s->blocked_on = nullptr;
            PumpLocked(s);
          });
        }
        break;
      }
      s->blocked_on = nullptr;
      s->pending.pop_front();
      op->deps_.clear();
      op->phase_ = Work::Phase::kLaunching;
      ++s->dispatched;
      QueuedLaunch& launch = s->launch_queue.emplace_back();
      launch.op = op;
      launch.waits = std::move(waits);
    }
  } while (s->repump);
  s->pumping = false;
  if (!s->launch_queue.empty() && !s->launching) {
    s->launching = true;
    ++launchers_;
    // Held back by a batch only where the launches may be recorded together; elsewhere
    // the device starts on the first while the rest are submitted.
    LaunchBatch* batch =
        capture_min_ops_ > 0 && s->stream->CanCapture() ? current_launch_batch : nullptr;
    while (batch != nullptr && &batch->executor_ != this) batch = batch->outer_;
    (batch != nullptr ? batch->launches_ : deferred_).push_back([this, s] { LaunchQueued(s); });
  }
}

void Executor::LaunchQueued(const std::shared_ptr<StreamState>& s) {
  // The backend stream outlives this: it is retired only once its last operation is
  // done, which is after this thread has enqueued its completion.
  Stream& stream = *s->stream;
  for (;;) {
    std::vector<QueuedLaunch> batch;
    absl::Status cancelled;
    {
      absl::MutexLock lock(&mu_);
      batch.swap(s->launch_queue);
      if (batch.empty()) {
        s->launching = false;
        --launchers_;  // the destructor may go on once this is released
        return;
      }
      cancelled = cancelled_;
    }
    // Maximal runs of capturable operations with nothing to wait for are recorded and
    // launched as one unit when long enough; everything else launches one by one.
    const bool may_capture = capture_min_ops_ > 0 && cancelled.ok() && stream.CanCapture();
    for (size_t i = 0; i < batch.size();) {
      size_t end = i;
      while (may_capture && end < batch.size() && batch[end].op->capturable_ &&
             batch[end].waits.empty()) {
        ++end;
      }
      if (may_capture && end - i >= capture_min_ops_ &&
          LaunchRecorded(stream, std::span<QueuedLaunch>(batch).subspan(i, end - i))) {
        batch[i].recorded_run = end - i;
        i = end;
        continue;
      }
      end = std::max(end, i + 1);
      for (; i < end; ++i) LaunchOne(stream, batch[i], cancelled);
    }
    for (QueuedLaunch& l : batch) l.op->launch_ = nullptr;  // drop what the launch captured
    {
      Guard guard(*this);
      for (QueuedLaunch& l : batch) {
        Operation& op = *l.op;
        AssertWorkLocked(op);
        op.start_event_ = std::move(l.start);
        op.end_event_ = l.end;
        op.status_.timing.compile_seconds += l.compile_seconds;
        // The device may still write inline values into the vector's memory, which
        // the move keeps.
        op.status_.result = std::move(l.result);
        op.status_.state = OperationStatus::State::kRunning;
        op.phase_ = Work::Phase::kDispatched;
        if (observer_ != nullptr) observer_->OnDispatched(op.status_);
        NotifyLocked(op);
      }
    }
    // In the stream's order, after the mutex: a completion may come at once. Even a
    // failed launch completes through the stream, so that it stays in order with the
    // work before it. A recorded run completes as one.
    for (size_t i = 0; i < batch.size();) {
      QueuedLaunch& l = batch[i];
      const size_t run_size = std::max<size_t>(l.recorded_run, 1);
      absl::AnyInvocable<void(absl::Status) &&> complete;
      if (l.recorded_run > 0) {
        std::vector<RunMember> run;
        for (size_t j = i; j < i + run_size; ++j) run.emplace_back(batch[j].op, batch[j].status);
        complete = [this, run = std::move(run)](absl::Status device_status) {
          CompleteRecordedRun(run, device_status);
        };
      } else {
        complete = [this, op = l.op, status = l.status](absl::Status device_status) {
          CompleteOperation(op, status.ok() ? device_status : status);
        };
      }
      // The end event follows all the operation (or run) enqueued; a failed launch has
      // none.
      absl::Status enqueued = l.end != nullptr ? stream.OnEvent(l.end, std::move(complete))
                                               : stream.OnComplete(std::move(complete));
      if (!enqueued.ok()) {  // unusable stream
        for (size_t j = i; j < i + run_size; ++j) CompleteOperation(batch[j].op, enqueued);
      }
      i += run_size;
    }
  }
}

Executor::LaunchBatch::LaunchBatch(Executor& executor)
    : executor_(executor), outer_(current_launch_batch) {
  current_launch_batch = this;
}

Executor::LaunchBatch::~LaunchBatch() {
  current_launch_batch = outer_;
  for (auto& launch : launches_) std::move(launch)();
}

void Executor::LaunchOne(Stream& stream, QueuedLaunch& l, const absl::Status& cancelled) {
  // The range covers all this operation enqueues: its waits, events and kernels.
  ScopedRange range(backend_, l.op->range_name_);
  absl::Status status = cancelled;
  for (auto& w : l.waits) {
    if (status.ok()) status = stream.Wait(std::move(w));
  }
  l.waits.clear();
  absl::StatusOr<std::shared_ptr<Event>> start = status.ok() ? stream.Record() : status;
  if (start.ok()) {
    l.start = *std::move(start);
    absl::StatusOr<LaunchInfo> info = l.op->launch_(stream, l.result);
    if (info.ok()) {
      l.compile_seconds = info->compile_seconds;
      if (info->started != nullptr) l.start = std::move(info->started);
    } else {
      status = info.status();
    }
  } else {
    status = start.status();
  }
  if (status.ok()) {
    absl::StatusOr<std::shared_ptr<Event>> end = stream.Record();
    if (end.ok()) {
      l.end = *std::move(end);
    } else {
      status = end.status();
    }
  }
  l.status = std::move(status);
}

bool Executor::LaunchRecorded(Stream& stream, std::span<QueuedLaunch> run) {
  if (!stream.BeginCapture().ok()) return false;
  absl::Status status;
  for (QueuedLaunch& l : run) {
    ScopedRange range(backend_, l.op->range_name_);
    absl::StatusOr<LaunchInfo> info = l.op->launch_(stream, l.result);
    if (!info.ok()) {
      status = info.status();
      break;
    }
    l.compile_seconds = info->compile_seconds;
  }
  // The capture ends either way; when recording failed, nothing recorded runs.
  const absl::Status ended = stream.EndCapture();
  // The run is timed by events around its launch (events recorded inside it would cost
  // the launch more than the kernels do), the first enqueued once the recording is
  // done: one enqueued before it would time the host's recording too, on an idle stream.
  absl::StatusOr<std::shared_ptr<Event>> start =
      status.ok() && ended.ok() ? stream.Record() : ended;
  if (!status.ok() || !start.ok() || !stream.LaunchCaptured().ok()) {
    for (QueuedLaunch& l : run) {
      l.compile_seconds = 0;
      l.result = OpResult{};
    }
    return false;
  }
  // The whole run is one unit on the device: its operations are done, and may be waited
  // for, together.
  absl::StatusOr<std::shared_ptr<Event>> end = stream.Record();
  for (QueuedLaunch& l : run) {
    l.start = *start;
    if (end.ok()) {
      l.end = *end;
    } else {
      l.status = end.status();  // completes through the stream, behind the run
    }
  }
  return true;
}

}  // namespace gpucompute
