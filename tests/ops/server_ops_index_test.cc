// End-to-end tests of index(k) and ElementwiseOp.shape through a real server: numpy's
// arange, linspace, eye, tril and indices made on the server without an upload, an operand
// broadcast to a requested shape, and index() over operands read through views. Every
// result is checked against a float64 reference computed here as NumPy defines it.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "tests/ops/server_ops_fixture.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {
namespace {

using IndexTest = ServerOpsTest;

// A waiting SubmitRequest from its text format.
v1::SubmitRequest Request(const std::string& text) {
  v1::SubmitRequest request;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &request)) << text;
  request.set_wait(true);
  return request;
}

// Runs `text` and returns the new output's info and its elements as T.
template <typename T>
absl::StatusOr<std::pair<v1::BufferInfo, std::vector<T>>> Evaluate(Client& client,
                                                                   const std::string& text) {
  absl::StatusOr<v1::Operation> op = RunOp(client, Request(text));
  if (!op.ok()) return op.status();
  absl::StatusOr<std::vector<T>> values = DownloadArray<T>(client, op->outputs(0).id());
  if (!values.ok()) return values.status();
  return std::pair{op->outputs(0), *std::move(values)};
}

std::vector<uint64_t> ShapeOf(const v1::BufferInfo& info) {
  return {info.shape().begin(), info.shape().end()};
}

TEST_F(IndexTest, ArangeIsIndexZeroOfAOneDimensionalShape) {
  ASSIGN_OR_FAIL(
      auto arange,
      Evaluate<int64_t>(c(), "elementwise { expression: \"index(0)\" shape { extents: 7 } }"));
  EXPECT_EQ(arange.first.dtype(), v1::DTYPE_INT64);  // numpy.arange(7).dtype
  EXPECT_EQ(ShapeOf(arange.first), (std::vector<uint64_t>{7}));
  EXPECT_EQ(arange.second, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  // numpy.arange(0, 0): empty, and index(-1) is the same axis.
  ASSIGN_OR_FAIL(auto empty, Evaluate<int64_t>(c(),
                                               "elementwise { expression: \"index(-1)\" "
                                               "shape { extents: 0 } }"));
  EXPECT_EQ(ShapeOf(empty.first), (std::vector<uint64_t>{0}));
  EXPECT_TRUE(empty.second.empty());
}

TEST_F(IndexTest, LinspaceIsStartPlusIndexTimesStepInFloat64) {
  // numpy.linspace(-1.5, 2.25, 11): start + arange(num) * step, step = (stop - start) / 10,
  // the last element set to stop.
  const double start = -1.5, stop = 2.25;
  const double step = (stop - start) / 10;
  ASSIGN_OR_FAIL(
      auto got,
      Evaluate<double>(
          c(), absl::StrCat("elementwise { expression: \"where(index(0) == 10, stop, "
                            "start + index(0) * step)\" shape { extents: 11 } ",
                            "inputs { key: \"start\" value { scalar { float_value: ", start,
                            " } } } inputs { key: \"step\" value { scalar { float_value: ", step,
                            " } } } inputs { key: \"stop\" value { scalar { "
                            "float_value: ",
                            stop, " } } } }")));
  EXPECT_EQ(got.first.dtype(), v1::DTYPE_FLOAT64);
  std::vector<double> ref;
  for (int i = 0; i < 11; ++i) ref.push_back(i == 10 ? stop : start + i * step);
  ExpectClose(got.second, ref, 0, 0, "linspace");  // the same operations: exact
}

TEST_F(IndexTest, EyeTrilAndIndicesOfATwoDimensionalShape) {
  constexpr int kRows = 5, kCols = 7;
  const std::string shape = absl::StrCat(" shape { extents: [", kRows, ", ", kCols, "] } }");
  // numpy.eye(5, 7, k=1)
  ASSIGN_OR_FAIL(auto eye, Evaluate<double>(c(),
                                            "elementwise { expression: \"where(index(1) - "
                                            "index(0) == 1, 1.0, 0.0)\"" +
                                                shape));
  // numpy.tril(numpy.ones((5, 7)))
  ASSIGN_OR_FAIL(auto tril, Evaluate<uint8_t>(c(),
                                              "elementwise { expression: \"index(-1) <= "
                                              "index(-2)\"" +
                                                  shape));
  EXPECT_EQ(tril.first.dtype(), v1::DTYPE_BOOL);
  // numpy.indices((5, 7))[0] * 10 + numpy.indices((5, 7))[1]
  ASSIGN_OR_FAIL(
      auto indices,
      Evaluate<int64_t>(c(), "elementwise { expression: \"index(0) * 10 + index(1)\"" + shape));
  std::vector<double> eye_ref;
  std::vector<uint8_t> tril_ref;
  std::vector<int64_t> indices_ref;
  for (int i = 0; i < kRows; ++i) {
    for (int j = 0; j < kCols; ++j) {
      eye_ref.push_back(j - i == 1 ? 1.0 : 0.0);
      tril_ref.push_back(j <= i);
      indices_ref.push_back(i * 10 + j);
    }
  }
  EXPECT_EQ(ShapeOf(eye.first), (std::vector<uint64_t>{kRows, kCols}));
  EXPECT_EQ(eye.second, eye_ref);
  EXPECT_EQ(tril.second, tril_ref);
  EXPECT_EQ(indices.second, indices_ref);
}

TEST_F(IndexTest, OperandsBroadcastToTheRequestedShapeAndIndexReadsItsAxes) {
  // x (4,) broadcast to (3, 2, 4): x + 100 * index(0) + 10 * index(1).
  const std::vector<double> x = {0.5, 1.5, 2.5, 3.5};
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x));
  ASSIGN_OR_FAIL(
      auto got,
      Evaluate<double>(c(), absl::StrCat("elementwise { expression: \"x + 100 * index(0) + 10 * "
                                         "index(-2)\" inputs { key: \"x\" value { buffer: \"",
                                         bx.id(), "\" } } shape { extents: [3, 2, 4] } }")));
  EXPECT_EQ(ShapeOf(got.first), (std::vector<uint64_t>{3, 2, 4}));
  std::vector<double> ref;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 2; ++j) {
      for (int k = 0; k < 4; ++k) ref.push_back(x[k] + 100 * i + 10 * j);
    }
  }
  ExpectClose(got.second, ref, 0, 0, "broadcast to (3,2,4)");

  // numpy.tril of a transposed, reversed view: the coordinates are the result's, not
  // the memory's.
  std::vector<double> m;
  for (int i = 0; i < 12; ++i) m.push_back(i + 0.25);  // (3, 4)
  ASSIGN_OR_FAIL(auto bm, UploadArray(c(), m, {3, 4}));
  ASSIGN_OR_FAIL(
      auto tril,
      Evaluate<double>(c(), absl::StrCat("elementwise { expression: \"where(index(1) <= index(0), "
                                         "m, 0)\" inputs { key: \"m\" value { buffer: \"",
                                         bm.id(),
                                         "\" view { transpose {} } view { index { items { slice { "
                                         "step: -1 } } } } } } }")));
  EXPECT_EQ(ShapeOf(tril.first), (std::vector<uint64_t>{4, 3}));
  std::vector<double> tril_ref;
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 3; ++j) tril_ref.push_back(j <= i ? m[j * 4 + (3 - i)] : 0.0);
  }
  ExpectClose(tril.second, tril_ref, 0, 0, "tril of m.T[::-1]");
}

TEST_F(IndexTest, AnExistingOutputOfTheRequestedShapeIsWrittenWhole) {
  ASSIGN_OR_FAIL(auto out, UploadArray(c(), std::vector<double>(6, -1.0), {2, 3}));
  ASSERT_OK(RunOp(c(), Request(absl::StrCat(
                           "elementwise { expression: \"index(0) - index(1)\" shape { extents: "
                           "[2, 3] } output { buffer: \"",
                           out.id(), "\" } }"))));
  ASSIGN_OR_FAIL(std::vector<double> values, DownloadArray<double>(c(), out.id()));
  EXPECT_EQ(values, (std::vector<double>{0, -1, -2, 1, 0, -1}));
}

}  // namespace
}  // namespace gpucompute::testing
