// A property test of Backend::ReduceStrided on every backend: random shapes up to 4-D,
// random views (permuted axes, steps of either sign, broadcast axes), random axis sets,
// every kind and dtype, plain arrays and an expression over two of them, against a
// float64 brute-force reference. The cases come from a fixed seed, so a failure repeats.
// Each case also runs twice and must give the same bits (kernels/reduce_ops.h), and on the
// CPU backend the bits must not depend on the thread count. Part of the conformance
// suite's program: its instantiations (CPU, and CUDA where a GPU is) run these TEST_Ps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "server/arrays/strided_layout.h"
#include "server/core/backend.h"
#include "server/cpu/cpu_backend.h"
#include "server/expression/expression.h"
#include "tests/backend/backend_conformance.h"

namespace gpucompute::conformance {
namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t Next() {
    s_ ^= s_ << 13;
    s_ ^= s_ >> 7;
    s_ ^= s_ << 17;
    return s_;
  }
  int64_t Int(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(Next() % (hi - lo)); }
  bool Chance(int percent) { return Int(0, 100) < percent; }

 private:
  uint64_t s_;
};

// Element bytes of `values` stored as `dtype`.
std::vector<uint8_t> Store(const std::vector<double>& values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * DTypeSize(dtype));
  VisitDType(dtype, [&](auto zero) {
    using T = decltype(zero);
    using S = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
    for (size_t i = 0; i < values.size(); ++i) {
      const S v = static_cast<S>(values[i]);
      std::memcpy(bytes.data() + i * sizeof(S), &v, sizeof(S));
    }
  });
  return bytes;
}

std::vector<double> Load(const std::vector<uint8_t>& bytes, DType dtype) {
  std::vector<double> values(bytes.size() / DTypeSize(dtype));
  VisitDType(dtype, [&](auto zero) {
    using T = decltype(zero);
    using S = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
    for (size_t i = 0; i < values.size(); ++i) {
      S v;
      std::memcpy(&v, bytes.data() + i * sizeof(S), sizeof(S));
      values[i] = static_cast<double>(v);
    }
  });
  return values;
}

// An array in memory and a view of it.
struct ViewedArray {
  DType dtype;
  std::vector<double> memory;  // the buffer's elements
  StridedLayout layout;

  double At(const std::vector<int64_t>& index) const {
    int64_t off = layout.offset;
    for (size_t d = 0; d < index.size(); ++d) off += index[d] * layout.strides[d];
    return memory[static_cast<size_t>(off)];
  }
};

double RandomValue(Rng& rng, DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return static_cast<double>(rng.Int(0, 2));
    case DType::kInt32:
    case DType::kInt64:
      return static_cast<double>(rng.Int(-5, 6));
    default:
      if (rng.Chance(1)) return std::nan("");
      return static_cast<double>(rng.Int(-16, 17)) / 8;
  }
}

// A random view of `shape`: a C-order buffer of a permuted shape, read with steps of
// either sign, and broadcast along some axes of extent above 1.
ViewedArray RandomView(Rng& rng, DType dtype, const std::vector<int64_t>& shape) {
  const int nd = static_cast<int>(shape.size());
  std::vector<int> perm(nd);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = nd - 1; i > 0; --i) std::swap(perm[i], perm[rng.Int(0, i + 1)]);
  std::vector<int64_t> steps(nd), base_extent(nd);
  std::vector<bool> broadcast(nd);
  for (int d = 0; d < nd; ++d) {
    steps[d] = std::vector<int64_t>{1, 1, -1, 2, -2}[rng.Int(0, 5)];
    broadcast[d] = shape[d] > 1 && rng.Chance(15);
    base_extent[d] = broadcast[d] ? 1 : std::max<int64_t>(1, shape[d] * std::abs(steps[d]));
  }
  // The buffer holds the axes in `perm` order (C order); axis d has stride base_stride[d].
  std::vector<int64_t> base_stride(nd);
  int64_t size = 1;
  for (int i = nd - 1; i >= 0; --i) {
    base_stride[perm[i]] = size;
    size *= base_extent[perm[i]];
  }
  ViewedArray a{dtype, std::vector<double>(static_cast<size_t>(size)), {}};
  for (double& v : a.memory) v = RandomValue(rng, dtype);
  a.layout.shape = shape;
  a.layout.strides.resize(nd);
  for (int d = 0; d < nd; ++d) {
    if (broadcast[d] || shape[d] <= 1) {
      a.layout.strides[d] = 0;
      continue;
    }
    a.layout.strides[d] = steps[d] * base_stride[d];
    if (steps[d] < 0) a.layout.offset += (base_extent[d] - 1) * base_stride[d];
  }
  return a;
}

struct Case {
  ReduceKind kind;
  DType dtype;  // of the values
  std::vector<int64_t> shape;
  std::vector<int32_t> axes;
  double ddof = 0;
  std::vector<ViewedArray> inputs;
  bool expression = false;  // x * y, y float64

  std::string Name() const {
    std::vector<std::string> layouts;
    for (const ViewedArray& a : inputs) {
      layouts.push_back(absl::StrCat(DTypeName(a.dtype), " strides (",
                                     absl::StrJoin(a.layout.strides, ","), ") offset ",
                                     a.layout.offset));
    }
    return absl::StrCat(ReduceKindName(kind), expression ? " of x*y" : "", " shape (",
                        absl::StrJoin(shape, ","), ") axes (", absl::StrJoin(axes, ","),
                        ") ddof ", ddof, " ", absl::StrJoin(layouts, "; "));
  }
};

Case RandomCase(Rng& rng) {
  Case c;
  const int nd = static_cast<int>(rng.Int(1, 5));
  const bool big = rng.Chance(10);  // more than one chunk of the CPU's order
  for (int d = 0; d < nd; ++d) c.shape.push_back(rng.Chance(3) ? 0 : rng.Int(1, 7));
  if (big) c.shape[rng.Int(0, nd)] = rng.Int(3000, 9000);
  const ReduceKind kinds[] = {ReduceKind::kSum,    ReduceKind::kProd,   ReduceKind::kMin,
                              ReduceKind::kMax,    ReduceKind::kMean,   ReduceKind::kNorm2,
                              ReduceKind::kArgmin, ReduceKind::kArgmax, ReduceKind::kVar,
                              ReduceKind::kStd,    ReduceKind::kAny,    ReduceKind::kAll};
  c.kind = kinds[rng.Int(0, 12)];
  const bool arg = c.kind == ReduceKind::kArgmin || c.kind == ReduceKind::kArgmax;
  if (arg && !rng.Chance(30)) {
    c.axes = {static_cast<int32_t>(rng.Int(0, nd))};
  } else {
    for (int d = 0; d < nd; ++d) {
      if (arg || rng.Chance(50)) c.axes.push_back(d);
    }
  }
  if (c.kind == ReduceKind::kVar || c.kind == ReduceKind::kStd) c.ddof = static_cast<double>(rng.Int(0, 2));
  const DType dtypes[] = {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64,
                          DType::kBool};
  const DType x_dtype = dtypes[rng.Int(0, 5)];
  c.inputs.push_back(RandomView(rng, x_dtype, c.shape));
  c.expression = rng.Chance(30);
  c.dtype = x_dtype;
  if (c.expression) {
    c.inputs.push_back(RandomView(rng, DType::kFloat64, c.shape));
    c.dtype = DType::kFloat64;
  }
  int64_t reduced = 1;
  for (int32_t a : c.axes) reduced *= c.shape[a];
  const bool selects = c.kind == ReduceKind::kMin || c.kind == ReduceKind::kMax || arg;
  if (selects && reduced == 0) c.kind = ReduceKind::kSum;  // no identity: the planner refuses
  // Products of more factors could leave float32's range; the reference is float64.
  if (c.kind == ReduceKind::kProd && reduced > 30) c.kind = ReduceKind::kSum;
  return c;
}

struct Expected {
  std::vector<double> value;
  std::vector<double> tol;
};

// The brute-force reference: every output's values in C order of the reduced positions.
Expected Reference(const Case& c) {
  const int nd = static_cast<int>(c.shape.size());
  std::vector<bool> reduced(nd, false);
  for (int32_t a : c.axes) reduced[a] = true;
  int64_t outputs = 1, count = 1;
  for (int d = 0; d < nd; ++d) (reduced[d] ? count : outputs) *= c.shape[d];
  std::vector<std::vector<double>> groups(static_cast<size_t>(outputs));
  int64_t total = 1;
  for (int64_t e : c.shape) total *= e;
  std::vector<int64_t> index(nd, 0);
  for (int64_t flat = 0; flat < total; ++flat) {
    int64_t rest = flat, o = 0, scale = 1;
    for (int d = nd - 1; d >= 0; --d) {
      index[d] = rest % c.shape[d];
      rest /= c.shape[d];
      if (!reduced[d]) {
        o += index[d] * scale;
        scale *= c.shape[d];
      }
    }
    double v = c.inputs[0].At(index);
    if (c.expression) v = v * c.inputs[1].At(index);
    groups[static_cast<size_t>(o)].push_back(v);
  }
  const bool integer = !IsFloat(c.dtype);
  const double u = c.dtype == DType::kFloat32 ? 0x1.0p-24 : 0x1.0p-52;
  const double out_u = ReduceResultDType(c.kind, c.dtype) == DType::kFloat32 ? 0x1.0p-23 : 0x1.0p-50;
  Expected e;
  for (const std::vector<double>& g : groups) {
    const double n = static_cast<double>(g.size());
    double sum = 0, abs_sum = 0, sq = 0;
    uint64_t wrapped_sum = 0, wrapped_prod = 1;
    double prod = 1;
    bool nan = false;
    for (double x : g) {
      sum += x;
      abs_sum += std::fabs(x);
      sq += x * x;
      prod *= x;
      nan = nan || std::isnan(x);
      if (integer) {
        wrapped_sum += static_cast<uint64_t>(static_cast<int64_t>(x));
        wrapped_prod *= static_cast<uint64_t>(static_cast<int64_t>(x));
      }
    }
    double value = 0, tol = 0;
    switch (c.kind) {
      case ReduceKind::kSum:
        value = integer ? static_cast<double>(static_cast<int64_t>(wrapped_sum)) : sum;
        tol = integer ? 0 : 4 * (n + 1) * 0x1.0p-53 * abs_sum + out_u * std::fabs(sum);
        break;
      case ReduceKind::kProd:
        value = integer ? static_cast<double>(static_cast<int64_t>(wrapped_prod)) : prod;
        tol = integer ? 0 : (n + 1) * u * std::fabs(prod);
        break;
      case ReduceKind::kMean:
        value = sum / n;
        tol = (4 * (n + 1) * 0x1.0p-53 * abs_sum + out_u * std::fabs(sum)) / std::max(n, 1.0);
        break;
      case ReduceKind::kNorm2:
        value = std::sqrt(sq);
        tol = 4 * (n + 1) * 0x1.0p-53 * value + out_u * value;
        break;
      case ReduceKind::kMin:
      case ReduceKind::kMax:
      case ReduceKind::kArgmin:
      case ReduceKind::kArgmax: {
        const bool is_max = c.kind == ReduceKind::kMax || c.kind == ReduceKind::kArgmax;
        size_t best = 0;
        for (size_t i = 0; i < g.size(); ++i) {
          if (std::isnan(g[i])) {
            best = i;
            break;
          }
          if (is_max ? g[i] > g[best] : g[i] < g[best]) best = i;
        }
        const bool arg = c.kind == ReduceKind::kArgmin || c.kind == ReduceKind::kArgmax;
        value = arg ? static_cast<double>(best) : g[best];
        break;
      }
      case ReduceKind::kVar:
      case ReduceKind::kStd: {
        const double mean = sum / n;
        double m2 = 0;
        for (double x : g) m2 += (x - mean) * (x - mean);
        value = m2 / std::max(n - c.ddof, 0.0);
        if (c.kind == ReduceKind::kStd) value = std::sqrt(value);
        tol = 1e-12 * (1 + abs_sum) + out_u * std::fabs(value);
        break;
      }
      case ReduceKind::kAny:
        value = std::any_of(g.begin(), g.end(), [](double x) { return x != 0; });
        break;
      case ReduceKind::kAll:
        value = std::all_of(g.begin(), g.end(), [](double x) { return x != 0; });
        break;
    }
    if (nan && c.kind != ReduceKind::kAny && c.kind != ReduceKind::kAll &&
        c.kind != ReduceKind::kArgmin && c.kind != ReduceKind::kArgmax) {
      value = std::nan("");
    }
    e.value.push_back(value);
    e.tol.push_back(tol);
  }
  return e;
}

// Runs `c` on `backend`, returning the output's bytes.
absl::StatusOr<std::vector<uint8_t>> RunCase(Backend& backend, Stream& stream, const Case& c) {
  std::vector<DeviceMemory> memories;
  for (const ViewedArray& a : c.inputs) {
    std::vector<uint8_t> bytes = Store(a.memory, a.dtype);
    bytes.resize(std::max<size_t>(bytes.size(), 1));
    absl::StatusOr<DeviceMemory> m = Upload(backend, stream, bytes);
    if (!m.ok()) return m.status();
    memories.push_back(*std::move(m));
  }
  std::optional<expr::Program> program;
  StridedReduce r;
  r.kind = c.kind;
  r.dtype = c.dtype;
  if (c.expression) {
    absl::StatusOr<expr::Program> p =
        expr::Compile("x * y", {{"x", expr::ArrayInput{c.inputs[0].dtype}},
                                {"y", expr::ArrayInput{c.inputs[1].dtype}}});
    if (!p.ok()) return p.status();
    program = *std::move(p);
    r.program = &*program;
    // program->inputs() is in order of first use: x, then y.
  }
  for (size_t k = 0; k < c.inputs.size(); ++k) r.inputs.push_back({&memories[k], c.inputs[k].layout});
  r.shape = c.shape;
  r.axes = c.axes;
  r.ddof = c.ddof;
  int64_t outputs = 1;
  for (size_t d = 0; d < c.shape.size(); ++d) {
    if (std::find(c.axes.begin(), c.axes.end(), static_cast<int32_t>(d)) == c.axes.end()) {
      outputs *= c.shape[d];
    }
  }
  const size_t out_bytes =
      static_cast<size_t>(outputs) * DTypeSize(ReduceResultDType(c.kind, c.dtype));
  absl::StatusOr<DeviceMemory> out = backend.Allocate(0, std::max<size_t>(out_bytes, 1));
  if (!out.ok()) return out.status();
  absl::StatusOr<LaunchInfo> launched = backend.ReduceStrided(stream, r, *out);
  if (!launched.ok()) return launched.status();
  return Download<uint8_t>(backend, stream, *out, out_bytes);
}

constexpr int kCases = 400;

TEST_P(BackendConformance, ReduceStridedMatchesABruteForceReference) {
  Rng rng(20240601);
  int checked = 0;
  for (int i = 0; i < kCases; ++i) {
    const Case c = RandomCase(rng);
    SCOPED_TRACE(absl::StrCat("case ", i, ": ", c.Name()));
    std::vector<uint8_t> got, again;
    ASSIGN_OR_FAIL(got, RunCase(backend(), stream(), c));
    ASSIGN_OR_FAIL(again, RunCase(backend(), stream(), c));
    EXPECT_EQ(got, again) << "two runs differ";
    const DType out_dtype = ReduceResultDType(c.kind, c.dtype);
    const std::vector<double> values = Load(got, out_dtype);
    const Expected want = Reference(c);
    ASSERT_EQ(values.size(), want.value.size());
    int bad = 0;
    for (size_t o = 0; o < values.size() && bad < 3; ++o) {
      const double w = want.value[o];
      const bool ok = std::isnan(w) ? std::isnan(values[o])
                                    : (values[o] == w || std::fabs(values[o] - w) <= want.tol[o]);
      if (!ok) {
        ++bad;
        ADD_FAILURE() << "output " << o << ": got " << values[o] << ", want " << w << " +- "
                      << want.tol[o];
      }
      ++checked;
    }
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(checked, 10000);
}

// The CPU backend's bits do not depend on its thread count.
TEST(ReduceStridedCpu, BitsDoNotDependOnTheThreadCount) {
  Rng rng(77);
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Stream>> streams;
  for (size_t threads : {1, 2, 7}) {
    backends.push_back(std::make_unique<cpu::CpuBackend>(threads));
    ASSIGN_OR_FAIL(auto s, backends.back()->CreateStream(0));
    streams.push_back(std::move(s));
  }
  for (int i = 0; i < 40; ++i) {
    Case c = RandomCase(rng);
    // Large enough for many chunks and tasks: (3, 20000) or (20000, 3) and its views.
    c.shape = i % 2 == 0 ? std::vector<int64_t>{3, 20000} : std::vector<int64_t>{20000, 3};
    c.axes = i % 3 == 0 ? std::vector<int32_t>{0, 1} : std::vector<int32_t>{i % 2 == 0 ? 1 : 0};
    if (c.kind == ReduceKind::kProd) c.kind = ReduceKind::kSum;
    for (ViewedArray& a : c.inputs) a = RandomView(rng, a.dtype, c.shape);
    SCOPED_TRACE(absl::StrCat("case ", i, ": ", c.Name()));
    std::vector<uint8_t> first;
    for (size_t b = 0; b < backends.size(); ++b) {
      std::vector<uint8_t> got;
      ASSIGN_OR_FAIL(got, RunCase(*backends[b], *streams[b], c));
      if (b == 0) {
        first = got;
      } else {
        EXPECT_EQ(got, first) << "thread count differs from 1: backend " << b;
      }
    }
  }
}

}  // namespace
}  // namespace gpucompute::conformance
