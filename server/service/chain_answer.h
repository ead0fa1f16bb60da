// The answer of a prepared chain's runs (a ChainResponse), written straight to the wire.
// Built as messages and serialized, the answer of a run of 100 small steps costs the
// host more than launching the run: the copies, strings and encoding add up, after the
// device is done, while the caller waits.
//
// So what does not change from run to run, each step's tag, kind, outputs and traffic,
// is encoded once, when the chain is prepared. The outputs' leases do change: each run
// reads them when it answers (an atomic load each) and encodes them after the rest of
// their output, as GetBuffer reports them. A run encodes what is its own once: its
// id and stream in the answer's own fields (ChainResponse.operation_id), which the
// steps leave empty; its state, error and queueing time, the same for every step; and
// each distinct timing (a step's share of the device time and the rates that follow
// depend only on its traffic). Then each step's values.
// The bytes are the ordinary encoding of the ChainResponse that ToProtoOutcome would
// fill, but for the run's id and stream given once, with some fields in another order,
// which protobuf parsers read the same.
#ifndef GPUCOMPUTE_SERVER_SERVICE_CHAIN_ANSWER_H_
#define GPUCOMPUTE_SERVER_SERVICE_CHAIN_ANSWER_H_

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpucompute/v1/gpucompute.pb.h"
#include "server/core/buffer_registry.h"
#include "server/core/executor.h"

namespace gpucompute {

struct ChainStepPlan;

class ChainAnswer {
 public:
  // For `steps` as planned, in the request's order.
  explicit ChainAnswer(const std::vector<ChainStepPlan>& steps);

  // The answer of finished `run`, one operation that stood for every step, whose
  // launches left step i's results in results[i]; with each step's compile time where
  // `planned` (planned for the call that ran it).
  std::string Encode(const OperationStatus& run, std::span<const OpResult> results,
                     bool planned) const;

 private:
  // An output a step reports, all but its lease, and the lease, read at each answer.
  struct Output {
    std::string info;  // BufferInfo
    // Of its buffer, which the chain's run holds anyway; null: none to report.
    std::shared_ptr<const Lease> lease;
  };
  struct Step {
    std::string result;     // ChainStepResult: its tag
    std::string operation;  // Operation: its kind
    std::vector<Output> outputs;
    size_t timing = 0;  // its index in timings_
  };
  std::vector<Step> steps_;
  size_t outputs_ = 0;  // of all the steps
  // Each distinct Timing template of the steps (traffic, compile time and
  // graph_operations), encoded once per run: the steps share the run's device time
  // evenly, so steps of the same traffic (most of a chain of small steps) have the same
  // timing bytes. The compile time is reported only by the run planned for its call.
  std::vector<v1::Timing> timings_;
  size_t encoded_size_ = 0;  // of the fields encoded once, for the answer's reserve
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_CHAIN_ANSWER_H_
