#include "server/service/download_view.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/expression/expression.h"
#include "server/service/array_refs.h"
#include "server/service/operation_planner.h"
#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

// Queues the copy of `view` into `temporary` (C order) and returns it at once.
absl::StatusOr<std::shared_ptr<Operation>> QueueCopy(ServiceContext& ctx, absl::string_view client, const ArrayRef& view,
                       const BufferHandle& temporary) {
  std::map<std::string, expr::InputType, std::less<>> types;
  types.emplace("x", expr::ArrayInput{view.dtype()});
  ASSIGN_OR_RETURN(expr::Program program,
                   ctx.programs->Compile("x", types,
                                         static_cast<int>(ctx.limits.max_expression_depth)));
  StridedLayout in = view.layout;
  StridedLayout out = BufferLayout(*temporary);
  std::vector<StridedLayout*> layouts = {&in, &out};
  CoalesceAxes(layouts);
  Executor::OpSpec spec;
  spec.kind = OperationKind::kCopy;
  spec.accesses = {{view.buffer, false}, {temporary, true}};
  spec.bytes_read = temporary->size_bytes();
  spec.bytes_written = temporary->size_bytes();
  spec.outputs.push_back(*temporary);
  spec.capturable = true;  // one kernel
  spec.launch = [&backend = ctx.backend, program = std::move(program), base = view.buffer,
                 temporary, in = std::move(in),
                 out = std::move(out)](Stream& stream, OpResult&) -> absl::StatusOr<LaunchInfo> {
    const StridedInput input{&base->memory, in};
    absl::StatusOr<LaunchInfo> launched = backend.ElementwiseStrided(
        stream, program, std::span<const StridedInput>(&input, 1), temporary->memory, out,
        temporary->dtype);
    if (!launched.ok()) {
      // The temporary's memory may have held another buffer's bytes: never stream them.
      (void)backend.Fill(stream, temporary->memory, temporary->dtype, 0,
                         static_cast<int64_t>(temporary->num_elements()));
    }
    return launched;
  };
  return ctx.executor.Submit(client, "", std::move(spec));
}

}  // namespace

absl::StatusOr<DownloadSource> DownloadView(ServiceContext& ctx, absl::string_view client,
                                            const v1::DownloadRequest& request) {
  ASSIGN_OR_RETURN(ArrayRef view,
                   ResolveArray([&](absl::string_view ref) { return ctx.registry.Lookup(client, ref); },
                                "download", request.buffer(), request.view()));
  const uint64_t element = DTypeSize(view.dtype());
  // Within the buffer's bytes: a view never reaches outside its buffer.
  const uint64_t size = static_cast<uint64_t>(view.layout.num_elements()) * element;
  const uint64_t offset = request.offset_bytes();
  if (offset > size || request.size_bytes() > size - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes [", offset, ", +", request.size_bytes(), ") are outside the view of ",
                     DescribeArray(view), " of ", size, " bytes"));
  }
  DownloadSource source;
  source.size = request.size_bytes() == 0 ? size - offset : request.size_bytes();
  const std::vector<uint64_t> shape(view.layout.shape.begin(), view.layout.shape.end());
  source.view_shape = shape;
  if (view.layout.IsCContiguous()) {
    source.origin = static_cast<uint64_t>(view.layout.offset) * element;
    source.offset = source.origin + offset;
    source.named = view.buffer;
    source.buffer = std::move(view.buffer);
    return source;
  }
  ASSIGN_OR_RETURN(BufferHandle temporary,
                   ctx.registry.Allocate(client, "", view.dtype(), shape, Layout::kC,
                                         view.buffer->device));
  ASSIGN_OR_RETURN(source.producer, QueueCopy(ctx, client, view, temporary));
  source.offset = offset;
  source.buffer = std::move(temporary);
  source.named = std::move(view.buffer);
  return source;
}

}  // namespace gpucompute
