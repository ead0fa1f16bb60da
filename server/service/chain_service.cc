// SessionService.RunChain: a list of tagged steps, checked whole, queued at once, and
// answered when the last is done (the contract is in the proto). A chain submitted again
// unchanged runs prepared, as one operation (chain_replay.h).
#include <algorithm>
#include <atomic>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "server/service/chain_replay.h"
#include "server/service/services.h"
#include "server/service/tagged_ops.h"
#include "common/wire_format.h"
#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

// Steps queued and launched together (RunChainCall): long enough that a run's launch
// costs little per step, short enough that the device starts early. 32 was the fastest
// of the run lengths tried (docs/performance.md, "Chains queued 32 steps at a time").
constexpr size_t kChainLaunchRun = 32;

// `status` with its message prefixed by the step it is about.
absl::Status StepError(size_t index, absl::string_view tag, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("step ", index, " ('", tag, "'): ", status.message()));
}

// Checks and plans every step. Nothing is queued or registered; on error the buffers
// the plans allocated are freed with them.
// The buffer references that are not tags go to `refs`.
absl::StatusOr<std::vector<ChainStepPlan>> PlanChain(ServiceContext& ctx, absl::string_view client,
                                                     const v1::ChainRequest& request,
                                                     std::vector<ResolvedRef>* refs) {
  if (request.steps().empty()) return absl::InvalidArgumentError("a chain needs at least one step");
  if (request.steps_size() > static_cast<int>(kMaxChainSteps)) {
    return absl::InvalidArgumentError(absl::StrCat("the chain has ", request.steps_size(),
                                                   " steps; at most ", kMaxChainSteps,
                                                   " are allowed"));
  }
  std::vector<ChainStepPlan> steps;
  steps.reserve(request.steps_size());
  absl::flat_hash_map<std::string, size_t> index;
  for (const v1::ChainStep& step : request.steps()) {
    const size_t i = steps.size();
    if (absl::Status s = CheckTag(step.tag()); !s.ok()) return StepError(i, step.tag(), s);
    if (index.contains(step.tag())) {
      return StepError(i, step.tag(),
                       absl::InvalidArgumentError("its tag is already used by an earlier step"));
    }
    std::vector<std::string> dep_tags;
    absl::StatusOr<Plan> plan = PlanTagged(
        ctx, client, step.op(),
        [&](absl::string_view tag) -> absl::StatusOr<BufferHandle> {
          auto it = index.find(tag);
          if (it == index.end()) return UnknownTagError(tag);
          return steps[it->second].written;
        },
        &dep_tags, refs);
    if (!plan.ok()) return StepError(i, step.tag(), plan.status());
    ChainStepPlan& planned = steps.emplace_back();
    planned.tag = step.tag();
    planned.stream_id = step.op().stream_id().empty() ? request.stream_id() : step.op().stream_id();
    planned.written = WrittenBuffer(*plan);
    planned.plan = *std::move(plan);
    for (const std::string& tag : dep_tags) planned.deps.push_back(index.at(tag));
    index.emplace(step.tag(), i);
  }
  absl::flat_hash_set<std::string> keep;
  for (const std::string& tag : request.keep()) {
    if (!index.contains(tag)) {
      return absl::InvalidArgumentError(
          absl::StrCat("keep names tag '", tag, "', which no step has"));
    }
    keep.insert(tag);
  }
  for (ChainStepPlan& step : steps) {
    BufferHandle& created = step.plan.created;
    if (created == nullptr) continue;
    if (created->name.empty() && !keep.contains(step.tag)) {
      step.temporary = true;
      created = nullptr;
    } else {
      step.kept = created;
    }
  }
  return steps;
}

// Takes the names of the buffers the chain keeps, all or none.
absl::Status ReserveAll(ServiceContext& ctx, const std::vector<ChainStepPlan>& steps) {
  for (size_t i = 0; i < steps.size(); ++i) {
    absl::Status s = ReserveCreated(ctx, steps[i].plan);
    if (s.ok()) continue;
    for (size_t j = 0; j < i; ++j) {
      if (steps[j].kept != nullptr) ctx.registry.Unreserve(steps[j].kept);
    }
    return StepError(i, steps[i].tag, s);
  }
  return absl::OkStatus();
}

// A chain in flight: its steps' operations, answered once the last is done. The answer
// is built as a message and written to the call's raw response at the end.
struct ChainRun {
  ChainRun(ServiceContext& ctx, grpc::ByteBuffer* raw_response)
      : ctx(ctx), raw_response(raw_response) {}

  ServiceContext& ctx;
  std::vector<ChainStepPlan> steps;
  std::vector<std::shared_ptr<Operation>> ops;
  std::atomic<size_t> remaining{0};
  v1::ChainResponse response;
  grpc::ByteBuffer* const raw_response;
  std::shared_ptr<DeferredReactor::State> reactor;

  void Answer() {
    DeferredReactor::FinishOnce(reactor, [&] {
      std::vector<absl::Status> errors(steps.size());
      for (size_t i = 0; i < steps.size(); ++i) {
        v1::Operation* op = response.mutable_steps(i)->mutable_operation();
        const OperationStatus& status = Executor::FinalStatus(*ops[i]);
        ToProtoOutcome(status, op);
        ReportStepLeases(steps[i], status, op);
        for (size_t d : steps[i].deps) {
          if (errors[d].ok()) continue;
          MarkFailed(FailedDependencyError(steps[d].tag, errors[d]), op);
          break;
        }
        errors[i] = OperationError(*op);
      }
      // The temporaries go with the last handles: the plans' and the operations'.
      ops.clear();
      steps.clear();
      *raw_response = wire::Serialize(response);
      return grpc::Status::OK;
    });
  }
};

// Runs `chain` once, answered when it is done; `planned`: planned for this call (its
// compile time is reported). The executor's refusal (the stream gone, the quota,
// shutdown) is returned, and then nothing ran.
absl::StatusOr<grpc::ServerUnaryReactor*> RunPrepared(ServiceContext& ctx, const Caller& caller,
                                                      std::shared_ptr<PreparedChain> chain,
                                                      bool planned, grpc::ByteBuffer* raw_response) {
  auto results = std::make_shared<std::vector<OpResult>>(chain->size());
  ASSIGN_OR_RETURN(std::shared_ptr<Operation> op,
                   ctx.executor.Submit(caller.scope, chain->stream_id(),
                                       chain->Spec(chain, results)));
  auto* reactor = new DeferredReactor(caller.admission);
  // The chain stays alive until its run is done, its temporaries and recordings with it,
  // even if the cache forgets it meanwhile.
  ctx.executor.OnDone(op, [state = reactor->state(), chain = std::move(chain),
                           results = std::move(results), op, planned, raw_response] {
    DeferredReactor::FinishOnce(state, [&] {
      *raw_response = wire::FromBytes(chain->EncodeAnswer(*op, *results, planned));
      return grpc::Status::OK;
    });
  });
  return reactor;
}

// The caller's scope, a NUL, then the request's bytes: what a chain kept to run again is
// known by (ChainCache).
std::string ChainKey(absl::string_view scope, const grpc::ByteBuffer& request) {
  std::string key;
  key.reserve(scope.size() + 1 + request.Length());
  key.append(scope.data(), scope.size());
  key.push_back('\0');
  std::vector<grpc::Slice> slices;
  if (request.Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) {
      key.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  return key;
}

// RunChainCall's work, on the warm lane: the call's reactor, or the error to answer at
// once.
absl::StatusOr<grpc::ServerUnaryReactor*> StartChain(ServiceContext& ctx,
                                                     grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* raw_request,
                                                     grpc::ByteBuffer* raw_response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx, *context);
  if (!caller.ok()) return caller.status();
  if (absl::Status s = CheckBackendHealthy(ctx.backend); !s.ok()) return s;
  // A chain run before is known by its bytes, before they are parsed. Those of a request
  // too large to keep are parsed where gRPC holds them.
  ChainCache& cache = *ctx.chains;
  const bool keepable = raw_request->Length() <= ChainCache::kMaxRequestBytes;
  const std::string key = keepable ? ChainKey(caller->scope, *raw_request) : std::string();
  if (keepable) {
    if (std::shared_ptr<PreparedChain> chain = cache.Find(key, caller->scope)) {
      absl::StatusOr<grpc::ServerUnaryReactor*> reactor =
          RunPrepared(ctx, *caller, std::move(chain), false, raw_response);
      if (reactor.ok()) return *reactor;
      // Refused: planned afresh below, which names the step refused.
    }
  }
  v1::ChainRequest request;
  const absl::Status parsed =
      keepable ? wire::Parse(std::string_view(key).substr(caller->scope.size() + 1), &request)
               : wire::Parse(*raw_request, &request);
  if (!parsed.ok()) return parsed;
  std::vector<ResolvedRef> refs;
  absl::StatusOr<std::vector<ChainStepPlan>> steps = PlanChain(ctx, caller->scope, request, &refs);
  if (!steps.ok()) return steps.status();
  auto run = std::make_shared<ChainRun>(ctx, raw_response);
  v1::ChainResponse* response = &run->response;
  run->steps = *std::move(steps);
  std::vector<Executor::SubmitItem> items;
  items.reserve(run->steps.size());
  for (ChainStepPlan& step : run->steps) {
    if (request.separate_launches()) step.plan.spec.capturable = false;
    items.push_back({step.stream_id, &step.plan.spec});
  }
  // A step the executor would refuse (a stream that is not the caller's, the quota)
  // rejects the chain whole, as an invalid one does.
  size_t refused = 0;
  if (absl::Status s = ctx.executor.CheckSubmitAll(caller->scope, items, &refused); !s.ok()) {
    return StepError(refused, run->steps[refused].tag, s);
  }
  // Seen before, unchanged: kept from now on, if it may be.
  if (keepable && cache.SeenBefore(key) &&
      PreparedChain::Preparable(run->steps, ChainCache::kMaxTemporaryBytes).ok()) {
    auto chain = std::make_shared<PreparedChain>(run->steps, std::move(refs),
                                                 run->steps.front().stream_id,
                                                 ctx.executor.capture_min_ops());
    run->steps.clear();
    absl::StatusOr<grpc::ServerUnaryReactor*> reactor =
        RunPrepared(ctx, *caller, chain, true, raw_response);
    if (!reactor.ok()) return reactor.status();  // only a race
    cache.Insert(key, std::move(chain));
    return *reactor;
  }
  if (absl::Status s = ReserveAll(ctx, run->steps); !s.ok()) return s;

  auto* reactor = new DeferredReactor(caller->admission);
  run->reactor = reactor->state();
  // Queued kChainLaunchRun steps at a time, under one hold of the executor's mutex each,
  // and each run launched (recorded as one unit where it can be) before the next is
  // queued: the device works through a run while the host queues and records the next,
  // where one launch of all the steps would leave it idle until the last was recorded.
  // Each run's answers are begun before it is queued, while the device works through
  // the runs before it.
  Executor::Submitted submitted;
  for (size_t begin = 0; begin < items.size() && submitted.refused.ok();
       begin += kChainLaunchRun) {
    const size_t end = std::min(items.size(), begin + kChainLaunchRun);
    for (size_t i = begin; i < end; ++i) BeginStepResult(run->steps[i], response);
    Executor::LaunchBatch batch(ctx.executor);
    Executor::Submitted part = ctx.executor.SubmitAll(
        caller->scope, std::span(items).subspan(begin, end - begin));
    for (size_t k = 0; k < part.operations.size(); ++k) {
      v1::Operation* op = response->mutable_steps(begin + k)->mutable_operation();
      op->set_id(part.operations[k]->id());
      op->set_stream_id(part.operations[k]->stream_id());
    }
    submitted.operations.insert(submitted.operations.end(),
                                std::make_move_iterator(part.operations.begin()),
                                std::make_move_iterator(part.operations.end()));
    submitted.refused = std::move(part.refused);
  }
  const size_t queued = submitted.operations.size();
  // Published only once their writers are queued (SubmitReserved says why).
  for (size_t i = 0; i < queued; ++i) {
    if (run->steps[i].kept != nullptr) ctx.registry.Publish(run->steps[i].kept);
  }
  if (!submitted.refused.ok()) {
    // Only a race gets here (a stream deleted since CheckSubmitAll, the quota taken by
    // the client's other calls, shutdown): the steps queued before this one run, and
    // nothing after it does.
    for (size_t j = queued; j < run->steps.size(); ++j) {
      if (run->steps[j].kept != nullptr) ctx.registry.Unreserve(run->steps[j].kept);
    }
    DeferredReactor::FinishOnce(run->reactor, [&] {
      return ToGrpcStatus(StepError(queued, run->steps[queued].tag, submitted.refused));
    });
    return reactor;
  }
  run->ops = std::move(submitted.operations);
  // Operations on one stream finish in order, so the chain is done once the last
  // operation on each of its streams is. Picked first: a callback may answer (and clear
  // ops) while the second loop runs.
  std::vector<std::shared_ptr<Operation>> lasts;
  for (size_t i = run->ops.size(); i-- > 0;) {
    const std::string& stream = run->ops[i]->stream_id();
    if (std::none_of(lasts.begin(), lasts.end(), [&](const std::shared_ptr<Operation>& op) {
          return op->stream_id() == stream;
        })) {
      lasts.push_back(run->ops[i]);
    }
  }
  run->remaining = lasts.size();
  for (const std::shared_ptr<Operation>& op : lasts) {
    ctx.executor.OnDone(op, [run] {
      if (run->remaining.fetch_sub(1) == 1) run->Answer();
    });
  }
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* RunChainCall(ServiceContext& ctx, grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* raw_request,
                                       grpc::ByteBuffer* raw_response) {
  absl::StatusOr<grpc::ServerUnaryReactor*> reactor;
  ctx.lane->Run([&] { reactor = StartChain(ctx, context, raw_request, raw_response); });
  return reactor.ok() ? *reactor : FinishNow(context, reactor.status());
}

}  // namespace gpucompute
