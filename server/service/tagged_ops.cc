#include "server/service/tagged_ops.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gpucompute/v1/limits.h"

namespace gpucompute {

absl::Status CheckTag(absl::string_view tag) {
  if (tag.empty()) return absl::InvalidArgumentError("every operation needs a tag");
  if (tag.size() > kMaxTagBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tag is ", tag.size(), " bytes; at most ", kMaxTagBytes, " are allowed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Plan> PlanTagged(ServiceContext& ctx, absl::string_view client,
                                const v1::SubmitRequest& request, TagFinder find_tag,
                                std::vector<std::string>* deps,
                                std::vector<ResolvedRef>* refs) {
  return PlanOperation(
      ctx, client, request, [&](absl::string_view ref) -> absl::StatusOr<BufferHandle> {
        if (!absl::StartsWith(ref, kTagPrefix)) {
          absl::StatusOr<BufferHandle> buffer = ctx.registry.Lookup(client, ref);
          if (refs != nullptr && buffer.ok()) refs->push_back({std::string(ref), *buffer});
          return buffer;
        }
        const absl::string_view tag = ref.substr(sizeof(kTagPrefix) - 1);
        if (std::find(deps->begin(), deps->end(), tag) == deps->end()) deps->emplace_back(tag);
        return find_tag(tag);
      });
}

absl::Status UnknownTagError(absl::string_view tag) {
  return absl::InvalidArgumentError(
      absl::StrCat("tag '", tag, "' names no earlier operation of this session or chain"));
}

absl::Status FailedDependencyError(absl::string_view tag, const absl::Status& cause) {
  return absl::FailedPreconditionError(
      absl::StrCat("depends on tag '", tag, "', which failed: ", cause.message()));
}

absl::Status OperationError(const v1::Operation& op) {
  if (op.state() != v1::Operation::STATE_FAILED) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(op.error_code()), op.error_message());
}

v1::OperationKind RequestKind(const v1::SubmitRequest& request) {
  switch (request.op_case()) {
    case v1::SubmitRequest::kElementwise:
      return v1::OPERATION_KIND_ELEMENTWISE;
    case v1::SubmitRequest::kGemv:
      return v1::OPERATION_KIND_GEMV;
    case v1::SubmitRequest::kReduce:
      return v1::OPERATION_KIND_REDUCE;
    case v1::SubmitRequest::kRandom:
      return v1::OPERATION_KIND_RANDOM;
    case v1::SubmitRequest::kMatmul:
      return v1::OPERATION_KIND_MATMUL;
    case v1::SubmitRequest::OP_NOT_SET:
      break;
  }
  return v1::OPERATION_KIND_UNSPECIFIED;
}

void MarkFailed(const absl::Status& status, v1::Operation* op) {
  op->set_state(v1::Operation::STATE_FAILED);
  op->set_done(true);
  op->set_error_code(static_cast<int32_t>(status.code()));
  op->set_error_message(std::string(status.message()));
  op->clear_values();
}

}  // namespace gpucompute
