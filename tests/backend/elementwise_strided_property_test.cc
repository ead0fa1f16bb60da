// A property test of Backend::ElementwiseStrided on every backend: random base shapes (up
// to 4-D), random chains of view steps (slices with any step, integer indexes,
// transposes, expand_dims, squeeze, reshape), random broadcasting partners, and random
// non-contiguous outputs (strided, reversed and transposed, sometimes the very layout of
// an input, as x += 1 through a view), with the layouts coalesced as the planner passes
// them. Every result is checked against float64 values computed here by a brute-force
// model that walks each layout index by index; elements of the output buffer outside
// the output's view must keep their sentinel. A fixed seed and a bounded count. Part of
// the conformance suite's program, whose instantiations (CPU, and CUDA where the build
// has it) run it on every backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/arrays/strided_layout.h"
#include "server/expression/expression.h"
#include "tests/backend/backend_conformance.h"

namespace gpucompute::conformance {
namespace {

constexpr int kCases = 150;
constexpr int kMaxDims = 8;
constexpr double kSentinel = -7777.5;

// Calls fn(multi-index) for every index of `shape` in C order.
template <typename Fn>
void ForEachIndex(const std::vector<int64_t>& shape, Fn fn) {
  for (int64_t e : shape) {
    if (e == 0) return;
  }
  std::vector<int64_t> index(shape.size(), 0);
  while (true) {
    fn(index);
    int d = static_cast<int>(shape.size()) - 1;
    for (; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

int64_t OffsetOf(const StridedLayout& l, const std::vector<int64_t>& index) {
  int64_t offset = l.offset;
  for (size_t d = 0; d < index.size(); ++d) offset += index[d] * l.strides[d];
  return offset;
}

class Cases {
 public:
  explicit Cases(uint64_t seed) : rng_(seed) {}

  int64_t Int(int64_t lo, int64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool Coin(double p = 0.5) { return std::bernoulli_distribution(p)(rng_); }

  std::vector<uint64_t> BaseShape() {
    std::vector<uint64_t> shape(static_cast<size_t>(Int(1, 4)));
    for (uint64_t& e : shape) e = static_cast<uint64_t>(Int(1, 6));
    return shape;
  }

  // A few random view steps; a step that does not apply is skipped.
  StridedLayout RandomView(StridedLayout layout) {
    const int steps = static_cast<int>(Int(0, 4));
    for (int k = 0; k < steps; ++k) {
      absl::StatusOr<StridedLayout> next = Step(layout);
      if (next.ok() && next->ndim() <= 4) layout = *std::move(next);
    }
    return layout;
  }

  std::vector<int32_t> Permutation(int n) {
    std::vector<int32_t> axes(n);
    std::iota(axes.begin(), axes.end(), 0);
    std::shuffle(axes.begin(), axes.end(), rng_);
    return axes;
  }

 private:
  absl::StatusOr<StridedLayout> Step(const StridedLayout& in) {
    const int n = in.ndim();
    switch (Int(0, 5)) {
      case 0: {  // slices, sometimes an integer index
        std::vector<IndexItem> items;
        for (int d = 0; d < n; ++d) {
          IndexItem item;
          if (Coin(0.2) && in.shape[d] > 0) {
            item.kind = IndexItem::Kind::kIndex;
            item.index = Int(-in.shape[d], in.shape[d] - 1);
          } else {
            item.kind = IndexItem::Kind::kSlice;
            if (Coin()) item.start = Int(-7, 7);
            if (Coin()) item.stop = Int(-7, 7);
            int64_t step = Int(-3, 3);
            item.step = step == 0 ? 1 : step;
          }
          items.push_back(item);
        }
        return IndexView(in, items, kMaxDims);
      }
      case 1:
        return TransposeView(in, Permutation(n));
      case 2: {
        const std::vector<int32_t> axes = {static_cast<int32_t>(Int(0, n))};
        return ExpandDimsView(in, axes, kMaxDims);
      }
      case 3:
        return SqueezeView(in, {});
      case 4: {  // reshape into one axis, or split the first axis
        std::vector<int64_t> shape = {-1};
        if (n >= 1 && in.shape[0] % 2 == 0 && in.shape[0] > 0) {
          shape = in.shape;
          shape[0] /= 2;
          shape.insert(shape.begin(), 2);
        }
        return ReshapeView(in, shape, kMaxDims);
      }
      default:
        return in;
    }
  }

  std::mt19937_64 rng_;
};

struct Operand {
  std::vector<double> host;  // the base buffer's elements
  DeviceMemory memory;
  StridedLayout view;        // its own shape
  StridedLayout broadcast;   // broadcast to the result's shape
};

TEST_P(BackendConformance, StridedElementwiseMatchesABruteForceModel) {
  Cases cases(20261127);
  const std::vector<std::string> texts = {"a + b * 2", "a * b - c", "where(a < b, c, a) + 1",
                                          "sqrt(abs(a)) - b"};
  int strided_outputs = 0, aliased = 0, broadcasts = 0;
  for (int t = 0; t < kCases; ++t) {
    SCOPED_TRACE(absl::StrCat("case ", t));
    // The first operand's view decides the result's shape; the others broadcast to it.
    std::vector<Operand> operands(3);
    for (size_t k = 0; k < operands.size(); ++k) {
      Operand& o = operands[k];
      std::vector<uint64_t> base_shape = cases.BaseShape();
      if (k > 0) {
        // A partner: trailing axes of the result's shape, some of extent 1.
        const std::vector<int64_t>& s = operands[0].view.shape;
        base_shape.clear();
        for (size_t d = static_cast<size_t>(cases.Int(0, static_cast<int64_t>(s.size())));
             d < s.size(); ++d) {
          base_shape.push_back(cases.Coin(0.3) ? 1 : static_cast<uint64_t>(s[d]));
        }
        if (base_shape.empty()) base_shape = {1};
      }
      const StridedLayout dense = DenseLayout(base_shape, cases.Coin(0.3) && base_shape.size() >= 2);
      o.host.resize(static_cast<size_t>(dense.num_elements()));
      for (double& v : o.host) v = static_cast<double>(cases.Int(-1000, 1000)) / 8;
      o.view = k == 0 ? cases.RandomView(dense) : dense;
      ASSIGN_OR_FAIL(o.memory, Upload(backend(), stream(), o.host));
    }
    std::vector<std::vector<int64_t>> shapes;
    for (const Operand& o : operands) shapes.push_back(o.view.shape);
    ASSIGN_OR_FAIL(std::vector<int64_t> shape, BroadcastShapes(shapes));
    for (Operand& o : operands) {
      ASSIGN_OR_FAIL(o.broadcast, BroadcastToView(o.view, shape, kMaxDims));
      broadcasts += o.broadcast.HasBroadcast() ? 1 : 0;
    }

    // The output: every axis strided (step 1 to 3, either sign) in a larger buffer, the
    // axes permuted; or exactly operand a's view (x += ... in place).
    const bool in_place = !operands[0].view.HasBroadcast() && operands[0].view.shape == shape &&
                          cases.Coin(0.2);
    StridedLayout out_layout;
    std::vector<double> out_host;
    DeviceMemory out_memory;
    if (in_place) {
      out_layout = operands[0].view;
      ++aliased;
    } else {
      const int n = static_cast<int>(shape.size());
      const std::vector<int32_t> perm = cases.Permutation(n);
      std::vector<uint64_t> big(n);
      std::vector<IndexItem> items(n);
      for (int d = 0; d < n; ++d) {
        const int64_t extent = shape[perm[d]];
        const int64_t step = cases.Int(1, 3);
        big[d] = static_cast<uint64_t>(extent * step);
        items[d].kind = IndexItem::Kind::kSlice;
        items[d].step = cases.Coin() ? step : -step;
      }
      std::vector<int32_t> inverse(n);
      for (int d = 0; d < n; ++d) inverse[perm[d]] = d;
      ASSIGN_OR_FAIL(StridedLayout sliced, IndexView(DenseLayout(big, false), items, kMaxDims));
      ASSIGN_OR_FAIL(out_layout, TransposeView(sliced, inverse));
      ASSERT_EQ(out_layout.shape, shape);
      out_host.assign(static_cast<size_t>(DenseLayout(big, false).num_elements()), kSentinel);
      ASSIGN_OR_FAIL(out_memory, Upload(backend(), stream(), out_host));
      strided_outputs += out_layout.IsCContiguous() ? 0 : 1;
    }

    const std::string& text = texts[t % texts.size()];
    expr::InputMap types;
    for (const char* name : {"a", "b", "c"}) {
      if (text.find(name) != std::string::npos) types.emplace(name, expr::ArrayInput{DType::kFloat64});
    }
    ASSIGN_OR_FAIL(expr::Program program, expr::Compile(text, types));

    // The reference, by the brute-force model, from the values before the launch.
    std::vector<double> want = in_place ? operands[0].host : out_host;
    ForEachIndex(shape, [&](const std::vector<int64_t>& index) {
      const double a = operands[0].host[OffsetOf(operands[0].broadcast, index)];
      const double b = operands[1].host[OffsetOf(operands[1].broadcast, index)];
      const double c = operands[2].host[OffsetOf(operands[2].broadcast, index)];
      double r = 0;
      switch (t % texts.size()) {
        case 0: r = a + b * 2; break;
        case 1: r = a * b - c; break;
        case 2: r = (a < b ? c : a) + 1; break;
        default: r = std::sqrt(std::abs(a)) - b;
      }
      want[static_cast<size_t>(OffsetOf(out_layout, index))] = r;
    });

    // Launch as the planner does: program inputs in order, layouts coalesced together.
    std::vector<StridedLayout> layouts;
    std::vector<const DeviceMemory*> memories;
    for (const std::string& name : program.inputs()) {
      const Operand& o = operands[name[0] - 'a'];
      layouts.push_back(o.broadcast);
      memories.push_back(&o.memory);
    }
    StridedLayout coalesced_out = out_layout;
    std::vector<StridedLayout*> all;
    for (StridedLayout& l : layouts) all.push_back(&l);
    all.push_back(&coalesced_out);
    CoalesceAxes(all);
    std::vector<StridedInput> inputs;
    for (size_t k = 0; k < layouts.size(); ++k) inputs.push_back({memories[k], layouts[k]});
    DeviceMemory& target = in_place ? operands[0].memory : out_memory;
    ASSERT_OK(backend().ElementwiseStrided(stream(), program, inputs, target, coalesced_out,
                                           DType::kFloat64).status());
    ASSIGN_OR_FAIL(std::vector<double> got, Download<double>(backend(), stream(), target,
                                                             want.size()));
    int misses = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const bool close = got[i] == want[i] || std::abs(got[i] - want[i]) <= 1e-12 * std::abs(want[i]);
      if (!close && misses++ < 5) {
        ADD_FAILURE() << text << " shape " << NumpyShape(shape) << " element " << i << ": got "
                      << got[i] << ", want " << want[i];
      }
    }
    ASSERT_EQ(misses, 0);
  }
  // The cases cover what they mean to.
  EXPECT_GT(strided_outputs, kCases / 2);
  EXPECT_GT(aliased, 5);
  EXPECT_GT(broadcasts, kCases / 2);
}

}  // namespace
}  // namespace gpucompute::conformance
