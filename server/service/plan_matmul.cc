#include "server/service/plan_matmul.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/backend.h"
#include "server/service/array_refs.h"
#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

constexpr char kSignature[] = "(n?,k),(k,m?)->(n?,m?)";
constexpr char kCopyFirst[] = "copy it first (an elementwise 'x' into a new buffer)";

// An operand as a stack of matrices: op() applied, a 1-D operand promoted (a row for A,
// a column for B, with stride 0 on the added axis).
struct MatrixStack {
  bool has_batch = false;
  bool is_vector = false;
  int64_t batch = 1;
  int64_t rows = 0;
  int64_t cols = 0;
  MatrixLayout layout;
};

MatrixStack Stack(const StridedLayout& l, bool transpose, bool is_a) {
  MatrixStack s;
  s.layout.offset = l.offset;
  const int nd = l.ndim();
  if (nd == 1) {
    s.is_vector = true;
    if (is_a) {
      s.rows = 1;
      s.cols = l.shape[0];
      s.layout.col_stride = l.strides[0];
    } else {
      s.rows = l.shape[0];
      s.cols = 1;
      s.layout.row_stride = l.strides[0];
    }
    return s;
  }
  s.rows = l.shape[nd - 2];
  s.cols = l.shape[nd - 1];
  s.layout.row_stride = l.strides[nd - 2];
  s.layout.col_stride = l.strides[nd - 1];
  if (transpose) {
    std::swap(s.rows, s.cols);
    std::swap(s.layout.row_stride, s.layout.col_stride);
  }
  if (nd == 3) {
    s.has_batch = true;
    s.batch = l.shape[0];
    s.layout.batch_stride = s.batch == 1 ? 0 : l.strides[0];
  }
  return s;
}

// Whether BLAS can read the matrices as they lie: a unit stride on one axis, and a
// leading dimension that steps over the whole of that axis (MatrixLayout).
bool BlasReadable(const MatrixStack& s) {
  const int64_t rs = s.layout.row_stride;
  const int64_t cs = s.layout.col_stride;
  const bool column_major =
      (s.rows <= 1 || rs == 1) && (s.cols <= 1 || cs >= std::max<int64_t>(s.rows, 1));
  const bool row_major =
      (s.cols <= 1 || cs == 1) && (s.rows <= 1 || rs >= std::max<int64_t>(s.cols, 1));
  return (column_major || row_major) && (s.batch <= 1 || s.layout.batch_stride >= 0);
}

absl::Status CheckReadable(const MatrixStack& s, absl::string_view what, const ArrayRef& array) {
  if ((s.rows > 1 && s.layout.row_stride == 0) || (s.cols > 1 && s.layout.col_stride == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", DescribeArray(array),
        " repeats elements along an axis of its matrices (a broadcast view, stride 0), which "
        "BLAS cannot read: ",
        kCopyFirst));
  }
  if (!BlasReadable(s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", DescribeArray(array), " has matrices with strides (", s.layout.row_stride,
        ", ", s.layout.col_stride,
        ") in elements; BLAS needs a unit stride on one of their two axes and a positive "
        "stride on the other, at least the first's extent: ",
        kCopyFirst));
  }
  return absl::OkStatus();
}

std::string BothOperands(const ArrayRef& a, const ArrayRef& b) {
  return absl::StrCat("; operand 'a' is ", DescribeArray(a), ", operand 'b' is ",
                      DescribeArray(b));
}

absl::Status CheckOperand(const ArrayRef& x, absl::string_view name, int index, bool transpose) {
  const std::string what = absl::StrCat("matmul operand '", name, "' ", DescribeArray(x));
  if (!IsFloat(x.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be float32 or float64"));
  }
  if (x.layout.ndim() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "matmul: Input operand ", index,
        " does not have enough dimensions (has 0, gufunc core with signature ", kSignature,
        " requires 1): ", what));
  }
  if (x.layout.ndim() > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", x.layout.ndim(), " dimensions; matmul takes 1 to 3"));
  }
  if (transpose && x.layout.ndim() == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("transpose_", name, " needs a matrix, but ", what, " is 1-D"));
  }
  return absl::OkStatus();
}

// The elements of an operand the product reads: a matrix repeated over the batch
// (batch stride 0) is read once.
uint64_t ElementsRead(const MatrixStack& s) {
  const int64_t matrices = s.batch == 0 ? 0 : (s.layout.batch_stride == 0 ? 1 : s.batch);
  return static_cast<uint64_t>(matrices) * static_cast<uint64_t>(s.rows) *
         static_cast<uint64_t>(s.cols);
}

uint64_t Flops(const MatmulShape& s) {
  // 2 m n k per matrix; saturates rather than wraps for the (empty-free) extremes.
  const unsigned __int128 flops = static_cast<unsigned __int128>(2) * s.batch * s.m * s.n * s.k;
  return flops > std::numeric_limits<uint64_t>::max() ? std::numeric_limits<uint64_t>::max()
                                                      : static_cast<uint64_t>(flops);
}

}  // namespace

absl::StatusOr<MatrixLayout> BlasMatrix(const ArrayRef& array, absl::string_view what) {
  const MatrixStack s = Stack(array.layout, /*transpose=*/false, /*is_a=*/true);
  RETURN_IF_ERROR(CheckReadable(s, what, array));
  return s.layout;
}

absl::StatusOr<Plan> PlanMatmul(ServiceContext& ctx, absl::string_view client,
                                BufferResolver resolve, const v1::MatmulOp& op) {
  ASSIGN_OR_RETURN(ArrayRef a, ResolveArray(resolve, "matmul operand 'a'", op.a(), op.a_view()));
  ASSIGN_OR_RETURN(ArrayRef b, ResolveArray(resolve, "matmul operand 'b'", op.b(), op.b_view()));
  RETURN_IF_ERROR(CheckOperand(a, "a", 0, op.transpose_a()));
  RETURN_IF_ERROR(CheckOperand(b, "b", 1, op.transpose_b()));
  const DType dtype = a.dtype();
  if (b.dtype() != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("matmul operands must have one dtype", BothOperands(a, b)));
  }
  if (op.allow_tf32() && dtype != DType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allow_tf32 applies to float32 operands only; these are ", DTypeName(dtype)));
  }
  if (a.buffer->device != b.buffer->device) {
    return absl::InvalidArgumentError(absl::StrCat("matmul operands are on devices ",
                                                   a.buffer->device, " and ", b.buffer->device,
                                                   BothOperands(a, b)));
  }

  MatrixStack sa = Stack(a.layout, op.transpose_a(), /*is_a=*/true);
  MatrixStack sb = Stack(b.layout, op.transpose_b(), /*is_a=*/false);
  if (sa.cols != sb.rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc "
                     "signature ",
                     kSignature, " (size ", sb.rows, " is different from ", sa.cols, ")",
                     BothOperands(a, b)));
  }
  if (sa.has_batch && sb.has_batch && sa.batch != sb.batch && sa.batch != 1 && sb.batch != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "matmul: operands could not be broadcast together in their batch dimension (", sa.batch,
        " and ", sb.batch, ")", BothOperands(a, b)));
  }
  RETURN_IF_ERROR(CheckReadable(sa, "matmul operand 'a'", a));
  RETURN_IF_ERROR(CheckReadable(sb, "matmul operand 'b'", b));

  MatmulShape shape;
  shape.batch = std::max(sa.batch, sb.batch);
  shape.m = sa.rows;
  shape.n = sb.cols;
  shape.k = sa.cols;
  shape.a = sa.layout;
  shape.b = sb.layout;
  shape.allow_tf32 = op.allow_tf32();
  const bool has_batch = sa.has_batch || sb.has_batch;
  std::vector<uint64_t> out_shape;
  if (has_batch) out_shape.push_back(static_cast<uint64_t>(shape.batch));
  if (!sa.is_vector) out_shape.push_back(static_cast<uint64_t>(shape.m));
  if (!sb.is_vector) out_shape.push_back(static_cast<uint64_t>(shape.n));

  if (!op.c().view().empty()) {
    return absl::InvalidArgumentError(
        "output.view applies to elementwise operations; matmul writes a whole buffer c");
  }
  // An existing 2-D C may be of either layout (BLAS writes either); a new one is C-ordered.
  Layout layout = Layout::kC;
  if (!op.c().buffer().empty() && out_shape.size() == 2) {
    absl::StatusOr<BufferHandle> existing = resolve(op.c().buffer());
    if (existing.ok()) layout = (*existing)->layout;
  }
  Plan plan;
  bool created = false;
  ASSIGN_OR_RETURN(BufferHandle c, ResolveOutput(ctx, client, resolve, op.c(), dtype, out_shape,
                                                 layout, a.buffer->device, CastRule::kExact,
                                                 &created));
  if (c == a.buffer || c == b.buffer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "matmul output c must not be the buffer of operand '", c == a.buffer ? "a" : "b",
        "' (BLAS would read what it writes): write to another buffer"));
  }
  if (!created && c->device != a.buffer->device) {
    return absl::InvalidArgumentError(absl::StrCat("matmul output c is on device ", c->device,
                                                   ", the operands on device ", a.buffer->device));
  }
  {
    // C's layout in the (batch, m, n) space, with stride 0 on the axes the result drops.
    const StridedLayout cl = BufferLayout(*c);
    int d = cl.ndim();
    shape.c.col_stride = sb.is_vector ? 0 : cl.strides[--d];
    shape.c.row_stride = sa.is_vector ? 0 : cl.strides[--d];
    shape.c.batch_stride = has_batch && shape.batch > 1 ? cl.strides[--d] : 0;
  }
  const double alpha = op.has_alpha() ? op.alpha() : 1.0;
  const double beta = created ? 0.0 : op.beta();
  if (created) plan.created = c;

  Executor::OpSpec& spec = plan.spec;
  spec.kind = OperationKind::kMatmul;
  spec.accesses.push_back({a.buffer, false});
  if (b.buffer != a.buffer) spec.accesses.push_back({b.buffer, false});
  spec.accesses.push_back({c, true});
  const uint64_t element = DTypeSize(dtype);
  spec.bytes_read =
      (ElementsRead(sa) + ElementsRead(sb)) * element + (beta != 0 ? c->size_bytes() : 0);
  spec.bytes_written = c->size_bytes();
  spec.flops = Flops(shape);
  spec.outputs.push_back(*c);
  spec.launch = [&backend = ctx.backend, a = a.buffer, b = b.buffer, c = c, dtype, shape, alpha,
                 beta](Stream& stream, OpResult&) -> absl::StatusOr<LaunchInfo> {
    return backend.Matmul(stream, dtype, shape, alpha, a->memory, b->memory, beta, c->memory);
  };
  return plan;
}

}  // namespace gpucompute
