#include "server/core/executor.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "server/core/executor_internal.h"
#include "server/tenancy/auth.h"
#include "server/util/ids.h"
#include "server/tenancy/quotas.h"
#include "server/util/status_macros.h"
#include "server/util/thread_name.h"

namespace gpucompute {

namespace {

std::string DefaultStreamKey(absl::string_view client, int device) {
  return absl::StrCat(client, absl::string_view("\0", 1), device);
}

// "kind buf-read... -> buf-written...", built once at submission.
std::string RangeName(OperationKind kind, const std::vector<Executor::Access>& accesses) {
  std::string name(OperationKindName(kind));
  for (const Executor::Access& a : accesses) {
    if (!a.write) absl::StrAppend(&name, " ", a.buffer->id);
  }
  absl::StrAppend(&name, " ->");
  for (const Executor::Access& a : accesses) {
    if (a.write) absl::StrAppend(&name, " ", a.buffer->id);
  }
  return name;
}

// A request that must name a stream or an operation and names none is malformed, not a
// lookup that failed: INVALID_ARGUMENT, as for an empty buffer reference.
absl::Status NamesNo(absl::string_view what, absl::string_view field) {
  return absl::InvalidArgumentError(
      absl::StrCat("the request names no ", what, ": set '", field, "'"));
}

}  // namespace

absl::string_view OperationKindName(OperationKind kind) {
  switch (kind) {
    case OperationKind::kElementwise:
      return "elementwise";
    case OperationKind::kGemv:
      return "gemv";
    case OperationKind::kReduce:
      return "reduce";
    case OperationKind::kRandom:
      return "random";
    case OperationKind::kFill:
      return "fill";
    case OperationKind::kCopy:
      return "copy";
    case OperationKind::kUpload:
      return "upload";
    case OperationKind::kDownload:
      return "download";
    case OperationKind::kMatmul:
      return "matmul";
  }
  return "unknown";
}

absl::Status CheckDeviceIndex(const Backend& backend, int device) {
  if (device >= 0 && device < static_cast<int>(backend.devices().size())) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("device ", device,
                                                 " does not exist; the server has ",
                                                 backend.devices().size(), " device(s)"));
}

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(Backend& backend, int default_device,
                                                           size_t max_streams) {
  RETURN_IF_ERROR(CheckDeviceIndex(backend, default_device));
  if (max_streams == 0) return absl::InvalidArgumentError("max_streams must be at least 1");
  std::vector<std::unique_ptr<Stream>> transfer_streams;
  for (const DeviceDescription& d : backend.devices()) {
    ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, backend.CreateStream(d.index));
    transfer_streams.push_back(std::move(stream));
  }
  return std::unique_ptr<Executor>(
      new Executor(backend, default_device, max_streams, std::move(transfer_streams)));
}

Executor::Executor(Backend& backend, int default_device, size_t max_streams,
                   std::vector<std::unique_ptr<Stream>> transfer_streams)
    : backend_(backend),
      default_device_(default_device),
      max_streams_(max_streams),
      dispatch_window_(std::max(1, backend.DispatchWindow())),
      transfer_streams_(std::move(transfer_streams)),
      // Reserved whole, so that the table of retained operations is never rehashed to
      // grow under the mutex while submissions wait for it.
      operations_(kRetainedOperations),
      reaper_([this] {
        NameThisThread("executor-reap");
        ReapRetiredStreams();
      }) {}

void Executor::ReapRetiredStreams() {
  for (;;) {
    mu_.LockWhen(absl::Condition(
        +[](Executor* e)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return e->stopping_ || !e->retired_.empty(); },
        this));
    std::vector<std::unique_ptr<Stream>> retired = std::move(retired_);
    retired_.clear();
    const bool stopping = stopping_;
    mu_.Unlock();
    retired.clear();
    if (stopping) return;
  }
}

Executor::~Executor() {
  mu_.LockWhen(absl::Condition(
      +[](Executor* e)
           ABSL_NO_THREAD_SAFETY_ANALYSIS { return e->in_flight_ == 0 && e->launchers_ == 0; },
      this));
  stopping_ = true;
  mu_.Unlock();
  reaper_.join();
  mu_.Lock();
  auto streams = std::move(streams_);
  auto retired = std::move(retired_);
  mu_.Unlock();
  // Streams are destroyed here, on this thread, never on their own.
  for (auto& [id, s] : streams) s->stream.reset();
  retired.clear();
}

StreamInfo Executor::InfoLocked(const StreamState& s) const {
  return StreamInfo{s.id, s.device, s.is_default, s.unfinished};
}

absl::StatusOr<std::shared_ptr<StreamState>> Executor::NewStreamLocked(absl::string_view client,
                                                                       int device,
                                                                       bool is_default) {
  RETURN_IF_ERROR(CheckDeviceIndex(backend_, device));
  size_t owned = 0;
  for (const auto& [id, s] : streams_) owned += s->client == client;
  if (owned >= kMaxStreamsPerClient) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a client may have at most ", kMaxStreamsPerClient, " streams; delete one first"));
  }
  if (quotas_ != nullptr) {
    const absl::string_view tenant = TenantOfScope(client);
    const uint64_t quota = quotas_->For(tenant).streams;
    uint64_t tenant_streams = 0;
    for (const auto& [id, s] : streams_) tenant_streams += TenantOfScope(s->client) == tenant;
    if (quota != 0 && tenant_streams >= quota) {
      return QuotaExceeded(tenant, "streams", quota,
                           absl::StrCat(tenant_streams, " streams, default streams included"));
    }
  }
  RETURN_IF_ERROR(ReserveStreamLocked());
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, backend_.CreateStream(device));
  auto s = std::make_shared<StreamState>();
  s->id = NewId("str-");
  s->client = std::string(client);
  s->device = device;
  s->is_default = is_default;
  s->stream = std::move(stream);
  streams_.emplace(s->id, s);
  if (is_default) default_streams_.emplace(DefaultStreamKey(client, device), s->id);
  return s;
}

bool Executor::WaitIdle(absl::Time deadline) {
  const bool idle = mu_.LockWhenWithDeadline(
      absl::Condition(
          +[](uint64_t* in_flight) { return *in_flight == 0; }, &in_flight_),
      deadline);
  mu_.Unlock();
  return idle;
}

size_t Executor::CancelQueued(absl::Status status) {
  Guard guard(*this);
  cancelled_ = std::move(status);
  size_t queued = 0;
  for (const auto& [id, s] : streams_) queued += s->pending.size();
  // A pump may pump other streams too (what waited on a cancelled operation).
  for (const auto& [id, s] : streams_) PumpLocked(s);
  return queued;
}

absl::StatusOr<StreamInfo> Executor::CreateStream(absl::string_view client, int device) {
  Guard guard(*this);
  ASSIGN_OR_RETURN(std::shared_ptr<StreamState> s, NewStreamLocked(client, device, false));
  return InfoLocked(*s);
}

absl::StatusOr<StreamInfo> Executor::DefaultStream(absl::string_view client, int device) {
  Guard guard(*this);
  ASSIGN_OR_RETURN(std::shared_ptr<StreamState> s, ResolveStreamLocked(client, "", device));
  return InfoLocked(*s);
}

absl::StatusOr<std::shared_ptr<StreamState>> Executor::ResolveStreamLocked(
    absl::string_view client, absl::string_view stream_id, int device) {
  if (stream_id.empty()) {
    auto it = default_streams_.find(DefaultStreamKey(client, device));
    if (it != default_streams_.end()) return streams_.at(it->second);
    return NewStreamLocked(client, device, true);
  }
  return FindStreamLocked(client, stream_id, device);
}

absl::StatusOr<std::shared_ptr<StreamState>> Executor::FindStreamLocked(
    absl::string_view client, absl::string_view stream_id, int device) {
  auto it = streams_.find(stream_id);
  if (it == streams_.end() || !SameTenant(it->second->client, client))
    return absl::NotFoundError(absl::StrCat("stream ", stream_id, " not found"));
  if (it->second->device != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream ", stream_id, " is on device ", it->second->device,
                     " but the operation's buffers are on device ", device));
  }
  return it->second;
}

absl::Status Executor::DeleteStream(absl::string_view client, absl::string_view stream_id,
                                    absl::AnyInvocable<void() &&> done) {
  if (stream_id.empty()) return NamesNo("stream", "stream_id");
  Guard guard(*this);
  auto it = streams_.find(stream_id);
  if (it == streams_.end() || !SameTenant(it->second->client, client))
    return absl::NotFoundError(absl::StrCat("stream ", stream_id, " not found"));
  std::shared_ptr<StreamState> s = it->second;
  if (s->is_default) {
    return absl::FailedPreconditionError(
        absl::StrCat("stream ", stream_id, " is a default stream and cannot be deleted"));
  }
  RetireStreamLocked(std::move(s), std::move(done));
  return absl::OkStatus();
}

absl::Status Executor::ReserveStreamLocked() {
  if (streams_.size() < max_streams_) return absl::OkStatus();
  // A default stream is made on a client's first use and cannot be deleted, so clients
  // that come and go would otherwise use up the streams (and, on the CPU backend, a
  // thread each). An idle one has nothing to finish and is made again when next used.
  for (auto it = default_streams_.begin(); it != default_streams_.end(); ++it) {
    std::shared_ptr<StreamState> s = streams_.at(it->second);
    if (s->unfinished != 0 || !s->pending.empty()) continue;
    default_streams_.erase(it);
    RetireStreamLocked(std::move(s), [] {});
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("the server has ", streams_.size(),
                   " streams, its limit (--max-streams), and every one is "
                   "busy or not a default stream; retry later or delete a stream"));
}

void Executor::RetireStreamLocked(std::shared_ptr<StreamState> s,
                                  absl::AnyInvocable<void() &&> done) {
  streams_.erase(s->id);
  // The backend stream is retired once its last operation is done; it is destroyed
  // later on another thread, since completions run on the stream's own thread.
  auto retire = [this, s, done = std::move(done)]() mutable {
    {
      absl::MutexLock lock(&mu_);
      retired_.push_back(std::move(s->stream));
    }
    std::move(done)();
  };
  std::shared_ptr<Operation> last = s->last.lock();
  if (last != nullptr && !last->status_.done()) {
    last->on_done_.push_back(std::move(retire));
  } else {
    deferred_.push_back(std::move(retire));
  }
}

absl::Status Executor::Synchronize(absl::string_view client, absl::string_view stream_id,
                                   absl::AnyInvocable<void() &&> done) {
  if (stream_id.empty()) return NamesNo("stream", "stream_id");
  Guard guard(*this);
  auto it = streams_.find(stream_id);
  if (it == streams_.end() || !SameTenant(it->second->client, client))
    return absl::NotFoundError(absl::StrCat("stream ", stream_id, " not found"));
  // Operations on one stream finish in order, so the newest being done means all are.
  std::shared_ptr<Operation> last = it->second->last.lock();
  if (last != nullptr && !last->status_.done()) {
    last->on_done_.push_back(std::move(done));
  } else {
    deferred_.push_back(std::move(done));
  }
  return absl::OkStatus();
}

std::vector<StreamInfo> Executor::ListStreams(absl::string_view client) {
  Guard guard(*this);
  std::vector<StreamInfo> out;
  for (const auto& [id, s] : streams_) {
    if (s->client == client) out.push_back(InfoLocked(*s));
  }
  std::sort(out.begin(), out.end(), [](const StreamInfo& a, const StreamInfo& b) {
    return std::tie(b.is_default, a.device, a.id) < std::tie(a.is_default, b.device, b.id);
  });
  return out;
}

void Executor::PopDoneReadersLocked(Hazards& h) {
  while (!h.readers.empty() && WorkDoneLocked(*h.readers.front())) h.readers.pop_front();
}

void Executor::AddDependencyLocked(Work& work, const std::shared_ptr<Work>& dep) {
  if (dep == nullptr || dep.get() == &work || WorkDoneLocked(*dep)) return;
  AssertWorkLocked(work);
  if (std::find(work.deps_.begin(), work.deps_.end(), dep) == work.deps_.end()) {
    work.deps_.push_back(dep);
  }
}

void Executor::TrackHazardsLocked(const std::shared_ptr<Work>& work,
                                  const std::vector<Access>& accesses) {
  // One entry per buffer; a buffer both read and written counts as written.
  std::vector<Access> merged;
  for (const Access& a : accesses) {
    auto same = std::find_if(merged.begin(), merged.end(),
                             [&](const Access& m) { return m.buffer == a.buffer; });
    if (same == merged.end()) {
      merged.push_back(a);
    } else {
      same->write |= a.write;
    }
  }
  for (const Access& a : merged) {
    Hazards& b = hazards_[a.buffer.get()];
    AddDependencyLocked(*work, b.last_writer);
    PopDoneReadersLocked(b);
    if (a.write) {
      for (const auto& r : b.readers) AddDependencyLocked(*work, r);
      b.readers.clear();
      b.last_writer = work;
    } else {
      b.readers.push_back(work);
    }
  }
}

uint64_t Executor::OperationsQuota(absl::string_view client) const {
  return quotas_ != nullptr ? quotas_->For(TenantOfScope(client)).operations : 0;
}

absl::StatusOr<int> Executor::DeviceOf(const OpSpec& spec) const {
  if (spec.accesses.empty()) return default_device_;
  const BufferEntry& first = *spec.accesses.front().buffer;
  for (const Access& a : spec.accesses) {
    if (a.buffer->device != first.device) {
      return absl::InvalidArgumentError(
          absl::StrCat("buffers ", first.id, " and ", a.buffer->id, " are on different devices (",
                       first.device, " and ", a.buffer->device,
                       "); an operation runs on one device"));
    }
  }
  return first.device;
}

absl::Status Executor::CheckSubmitAll(absl::string_view client,
                                      std::span<const SubmitItem> items, size_t* refused) {
  std::vector<int> devices;
  devices.reserve(items.size());
  uint64_t weight = 0;  // of the API's operations
  for (size_t i = 0; i < items.size(); ++i) {
    weight += Weight(items[i].spec->members);
    absl::StatusOr<int> device = DeviceOf(*items[i].spec);
    if (!device.ok()) {
      *refused = i;
      return device.status();
    }
    devices.push_back(*device);
  }
  Guard guard(*this);
  // In SubmitLocked's order: shutdown, the quota, the stream.
  if (!cancelled_.ok() && !items.empty()) {
    *refused = 0;
    return cancelled_;
  }
  const uint64_t quota = OperationsQuota(client);
  if (quota != 0) {
    const uint64_t in_flight = TenantLocked(client).in_flight;
    if (in_flight + weight > quota) {
      // The first item that does not fit.
      uint64_t room = quota > in_flight ? quota - in_flight : 0;
      size_t i = 0;
      for (; i < items.size(); ++i) {
        const uint64_t w = Weight(items[i].spec->members);
        if (w > room) break;
        room -= w;
      }
      *refused = i;
      return QuotaExceeded(TenantOfScope(client), "operations", quota,
                           absl::StrCat(in_flight, " operations in flight and ", weight,
                                        " more asked for"));
    }
  }
  for (size_t i = 0; i < items.size(); ++i) {
    // The default stream is made on first use; any other must exist already.
    if (items[i].stream_id.empty()) continue;
    absl::StatusOr<std::shared_ptr<StreamState>> s =
        FindStreamLocked(client, items[i].stream_id, devices[i]);
    if (!s.ok()) {
      *refused = i;
      return s.status();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Operation>> Executor::Submit(absl::string_view client,
                                                            absl::string_view stream_id,
                                                            OpSpec spec) {
  SubmitItem item{stream_id, &spec};
  Submitted result = SubmitAll(client, std::span<SubmitItem>(&item, 1));
  if (!result.refused.ok()) return result.refused;
  return std::move(result.operations.front());
}

Executor::Submitted Executor::SubmitAll(absl::string_view client, std::span<SubmitItem> items) {
  Submitted result;
  // Everything that does not depend on the executor's state is made before its lock:
  // the operations of the items up to the first whose buffers are on two devices.
  std::vector<std::shared_ptr<Operation>> ops;
  ops.reserve(items.size());
  for (const SubmitItem& item : items) {
    const OpSpec& spec = *item.spec;
    absl::StatusOr<int> device = DeviceOf(spec);
    if (!device.ok()) {
      result.refused = device.status();
      break;
    }
    auto op = std::make_shared<Operation>(mu_);
    OperationStatus& st = op->status_;
    st.id = NewId("op-");
    op->scope_ = std::string(client);
    st.kind = spec.kind;
    st.device = *device;
    st.timing.bytes_read = spec.bytes_read;
    st.timing.bytes_written = spec.bytes_written;
    st.timing.flops = spec.flops;
    st.timing.compile_seconds = spec.compile_seconds;
    st.members = spec.members;
    op->capturable_ = spec.capturable;
    op->range_name_ = RangeName(spec.kind, spec.accesses);
    op->buffers_.reserve(spec.accesses.size());
    for (const Access& a : spec.accesses) op->buffers_.push_back(a.buffer);
    ops.push_back(std::move(op));
  }
  // Listed before the mutex is taken, and those not submitted unlisted after it is
  // released: the table of operations has a lock of its own.
  {
    absl::MutexLock lock(&ops_mu_);
    for (const auto& op : ops) operations_.emplace(op->status_.id, op);
  }
  absl::Cleanup unlist = [&] {
    if (result.operations.size() == ops.size()) return;
    absl::MutexLock lock(&ops_mu_);
    for (size_t i = result.operations.size(); i < ops.size(); ++i) {
      operations_.erase(ops[i]->status_.id);
    }
  };

  if (ops.empty()) return result;
  Guard guard(*this);
  // One client, so one tenant and one quota for all the items.
  TenantTally& tenant = TenantLocked(client);
  const uint64_t quota = OperationsQuota(client);
  for (size_t i = 0; i < ops.size(); ++i) {
    absl::Status refused = SubmitLocked(client, items[i], ops[i], tenant, quota);
    if (!refused.ok()) {
      result.refused = std::move(refused);
      break;
    }
    result.operations.push_back(ops[i]);
  }
  return result;
}

absl::Status Executor::SubmitLocked(absl::string_view client, const SubmitItem& item,
                                    const std::shared_ptr<Operation>& op,
                                    TenantTally& tenant_tally, uint64_t quota) {
  RETURN_IF_ERROR(cancelled_);
  OperationStatus& st = op->status_;
  if (quota != 0 && tenant_tally.in_flight + st.weight() > quota) {
    return QuotaExceeded(TenantOfScope(client), "operations", quota,
                         absl::StrCat(tenant_tally.in_flight, " operations in flight and ",
                                      st.weight(), " more asked for"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<StreamState> s,
                   ResolveStreamLocked(client, item.stream_id, st.device));
  // Accepted: the spec is taken.
  OpSpec& spec = *item.spec;
  st.outputs = std::move(spec.outputs);
  op->launch_ = std::move(spec.launch);
  op->own_done_ = std::move(spec.on_done);
  st.stream_id = s->id;
  AssertWorkLocked(*op);
  op->stream_ = s.get();
  op->stream_state_ = s;
  op->submit_time_ = Clock::now();
  TrackHazardsLocked(op, spec.accesses);
  // What it writes cannot expire until it is done (CompleteLocked starts the lease).
  for (const Access& a : spec.accesses) {
    if (!a.write) continue;
    a.buffer->lease.Hold();
    op->held_leases_.push_back(&a.buffer->lease);
  }

  s->pending.push_back(op);
  s->last = op;
  ++s->unfinished;
  ++in_flight_;
  tenant_tally.in_flight += st.weight();
  op->tenant_ = &tenant_tally;
  if (observer_ != nullptr) observer_->OnSubmitted(st);
  PumpLocked(s);
  return absl::OkStatus();
}

void Executor::ForgetFinishedHazardsLocked(const std::vector<BufferHandle>& buffers) {
  for (const BufferHandle& buffer : buffers) {
    auto it = hazards_.find(buffer.get());
    if (it == hazards_.end()) continue;
    Hazards& h = it->second;
    PopDoneReadersLocked(h);
    if (h.last_writer != nullptr && WorkDoneLocked(*h.last_writer)) h.last_writer.reset();
    if (h.last_writer == nullptr && h.readers.empty()) hazards_.erase(it);
  }
}

absl::StatusOr<std::shared_ptr<Operation>> Executor::FindOperation(absl::string_view client,
                                                                   absl::string_view id) {
  if (id.empty()) return NamesNo("operation", "operation_id");
  absl::MutexLock lock(&ops_mu_);
  auto it = operations_.find(id);
  if (it == operations_.end() || !SameTenant(it->second->scope_, client)) {
    return absl::NotFoundError(absl::StrCat("operation ", id,
                                            " not found (the server keeps at most the last ",
                                            kRetainedOperations, " finished operations)"));
  }
  return it->second;
}

OperationStatus Executor::GetStatus(const Operation& op) {
  if (op.final_.load(std::memory_order_acquire)) return op.status_;
  Guard guard(*this);
  if (op.status_.done()) return op.status_;
  // The device may still be writing the inline results; copy everything else.
  OperationStatus copy = op.status_;
  copy.result = OpResult{};
  // Handed to the device is not yet running: it may wait behind earlier work there.
  if (op.start_event_ == nullptr || !op.start_event_->IsComplete())
    copy.state = OperationStatus::State::kQueued;
  return copy;
}

const OperationStatus& Executor::FinalStatus(const Operation& op) {
  // Acquire: pairs with CompleteLocked's release, for callers that learned of the
  // completion other than through the mutex.
  if (!op.final_.load(std::memory_order_acquire)) std::abort();  // a caller's bug
  return op.status_;
}

void Executor::OnDone(const std::shared_ptr<Operation>& op, absl::AnyInvocable<void() &&> fn) {
  Guard guard(*this);
  if (op->status_.done()) {
    deferred_.push_back(std::move(fn));
  } else {
    op->on_done_.push_back(std::move(fn));
  }
}

std::shared_ptr<HostAccess> Executor::AcquireHostAccess(std::vector<Access> accesses,
                                                        ReadyFn ready) {
  Guard guard(*this);
  auto access = std::make_shared<HostAccess>(mu_);
  for (const Access& a : accesses) access->buffers_.push_back(a.buffer);
  access->ready_ = std::move(ready);
  TrackHazardsLocked(access, accesses);
  CheckHostAccessLocked(access);
  return access;
}

void Executor::CheckHostAccessLocked(const std::shared_ptr<HostAccess>& access) {
  AssertWorkLocked(*access);
  if (access->phase_ != Work::Phase::kPending) return;
  for (const std::shared_ptr<Work>& dep : access->deps_) {
    AssertWorkLocked(*dep);
    if (dep->phase_ != Work::Phase::kDone) {
      dep->listeners_.push_back([this, access] {
        mu_.AssertHeld();  // listeners run under the lock (NotifyLocked)
        CheckHostAccessLocked(access);
      });
      return;
    }
  }
  access->deps_.clear();
  access->phase_ = Work::Phase::kDispatched;
  deferred_.push_back(
      [access, ready = std::move(access->ready_)]() mutable { std::move(ready)(access); });
}

void Executor::Release(const std::shared_ptr<HostAccess>& access) {
  Guard guard(*this);
  AssertWorkLocked(*access);
  if (access->phase_ == Work::Phase::kDone) return;
  access->phase_ = Work::Phase::kDone;
  ForgetFinishedHazardsLocked(access->buffers_);
  access->buffers_.clear();
  access->deps_.clear();
  access->ready_ = nullptr;
  NotifyLocked(*access);
}

TenantTally& Executor::TenantLocked(absl::string_view scope) {
  const absl::string_view tenant = TenantOfScope(scope);
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) it = tenants_.emplace(std::string(tenant), TenantTally{}).first;
  return it->second;
}

Stream& Executor::TransferStream(int device) { return *transfer_streams_.at(device); }

void Executor::RecordTransfer(absl::string_view scope, OperationKind kind, uint64_t bytes) {
  Guard guard(*this);
  for (KindStats* k : {&stats_[static_cast<int>(kind)],
                       &TenantLocked(scope).stats[static_cast<int>(kind)]}) {
    ++k->count;
    if (kind == OperationKind::kUpload) {
      k->bytes_written += bytes;
    } else {
      k->bytes_read += bytes;
    }
  }
}

void Executor::RecordFailedTransfer(absl::string_view scope, OperationKind kind,
                                    const absl::Status& error) {
  Guard guard(*this);
  for (KindStats* k : {&stats_[static_cast<int>(kind)],
                       &TenantLocked(scope).stats[static_cast<int>(kind)]}) {
    ++k->count;
    ++k->failed;
    if (error.code() == absl::StatusCode::kCancelled) ++k->cancelled;
    if (error.code() == absl::StatusCode::kDeadlineExceeded) ++k->timed_out;
  }
}

std::array<KindStats, kNumOperationKinds> Executor::Stats(std::optional<absl::string_view> tenant) {
  Guard guard(*this);
  if (!tenant.has_value()) return stats_;
  auto it = tenants_.find(*tenant);
  return it == tenants_.end() ? std::array<KindStats, kNumOperationKinds>{} : it->second.stats;
}

}  // namespace gpucompute
