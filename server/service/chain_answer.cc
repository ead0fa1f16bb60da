#include "server/service/chain_answer.h"

#include <tuple>

#include "absl/base/casts.h"
#include "absl/container/flat_hash_map.h"
#include "common/wire_format.h"
#include "server/service/chain_replay.h"
#include "server/service/proto_conversions.h"

namespace gpucompute {
namespace {

constexpr uint32_t kStepsField = v1::ChainResponse::kStepsFieldNumber;
constexpr uint32_t kOperationField = v1::ChainStepResult::kOperationFieldNumber;
constexpr uint32_t kTimingField = v1::Operation::kTimingFieldNumber;
constexpr uint32_t kOutputsField = v1::Operation::kOutputsFieldNumber;
// The tags of BufferInfo's lease fields: a double (64-bit) and a varint.
constexpr uint64_t kTtlTag = uint64_t{v1::BufferInfo::kTtlSecondsFieldNumber} << 3 | 1;
constexpr uint64_t kExpiryTag = uint64_t{v1::BufferInfo::kLeaseExpireTimeUnixNanosFieldNumber} << 3;
// The most bytes AppendLease appends: two tags, a double and a 10-byte varint.
constexpr size_t kMaxLeaseBytes = 2 + 8 + 10;

// Appends `lease` as BufferInfo's fields, as protobuf encodes them (none at 0).
void AppendLease(const LeaseReport& lease, std::string* out) {
  if (lease.ttl_seconds != 0) {
    wire::AppendVarint(kTtlTag, out);
    const uint64_t bits = absl::bit_cast<uint64_t>(lease.ttl_seconds);
    for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(bits >> (8 * i)));
  }
  if (lease.expire_time_unix_nanos != 0) {
    wire::AppendVarint(kExpiryTag, out);
    wire::AppendVarint(static_cast<uint64_t>(lease.expire_time_unix_nanos), out);
  }
}

}  // namespace

ChainAnswer::ChainAnswer(const std::vector<ChainStepPlan>& steps) {
  v1::ChainResponse planned;
  for (const ChainStepPlan& step : steps) BeginStepResult(step, &planned);
  steps_.reserve(steps.size());
  absl::flat_hash_map<std::tuple<uint64_t, uint64_t, uint64_t, double>, size_t> timing_index;
  for (size_t i = 0; i < steps.size(); ++i) {
    v1::ChainStepResult& result = *planned.mutable_steps(static_cast<int>(i));
    const Executor::OpSpec& spec = steps[i].plan.spec;
    Step& step = steps_.emplace_back();
    // BeginStepResult reported no lease: each run reads them.
    for (const BufferMeta& m : steps[i].plan.spec.outputs) {
      if (!ReportsOutput(steps[i], m)) continue;
      Output& output = step.outputs.emplace_back();
      v1::BufferInfo info;
      ToProto(m, &info);
      output.info = info.SerializeAsString();
      output.lease = m.live_lease.lock();
      encoded_size_ += output.info.size();
    }
    outputs_ += step.outputs.size();
    result.mutable_operation()->clear_outputs();
    step.operation = result.operation().SerializeAsString();
    result.clear_operation();
    step.result = result.SerializeAsString();
    const auto [it, added] = timing_index.try_emplace(
        std::tuple(spec.bytes_read, spec.bytes_written, spec.flops, spec.compile_seconds),
        timings_.size());
    step.timing = it->second;
    if (added) {
      v1::Timing& timing = timings_.emplace_back();
      timing.set_bytes_read(spec.bytes_read);
      timing.set_bytes_written(spec.bytes_written);
      timing.set_flops(spec.flops);
      timing.set_graph_operations(static_cast<uint32_t>(steps.size()));
      timing.set_compile_seconds(spec.compile_seconds);
    }
    encoded_size_ += step.result.size() + step.operation.size();
  }
}

std::string ChainAnswer::Encode(const OperationStatus& run, std::span<const OpResult> results,
                                bool planned) const {
  // What every step shares, encoded once; the run's id and stream once in all, after
  // the steps.
  v1::Operation shared;
  shared.set_state(ToProto(run.state));
  shared.set_done(true);
  if (!run.error.ok()) SetError(run.error, &shared);
  const std::string shared_operation = shared.SerializeAsString();
  v1::Timing shared_timing;
  shared_timing.set_queued_seconds(run.timing.queued_seconds);
  shared_timing.set_device(run.device);
  const std::string shared_timing_bytes = shared_timing.SerializeAsString();
  const double share = run.timing.device_seconds / steps_.size();

  std::string out;
  // Each step: the shared fields, its timing's numbers, a few headers; each output: its
  // lease and header.
  out.reserve(encoded_size_ +
              steps_.size() * (shared_operation.size() + shared_timing_bytes.size() + 96) +
              outputs_ * (kMaxLeaseBytes + 8) + run.id.size() + run.stream_id.size() + 8);
  // The leases as they are now, read once for all the outputs.
  const LeaseClocks now = LeaseClocks::Now();
  std::string leases;        // a step's outputs' leases, encoded
  std::vector<size_t> ends;  // where each output's lease ends in `leases`
  std::vector<std::string> timings(timings_.size());
  for (size_t k = 0; k < timings_.size(); ++k) {
    v1::Timing timing = timings_[k];
    SetDeviceSeconds(share, &timing);
    if (!planned) timing.clear_compile_seconds();
    timings[k] = timing.SerializeAsString();
  }
  v1::Operation outcome;  // a step's values and random offset
  std::string outcome_bytes;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& step = steps_[i];
    const std::string& timing_bytes = timings[step.timing];
    outcome_bytes.clear();
    if (run.error.ok() && (!results[i].values.empty() || results[i].next_offset != 0)) {
      outcome.Clear();
      AppendValues(results[i], &outcome);
      outcome.set_next_offset(results[i].next_offset);
      outcome.AppendToString(&outcome_bytes);
    }
    leases.clear();
    ends.clear();
    size_t outputs_size = 0;
    for (const Output& output : step.outputs) {
      const size_t begin = leases.size();
      if (output.lease != nullptr) AppendLease(ReportLease(*output.lease, now), &leases);
      ends.push_back(leases.size());
      const size_t size = output.info.size() + leases.size() - begin;
      outputs_size += wire::EmbeddedHeaderSize(kOutputsField, size) + size;
    }
    const size_t timing_size = shared_timing_bytes.size() + timing_bytes.size();
    const size_t operation_size = shared_operation.size() + step.operation.size() + outputs_size +
                                  wire::EmbeddedHeaderSize(kTimingField, timing_size) +
                                  timing_size + outcome_bytes.size();
    const size_t result_size = step.result.size() +
                               wire::EmbeddedHeaderSize(kOperationField, operation_size) +
                               operation_size;
    wire::BeginEmbedded(kStepsField, result_size, &out);
    out += step.result;
    wire::BeginEmbedded(kOperationField, operation_size, &out);
    out += shared_operation;
    out += step.operation;
    size_t begin = 0;
    for (size_t k = 0; k < step.outputs.size(); ++k) {
      const std::string& info = step.outputs[k].info;
      wire::BeginEmbedded(kOutputsField, info.size() + ends[k] - begin, &out);
      out += info;
      out.append(leases, begin, ends[k] - begin);
      begin = ends[k];
    }
    wire::BeginEmbedded(kTimingField, timing_size, &out);
    out += shared_timing_bytes;
    out += timing_bytes;
    out += outcome_bytes;
  }
  v1::ChainResponse run_fields;
  run_fields.set_operation_id(run.id);
  run_fields.set_stream_id(run.stream_id);
  run_fields.AppendToString(&out);
  return out;
}

}  // namespace gpucompute
