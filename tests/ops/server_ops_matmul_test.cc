// End-to-end tests of Submit's matmul: numpy.matmul's shapes (2-D, 3-D batches, a 2-D
// operand broadcast over a batch, 1-D operands), C and F layouts, views, transposes,
// alpha and beta, float32 and float64, each against a float64 reference computed here.
//
// The bound: each element of C is a sum of k products, which any summation order gets
// within k units of rounding of sum |a||b| (Higham's gamma_k), plus the alpha and beta
// steps and the final rounding: (k + 3) * eps * (|alpha| sum |a||b| + |beta c0|), eps the
// unit roundoff of the dtype (2^-53 or 2^-24).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "client/cpp/session.h"
#include "tests/ops/server_ops_fixture.h"
#include "tests/support/test_server.h"
#include "tests/support/test_util.h"

namespace gpucompute::testing {
namespace {

constexpr double kEps64 = 0x1.0p-53;
constexpr double kEps32 = 0x1.0p-24;

// A logical array: its values in C order and its shape.
struct Array {
  std::vector<double> v;
  std::vector<int64_t> shape;
};

// numpy.matmul(a, b) * alpha + beta * c0 (c0 in C order of the result, or none), and
// the magnitude each element's error is bounded against.
struct MatmulRef {
  std::vector<double> c;
  std::vector<double> scale;
};
MatmulRef NumpyMatmul(const Array& a, const Array& b, double alpha = 1, double beta = 0,
                      const std::vector<double>* c0 = nullptr) {
  const size_t na = a.shape.size(), nb = b.shape.size();
  const int64_t m = na == 1 ? 1 : a.shape[na - 2];
  const int64_t k = a.shape[na - 1];
  const int64_t n = nb == 1 ? 1 : b.shape[nb - 1];
  const int64_t batch_a = na == 3 ? a.shape[0] : 1;
  const int64_t batch_b = nb == 3 ? b.shape[0] : 1;
  const int64_t batch = std::max(batch_a, batch_b);
  MatmulRef r;
  for (int64_t t = 0; t < batch; ++t) {
    const double* pa = a.v.data() + (batch_a == 1 ? 0 : t) * m * k;
    const double* pb = b.v.data() + (batch_b == 1 ? 0 : t) * k * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        long double acc = 0, mag = 0;
        for (int64_t p = 0; p < k; ++p) {
          const long double prod = static_cast<long double>(pa[i * k + p]) * pb[p * n + j];
          acc += prod;
          mag += std::fabs(prod);
        }
        const double old = c0 != nullptr ? beta * (*c0)[r.c.size()] : 0.0;
        r.c.push_back(static_cast<double>(alpha * acc + old));
        r.scale.push_back(static_cast<double>(std::fabs(alpha) * mag + std::fabs(old)));
      }
    }
  }
  return r;
}

template <typename T>
void ExpectMatmulClose(const std::vector<T>& got, const MatmulRef& ref, int64_t k,
                       std::string_view what) {
  ASSERT_EQ(got.size(), ref.c.size()) << what;
  const double unit = sizeof(T) == 4 ? kEps32 : kEps64;
  const double rel = (static_cast<double>(k) + 3) * unit;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::fabs(static_cast<double>(got[i]) - ref.c[i]), rel * ref.scale[i] + 1e-300)
        << what << " c[" << i << "]: got " << got[i] << ", want " << ref.c[i];
  }
}

// Values exactly representable in float32, so that float32 and float64 runs share a
// reference.
Array RandomArray(std::vector<int64_t> shape, uint64_t seed) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  std::vector<double> v = RandomDoubles(static_cast<size_t>(count), -1, 1, seed);
  for (double& x : v) x = static_cast<float>(x);
  return {std::move(v), std::move(shape)};
}

std::vector<uint64_t> Unsigned(const std::vector<int64_t>& shape) {
  return std::vector<uint64_t>(shape.begin(), shape.end());
}

// Uploads a 1-D to 3-D logical array as T, in `layout` (F only for 2-D).
template <typename T>
absl::StatusOr<v1::BufferInfo> Put(Client& client, const Array& x,
                                   v1::Layout layout = v1::LAYOUT_C) {
  if (layout == v1::LAYOUT_F) {
    return UploadArray(client, ToMemory<T>(x.v, x.shape[0], x.shape[1], layout),
                       Unsigned(x.shape), layout);
  }
  return UploadArray(client, Cast<T>(x.v), Unsigned(x.shape), layout);
}

v1::SubmitRequest Matmul(const std::string& a, const std::string& b, v1::Output c = {}) {
  v1::SubmitRequest request;
  v1::MatmulOp* op = request.mutable_matmul();
  op->set_a(a);
  op->set_b(b);
  *op->mutable_c() = std::move(c);
  return request;
}

v1::ViewStep Transpose() {
  v1::ViewStep step;
  step.mutable_transpose();
  return step;
}

// x[:, start:stop]
v1::ViewStep Columns(int64_t start, int64_t stop) {
  v1::ViewStep step;
  v1::Indexing* index = step.mutable_index();
  index->add_items()->mutable_slice();
  v1::Slice* s = index->add_items()->mutable_slice();
  s->set_start(start);
  s->set_stop(stop);
  return step;
}

// Runs `request` and checks its result against `ref`: kind, shape, dtype, flops, values,
// and the elements read when `elements_read` is given.
template <typename T>
void RunAndCheck(Client& client, const v1::SubmitRequest& request, const MatmulRef& ref,
                 const std::vector<uint64_t>& shape, int64_t k, std::string_view what,
                 uint64_t elements_read = 0) {
  SCOPED_TRACE(what);
  ASSIGN_OR_FAIL(v1::Operation op, RunOp(client, request));
  EXPECT_EQ(op.kind(), v1::OPERATION_KIND_MATMUL);
  ASSERT_EQ(op.outputs_size(), 1);
  EXPECT_EQ(op.outputs(0).dtype(), ProtoDType<T>());
  EXPECT_EQ(std::vector<uint64_t>(op.outputs(0).shape().begin(), op.outputs(0).shape().end()),
            shape);
  EXPECT_EQ(op.timing().flops(), 2 * ref.c.size() * static_cast<uint64_t>(k));
  if (elements_read != 0) {
    EXPECT_EQ(op.timing().bytes_read(), elements_read * sizeof(T));
  }
  ASSIGN_OR_FAIL(std::vector<T> got, DownloadArray<T>(client, op.outputs(0).id()));
  ExpectMatmulClose(got, ref, k, what);
}

template <typename T>
class MatmulTypedTest : public ServerOpsTest {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(MatmulTypedTest, FloatTypes);

TYPED_TEST(MatmulTypedTest, TwoDInEveryLayoutPair) {
  using T = TypeParam;
  constexpr int64_t m = 67, k = 129, n = 45;
  const Array a = RandomArray({m, k}, 1);
  const Array b = RandomArray({k, n}, 2);
  const MatmulRef ref = NumpyMatmul(a, b);
  for (v1::Layout la : {v1::LAYOUT_C, v1::LAYOUT_F}) {
    for (v1::Layout lb : {v1::LAYOUT_C, v1::LAYOUT_F}) {
      ASSIGN_OR_FAIL(auto ba, Put<T>(this->c(), a, la));
      ASSIGN_OR_FAIL(auto bb, Put<T>(this->c(), b, lb));
      const std::string what =
          absl::StrCat(la == v1::LAYOUT_C ? "C" : "F", " x ", lb == v1::LAYOUT_C ? "C" : "F");
      RunAndCheck<T>(this->c(), Waiting(Matmul(ba.id(), bb.id())), ref, {m, n}, k, what);
    }
  }
}

TYPED_TEST(MatmulTypedTest, ViewsAndTransposes) {
  using T = TypeParam;
  constexpr int64_t m = 40, k = 33, n = 21;
  // A^T stored (k, m); viewed through a transpose step, or through transpose_a.
  const Array at = RandomArray({k, m}, 3);
  Array a{std::vector<double>(m * k), {m, k}};
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) a.v[i * k + p] = at.v[p * m + i];
  }
  // B is columns 5..5+n of a wider (k, 64) array: a leading dimension of 64.
  const Array wide = RandomArray({k, 64}, 4);
  Array b{std::vector<double>(k * n), {k, n}};
  for (int64_t p = 0; p < k; ++p) {
    for (int64_t j = 0; j < n; ++j) b.v[p * n + j] = wide.v[p * 64 + 5 + j];
  }
  const MatmulRef ref = NumpyMatmul(a, b);
  for (v1::Layout layout : {v1::LAYOUT_C, v1::LAYOUT_F}) {
    ASSIGN_OR_FAIL(auto bat, Put<T>(this->c(), at, layout));
    ASSIGN_OR_FAIL(auto bwide, Put<T>(this->c(), wide, layout));
    v1::SubmitRequest viewed = Matmul(bat.id(), bwide.id());
    *viewed.mutable_matmul()->add_a_view() = Transpose();
    *viewed.mutable_matmul()->add_b_view() = Columns(5, 5 + n);
    RunAndCheck<T>(this->c(), Waiting(viewed), ref, {m, n}, k, "transpose step, column slice");

    v1::SubmitRequest flagged = viewed;
    flagged.mutable_matmul()->clear_a_view();
    flagged.mutable_matmul()->set_transpose_a(true);
    RunAndCheck<T>(this->c(), Waiting(flagged), ref, {m, n}, k, "transpose_a, column slice");

    // Both transposes: (B^T)^T through transpose_b of a transposed view.
    v1::SubmitRequest both = flagged;
    *both.mutable_matmul()->add_b_view() = Transpose();
    both.mutable_matmul()->set_transpose_b(true);
    RunAndCheck<T>(this->c(), Waiting(both), ref, {m, n}, k, "transpose_a, transpose_b of B^T");
  }
}

TYPED_TEST(MatmulTypedTest, BatchesAndBroadcasting) {
  using T = TypeParam;
  constexpr int64_t batch = 5, m = 17, k = 23, n = 11;
  const Array a3 = RandomArray({batch, m, k}, 5);
  const Array b3 = RandomArray({batch, k, n}, 6);
  const Array b2 = RandomArray({k, n}, 7);
  const Array a1 = RandomArray({1, m, k}, 8);
  ASSIGN_OR_FAIL(auto ba3, Put<T>(this->c(), a3));
  ASSIGN_OR_FAIL(auto bb3, Put<T>(this->c(), b3));
  ASSIGN_OR_FAIL(auto bb2, Put<T>(this->c(), b2));
  ASSIGN_OR_FAIL(auto bb2f, Put<T>(this->c(), b2, v1::LAYOUT_F));
  ASSIGN_OR_FAIL(auto ba1, Put<T>(this->c(), a1));
  RunAndCheck<T>(this->c(), Waiting(Matmul(ba3.id(), bb3.id())), NumpyMatmul(a3, b3),
                 {batch, m, n}, k, "3-D x 3-D");
  // A matrix used for every matrix of the batch is read once.
  RunAndCheck<T>(this->c(), Waiting(Matmul(ba3.id(), bb2.id())), NumpyMatmul(a3, b2),
                 {batch, m, n}, k, "3-D x 2-D", batch * m * k + k * n);
  RunAndCheck<T>(this->c(), Waiting(Matmul(ba3.id(), bb2f.id())), NumpyMatmul(a3, b2),
                 {batch, m, n}, k, "3-D x 2-D F");
  RunAndCheck<T>(this->c(), Waiting(Matmul(ba1.id(), bb3.id())), NumpyMatmul(a1, b3),
                 {batch, m, n}, k, "a batch of 1 x 3-D", m * k + batch * k * n);
  // Broadcast to a batch through a view: still one matrix read.
  v1::SubmitRequest broadcast = Matmul(ba1.id(), bb3.id());
  v1::ViewStep to_batch;
  for (int64_t d : {batch, m, k}) to_batch.mutable_broadcast_to()->add_extents(d);
  *broadcast.mutable_matmul()->add_a_view() = to_batch;
  RunAndCheck<T>(this->c(), Waiting(broadcast), NumpyMatmul(a1, b3), {batch, m, n}, k,
                 "broadcast_to view x 3-D", m * k + batch * k * n);
}

TYPED_TEST(MatmulTypedTest, OneDOperandsDropTheirAxis) {
  using T = TypeParam;
  constexpr int64_t m = 19, k = 31, n = 13;
  const Array a = RandomArray({m, k}, 9);
  const Array b = RandomArray({k, n}, 10);
  const Array x = RandomArray({k}, 11);
  const Array y = RandomArray({k}, 12);
  ASSIGN_OR_FAIL(auto ba, Put<T>(this->c(), a));
  ASSIGN_OR_FAIL(auto bb, Put<T>(this->c(), b));
  ASSIGN_OR_FAIL(auto bx, Put<T>(this->c(), x));
  ASSIGN_OR_FAIL(auto by, Put<T>(this->c(), y));
  RunAndCheck<T>(this->c(), Waiting(Matmul(ba.id(), bx.id())), NumpyMatmul(a, x), {m}, k,
                 "2-D x 1-D");
  RunAndCheck<T>(this->c(), Waiting(Matmul(bx.id(), bb.id())), NumpyMatmul(x, b), {n}, k,
                 "1-D x 2-D");
  RunAndCheck<T>(this->c(), Waiting(Matmul(bx.id(), by.id())), NumpyMatmul(x, y), {}, k,
                 "1-D x 1-D");
  // A strided vector: every other element of a (2k) array.
  const Array x2 = RandomArray({2 * k}, 13);
  Array every_other{std::vector<double>(k), {k}};
  for (int64_t p = 0; p < k; ++p) every_other.v[p] = x2.v[2 * p];
  ASSIGN_OR_FAIL(auto bx2, Put<T>(this->c(), x2));
  v1::SubmitRequest strided = Matmul(ba.id(), bx2.id());
  v1::ViewStep step;
  step.mutable_index()->add_items()->mutable_slice()->set_step(2);
  *strided.mutable_matmul()->add_b_view() = step;
  RunAndCheck<T>(this->c(), Waiting(strided), NumpyMatmul(a, every_other), {m}, k,
                 "2-D x a ::2 view");
}

TYPED_TEST(MatmulTypedTest, AlphaAndBetaIntoAnExistingC) {
  using T = TypeParam;
  constexpr int64_t m = 26, k = 70, n = 35;
  const Array a = RandomArray({m, k}, 14);
  const Array b = RandomArray({k, n}, 15);
  const Array c0 = RandomArray({m, n}, 16);
  ASSIGN_OR_FAIL(auto ba, Put<T>(this->c(), a));
  ASSIGN_OR_FAIL(auto bb, Put<T>(this->c(), b, v1::LAYOUT_F));
  for (v1::Layout layout : {v1::LAYOUT_C, v1::LAYOUT_F}) {
    SCOPED_TRACE(layout == v1::LAYOUT_C ? "C-layout c" : "F-layout c");
    ASSIGN_OR_FAIL(auto bc, Put<T>(this->c(), c0, layout));
    v1::SubmitRequest request = Matmul(ba.id(), bb.id(), ExistingOutput(bc.id()));
    request.mutable_matmul()->set_alpha(-0.5);
    request.mutable_matmul()->set_beta(2);
    ASSIGN_OR_FAIL(v1::Operation op, RunOp(this->c(), request));
    EXPECT_EQ(op.outputs(0).id(), bc.id());
    EXPECT_EQ(op.timing().bytes_read(), (m * k + k * n + m * n) * sizeof(T));
    EXPECT_EQ(op.timing().bytes_written(), m * n * sizeof(T));
    ASSIGN_OR_FAIL(std::vector<T> got, DownloadArray<T>(this->c(), bc.id()));
    if (layout == v1::LAYOUT_F) got = ToMemory<T>(Cast<double>(got), n, m, v1::LAYOUT_F);
    ExpectMatmulClose(got, NumpyMatmul(a, b, -0.5, 2, &c0.v), k, "alpha -0.5, beta 2");
  }
  // A new C ignores beta; alpha unset is 1.
  v1::SubmitRequest fresh = Matmul(ba.id(), bb.id());
  fresh.mutable_matmul()->set_beta(7);
  ASSIGN_OR_FAIL(v1::Operation op, RunOp(this->c(), fresh));
  EXPECT_EQ(op.timing().bytes_read(), (m * k + k * n) * sizeof(T));
  ASSIGN_OR_FAIL(std::vector<T> got, DownloadArray<T>(this->c(), op.outputs(0).id()));
  ExpectMatmulClose(got, NumpyMatmul(a, b), k, "new c, beta ignored");
}

// In a session, a matmul's operand may be an earlier step's output, by its tag, before
// that step has run: (A @ B) @ B2.
TEST_F(ServerOpsTest, MatmulReadsATaggedOutputInASession) {
  const Array a = RandomArray({12, 9}, 19);
  const Array b = RandomArray({9, 7}, 20);
  const Array b2 = RandomArray({7, 5}, 21);
  ASSIGN_OR_FAIL(auto ba, Put<double>(c(), a));
  ASSIGN_OR_FAIL(auto bb, Put<double>(c(), b));
  ASSIGN_OR_FAIL(auto bb2, Put<double>(c(), b2));
  ASSIGN_OR_FAIL(std::unique_ptr<Session> session, Session::Open(c()));
  auto ab = session->Submit(Matmul(ba.id(), bb.id()), "ab");
  auto abb = session->Submit(Matmul(ab.Ref(), bb2.id(), NewOutput("abb")), "abb");
  ASSIGN_OR_FAIL(v1::Operation done, abb.result.Get());
  EXPECT_EQ(done.state(), v1::Operation::STATE_SUCCEEDED) << done.error_message();
  EXPECT_EQ(done.kind(), v1::OPERATION_KIND_MATMUL);
  ASSERT_OK(session->Close());
  const MatmulRef first = NumpyMatmul(a, b);
  ASSIGN_OR_FAIL(std::vector<double> got, DownloadArray<double>(c(), "abb"));
  // Two products: the first's rounding, scaled by |B2|, adds to the second's bound.
  MatmulRef ref = NumpyMatmul(Array{first.c, {12, 7}}, b2);
  const MatmulRef slack = NumpyMatmul(Array{first.scale, {12, 7}}, Array{b2.v, {7, 5}});
  for (size_t i = 0; i < ref.scale.size(); ++i) ref.scale[i] += (9 + 3.0) / 10 * slack.scale[i];
  ExpectMatmulClose(got, ref, 7, "(A @ B) @ B2");
}

TEST_F(ServerOpsTest, MatmulStatsReportKindMatmul) {
  const Array a = RandomArray({4, 3}, 17);
  const Array b = RandomArray({3, 2}, 18);
  ASSIGN_OR_FAIL(auto ba, Put<double>(c(), a));
  ASSIGN_OR_FAIL(auto bb, Put<double>(c(), b));
  ASSERT_OK(RunOp(c(), Matmul(ba.id(), bb.id())));
  ASSERT_OK(RunOp(c(), Matmul(ba.id(), bb.id())));
  EXPECT_EQ(CompletedCount(c(), v1::OPERATION_KIND_MATMUL), 2u);
  ASSIGN_OR_FAIL(v1::Stats stats, c().GetStats());
  for (const v1::KindStats& k : stats.kinds()) {
    if (k.kind() == v1::OPERATION_KIND_MATMUL) {
      EXPECT_EQ(k.flops(), 2u * 2 * 4 * 3 * 2);
    }
  }
}

}  // namespace
}  // namespace gpucompute::testing
