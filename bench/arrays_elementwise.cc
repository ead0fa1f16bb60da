// The arrays section's elementwise rows (bench/arrays.h): x - m with m broadcast as a
// column (n,1), a row (1,m) and a 0-d array, against the copy; and one operation on a
// transposed view and on a ::2 slice, against the same operation on contiguous data.
// Through the Backend API, with the layouts PlanElementwise passes (broadcast, then
// coalesced).
//
// x is float32 (2^(log2n-15), 32768): (8192, 32768) at --log2n=28, a GPU's size, and
// (512, 32768) at the default 24, which the CPU runs in well under a minute.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/arrays.h"
#include "server/arrays/strided_layout.h"
#include "server/expression/expression.h"
#include "server/util/status_macros.h"

namespace gpucompute::bench {
namespace {

constexpr int64_t kCols = 32768;

struct Array {
  const DeviceMemory* memory = nullptr;
  StridedLayout layout;
};

// Median device seconds of program(inputs) into a new C-ordered array of `shape`, through
// ElementwiseStrided with coalesced layouts.
absl::StatusOr<double> TimeStrided(const Options& options, Backend& backend, Stream& stream,
                                   const std::string& text, std::vector<std::pair<std::string, Array>> arrays,
                                   const std::vector<int64_t>& shape) {
  expr::InputMap types;
  for (const auto& [name, array] : arrays) types.emplace(name, expr::ArrayInput{DType::kFloat32});
  ASSIGN_OR_RETURN(expr::Program program, expr::Compile(text, types));
  std::vector<StridedLayout> layouts;
  std::vector<const DeviceMemory*> memories;
  for (const std::string& name : program.inputs()) {
    for (const auto& [n, array] : arrays) {
      if (n != name) continue;
      ASSIGN_OR_RETURN(StridedLayout b, BroadcastToView(array.layout, shape, 8));
      layouts.push_back(std::move(b));
      memories.push_back(array.memory);
    }
  }
  StridedLayout out_layout = DenseLayout(std::vector<uint64_t>(shape.begin(), shape.end()), false);
  ASSIGN_OR_RETURN(DeviceMemory out,
                   backend.Allocate(0, static_cast<uint64_t>(out_layout.num_elements()) * 4));
  std::vector<StridedLayout*> all;
  for (StridedLayout& l : layouts) all.push_back(&l);
  all.push_back(&out_layout);
  CoalesceAxes(all);
  std::vector<StridedInput> inputs;
  for (size_t k = 0; k < layouts.size(); ++k) inputs.push_back({memories[k], layouts[k]});
  return MedianDeviceSeconds(backend, stream, options.repeat, [&] {
    return backend.ElementwiseStrided(stream, program, inputs, out, out_layout, DType::kFloat32)
        .status();
  });
}

// The same program over `n` contiguous elements, through the flat kernel.
absl::StatusOr<double> TimeContiguous(const Options& options, Backend& backend, Stream& stream,
                                      const std::string& text, const DeviceMemory& x, int64_t n) {
  expr::InputMap types = {{"x", expr::ArrayInput{DType::kFloat32}}};
  ASSIGN_OR_RETURN(expr::Program program, expr::Compile(text, types));
  RETURN_IF_ERROR(backend.PrepareElementwise(program, DType::kFloat32).status());
  ASSIGN_OR_RETURN(DeviceMemory out, backend.Allocate(0, static_cast<uint64_t>(n) * 4));
  const DeviceMemory* inputs[] = {&x};
  return MedianDeviceSeconds(backend, stream, options.repeat, [&] {
    return backend.Elementwise(stream, program, inputs, out, DType::kFloat32, n).status();
  });
}

}  // namespace

absl::Status AppendElementwiseRows(const Options& options, Backend& backend, Stream& stream,
                                   std::vector<ArraysRow>& rows) {
  const int64_t r = int64_t{1} << std::max(0, options.log2n - 15);
  const int64_t n = r * kCols;
  const std::string size = absl::StrCat(r, "x", kCols);
  const std::vector<int64_t> shape = {r, kCols};
  ASSIGN_OR_RETURN(DeviceMemory x, backend.Allocate(0, static_cast<uint64_t>(n) * 4));
  ASSIGN_OR_RETURN(DeviceMemory m, backend.Allocate(0, static_cast<uint64_t>(std::max(r, kCols)) * 4));
  RETURN_IF_ERROR(backend.Fill(stream, x, DType::kFloat32, 0x3f800000, n));  // 1.0f
  RETURN_IF_ERROR(backend.Fill(stream, m, DType::kFloat32, 0x3f000000, std::max(r, kCols)));
  const Array whole{&x, DenseLayout({static_cast<uint64_t>(r), kCols}, false)};
  const double traffic = 2.0 * static_cast<double>(n) * 4;  // x read, the result written
  for (const auto& [what, m_shape] : std::vector<std::pair<std::string, std::vector<uint64_t>>>{
           {"x - m, m (n,1)", {static_cast<uint64_t>(r), 1}},
           {"x - m, m (1,m)", {1, kCols}},
           {"x - m, m 0-d", {}}}) {
    ASSIGN_OR_RETURN(double s, TimeStrided(options, backend, stream, "x - m",
                                           {{"x", whole}, {"m", {&m, DenseLayout(m_shape, false)}}},
                                           shape));
    rows.push_back({what, "float32", size, s, traffic, 0, "copy", 0, 0.95});
  }

  // The same operation on a view and on contiguous data of the view's shape.
  const std::string op = "x * 2 + 1";
  ASSIGN_OR_RETURN(double contiguous, TimeContiguous(options, backend, stream, op, x, n));
  ASSIGN_OR_RETURN(StridedLayout transposed, TransposeView(whole.layout, {}));
  ASSIGN_OR_RETURN(double t, TimeStrided(options, backend, stream, op, {{"x", {&x, transposed}}},
                                         transposed.shape));
  rows.push_back({"x.T * 2 + 1", "float32", absl::StrCat(kCols, "x", r), t, traffic, 0,
                  "contiguous", contiguous, 0});
  IndexItem all, every_other;
  every_other.step = 2;
  const IndexItem items[] = {all, every_other};
  ASSIGN_OR_RETURN(StridedLayout sliced, IndexView(whole.layout, items, 8));
  ASSIGN_OR_RETURN(double half, TimeContiguous(options, backend, stream, op, x, n / 2));
  ASSIGN_OR_RETURN(double s, TimeStrided(options, backend, stream, op, {{"x", {&x, sliced}}},
                                         sliced.shape));
  rows.push_back({"x[:, ::2] * 2 + 1", "float32", absl::StrCat(r, "x", kCols / 2), s, traffic / 2,
                  0, "contiguous", half, 0});
  return absl::OkStatus();
}

}  // namespace gpucompute::bench
