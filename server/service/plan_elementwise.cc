#include "server/service/plan_elementwise.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/expression/expression.h"
#include "server/service/array_refs.h"
#include "server/service/expression_operands.h"
#include "server/tenancy/request_limits.h"
#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

using ArrayOperands = std::map<std::string, ArrayOperand, std::less<>>;


// The layout of a new output: a whole buffer of the result's shape, C-ordered unless every
// operand is a whole buffer of that shape in one layout (then that one, as before views).
Layout NewOutputLayout(const ArrayOperands& arrays,
                       const std::vector<int64_t>& shape) {
  if (arrays.empty()) return Layout::kC;
  const Layout first = arrays.begin()->second.array.buffer->layout;
  for (const auto& [name, operand] : arrays) {
    if (!operand.array.IsWholeBuffer() || operand.array.layout.shape != shape ||
        operand.array.buffer->layout != first) {
      return Layout::kC;
    }
  }
  return first;
}

// An output written through a view may not write one element twice, nor overlap an input
// in a way that makes the result depend on the order of the writes.
absl::Status CheckOutputAliasing(const ArrayRef& out,
                                 const ArrayOperands& arrays) {
  if (out.layout.HasBroadcast()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output ", DescribeArray(out),
        " broadcasts (stride 0 on an axis longer than 1): it may be read, not written"));
  }
  for (const auto& [name, operand] : arrays) {
    if (operand.array.buffer != out.buffer) continue;
    if (CompareOverlap(out.layout, operand.broadcast) == Overlap::kPartial) {
      return absl::InvalidArgumentError(absl::StrCat(
          "output view ", DescribeArray(out), " overlaps input '", name, "' ",
          DescribeArray(operand.array),
          " only partly; NumPy's result would depend on the order of the writes (write to a "
          "new buffer, or through exactly the input's view)"));
    }
  }
  return absl::OkStatus();
}

// Every index(k) must name an axis of the result.
absl::Status CheckIndexAxes(const expr::Program& program, const std::vector<int64_t>& shape) {
  const auto rank = static_cast<int64_t>(shape.size());
  for (int64_t k : expr::IndexAxes(program.ir())) {
    if (k >= -rank && k < rank) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "index(", k, ") names no axis of the result, which has rank ", rank, " (shape ",
        NumpyShape(shape), ")",
        rank == 0 ? "; give ElementwiseOp.shape for a result with axes"
                  : absl::StrCat(": k must be from ", -rank, " to ", rank - 1)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Plan> PlanElementwise(ServiceContext& ctx, absl::string_view client,
                                     BufferResolver resolve, const v1::ElementwiseOp& op) {
  ASSIGN_OR_RETURN(ExpressionOperands operands,
                   CompileOperands(ctx, resolve, op.expression(), op.inputs(),
                                   op.has_shape() ? &op.shape() : nullptr));
  expr::Program& program = operands.program;
  const ArrayOperands& arrays = operands.arrays;
  const std::vector<int64_t>& shape = operands.shape;
  RETURN_IF_ERROR(CheckIndexAxes(program, shape));
  // index() reads coordinates, which only the strided kernels compute, along the
  // result's own axes: no flat pass, no coalescing.
  const bool indexed = !expr::IndexAxes(program.ir()).empty();

  const int device =
      arrays.empty() ? ctx.executor.default_device() : arrays.begin()->second.array.buffer->device;
  Plan plan;
  bool created = false;
  ArrayRef out;
  ASSIGN_OR_RETURN(out.buffer,
                   ResolveOutput(ctx, client, resolve, op.output(), program.result_dtype(),
                                 std::vector<uint64_t>(shape.begin(), shape.end()),
                                 NewOutputLayout(arrays, shape), device, CastRule::kSameKind,
                                 &created, &out.layout));
  RETURN_IF_ERROR(CheckOutputAliasing(out, arrays));

  // The flat pass, exactly as before views: the same kernels and compiled-kernel keys.
  bool flat = out.IsWholeBuffer() && !indexed;
  for (const auto& [name, operand] : arrays) {
    flat = flat && operand.array.IsWholeBuffer() && operand.array.layout == out.layout;
  }
  double compile_seconds = 0;
  if (flat) {
    // Compiling may take long, so it happens here, outside the executor's lock. On error
    // the output this call allocated (not yet registered) is freed with `out`.
    ASSIGN_OR_RETURN(compile_seconds, ctx.backend.PrepareElementwise(program, out.dtype()));
  }
  if (created) plan.created = out.buffer;

  Executor::OpSpec& spec = plan.spec;
  spec.kind = OperationKind::kElementwise;
  spec.compile_seconds = compile_seconds;
  // Traffic: each distinct view read once (ExpressionOperands::distinct_bytes), and the
  // output's elements written.
  spec.bytes_read = operands.distinct_bytes;
  for (const auto& [name, operand] : arrays) {
    const ArrayRef& a = operand.array;
    // The executor orders on base buffers; one both read and written is listed once, as
    // the write.
    const bool listed =
        a.buffer == out.buffer ||
        std::any_of(spec.accesses.begin(), spec.accesses.end(),
                    [&](const Executor::Access& access) { return access.buffer == a.buffer; });
    if (!listed) spec.accesses.push_back({a.buffer, false});
  }
  spec.accesses.push_back({out.buffer, true});
  const auto n = static_cast<uint64_t>(out.layout.num_elements());
  spec.bytes_written = n * DTypeSize(out.dtype());
  spec.flops = static_cast<uint64_t>(program.ops_per_element()) * n;
  spec.outputs.push_back(*out.buffer);
  // One kernel; index() coordinates may be copied to the device first (host work).
  spec.capturable = !indexed;

  // Per program input: the buffer and the layout it is read through (null for scalars).
  std::vector<BufferHandle> buffers;
  std::vector<StridedLayout> layouts;
  for (const std::string& name : program.inputs()) {
    auto it = arrays.find(name);
    buffers.push_back(it == arrays.end() ? nullptr : it->second.array.buffer);
    layouts.push_back(it == arrays.end() ? StridedLayout{} : it->second.broadcast);
  }
  if (flat) {
    spec.launch = [&backend = ctx.backend, program = std::move(program),
                   buffers = std::move(buffers), out = out.buffer,
                   n](Stream& stream, OpResult&) -> absl::StatusOr<LaunchInfo> {
      std::vector<const DeviceMemory*> memories;
      for (const BufferHandle& b : buffers) memories.push_back(b == nullptr ? nullptr : &b->memory);
      return backend.Elementwise(stream, program, memories, out->memory, out->dtype,
                                 static_cast<int64_t>(n));
    };
    return plan;
  }
  StridedLayout out_layout = out.layout;
  std::vector<StridedLayout*> all;
  for (size_t k = 0; k < layouts.size(); ++k) {
    if (buffers[k] != nullptr) all.push_back(&layouts[k]);
  }
  all.push_back(&out_layout);
  if (!indexed) CoalesceAxes(all);
  spec.launch = [&backend = ctx.backend, program = std::move(program), buffers = std::move(buffers),
                 layouts = std::move(layouts), out = out.buffer,
                 out_layout = std::move(out_layout)](
                    Stream& stream, OpResult&) -> absl::StatusOr<LaunchInfo> {
    std::vector<StridedInput> inputs;
    for (size_t k = 0; k < buffers.size(); ++k) {
      inputs.push_back({buffers[k] == nullptr ? nullptr : &buffers[k]->memory, layouts[k]});
    }
    return backend.ElementwiseStrided(stream, program, inputs, out->memory, out_layout,
                                      out->dtype);
  };
  return plan;
}

}  // namespace gpucompute
