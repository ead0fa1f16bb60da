// End-to-end tests of views and broadcasting in elementwise operations and downloads,
// through a real server: operands of shapes that broadcast ((n,1), (1,m), 0-d buffers),
// views made by slicing (negative steps too), integer indexes, transposes, expand_dims,
// squeeze, broadcast_to and reshape, views of views, writing through a view, x += 1 in
// place, downloads of views, and the lifetime of a view's base. Every result is checked
// against a float64 reference computed here from the uploaded values.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "client/cpp/session.h"
#include "server/cpu/cpu_backend.h"
#include "tests/ops/server_ops_fixture.h"
#include "tests/support/forwarding_backend.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {
namespace {

using ViewsTest = ServerOpsTest;

// The view steps written in text format ("index { items { slice { step: -1 } } }"),
// as the view of a buffer operand.
v1::Operand ViewOf(const std::string& buffer, const std::string& steps) {
  v1::Operand operand = BufferOperand(buffer);
  v1::Operand parsed;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(steps, &parsed)) << steps;
  *operand.mutable_view() = parsed.view();
  return operand;
}

std::vector<uint64_t> ShapeOf(const v1::BufferInfo& info) {
  return {info.shape().begin(), info.shape().end()};
}

// A 0-d buffer holding `value` (float64 unless said otherwise).
template <typename T = double>
absl::StatusOr<v1::BufferInfo> UploadScalar(Client& client, T value) {
  v1::UploadHeader header;
  header.mutable_create()->set_dtype(ProtoDType<T>());
  absl::StatusOr<v1::UploadResponse> response =
      client.Upload(header, std::as_bytes(std::span<const T>(&value, 1)));
  if (!response.ok()) return response.status();
  return response->buffer();
}

// Runs `expression` over `inputs` into a new buffer; returns it, downloaded, and its info.
struct Result {
  v1::Operation op;
  std::vector<double> values;
};
absl::StatusOr<Result> Evaluate(Client& client, const v1::SubmitRequest& request) {
  absl::StatusOr<v1::Operation> op = RunOp(client, request);
  if (!op.ok()) return op.status();
  const std::string& into = request.elementwise().output().buffer();
  absl::StatusOr<std::vector<double>> values =
      DownloadArray<double>(client, into.empty() ? op->outputs(0).id() : into);
  if (!values.ok()) return values.status();
  return Result{*op, *std::move(values)};
}

// x[i, j] = i * 100 + j + 0.25: every element tells where it came from.
std::vector<double> Positions(size_t rows, size_t cols) {
  std::vector<double> x;
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) x.push_back(static_cast<double>(i * 100 + j) + 0.25);
  }
  return x;
}

TEST_F(ViewsTest, OperandsBroadcastAgainstColumnsRowsAndZeroDimensionalBuffers) {
  constexpr size_t kRows = 37, kCols = 1029;  // rows longer than a kernel block
  const std::vector<double> x = RandomDoubles(kRows * kCols, -5, 5, 1);
  const std::vector<double> col = RandomDoubles(kRows, -5, 5, 2);
  const std::vector<double> row = RandomDoubles(kCols, -5, 5, 3);
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x, {kRows, kCols}));
  ASSIGN_OR_FAIL(auto bcol, UploadArray(c(), col, {kRows, 1}));
  ASSIGN_OR_FAIL(auto brow, UploadArray(c(), row, {1, kCols}));
  ASSIGN_OR_FAIL(auto bvec, UploadArray(c(), row));  // (kCols,): aligned at the right
  ASSIGN_OR_FAIL(auto b0, UploadScalar(c(), 0.75));
  ASSERT_TRUE(b0.shape().empty());

  const auto check = [&](const std::string& m, auto ref_m, const std::string& what) {
    absl::StatusOr<Result> evaluated = Evaluate(
        c(), Elementwise("x - m", {{"x", BufferOperand(bx.id())}, {"m", BufferOperand(m)}}));
    EXPECT_OK(evaluated) << what;
    if (!evaluated.ok()) return Result{};
    const Result& r = *evaluated;
    EXPECT_EQ(ShapeOf(r.op.outputs(0)), (std::vector<uint64_t>{kRows, kCols})) << what;
    std::vector<double> ref;
    for (size_t i = 0; i < kRows; ++i) {
      for (size_t j = 0; j < kCols; ++j) ref.push_back(x[i * kCols + j] - ref_m(i, j));
    }
    ExpectClose(r.values, ref, 0, 0, what);  // one subtraction: exact
    return r;
  };
  Result by_col = check(bcol.id(), [&](size_t i, size_t) { return col[i]; }, "(n,1)");
  // Each distinct view is read once, at its own size.
  EXPECT_EQ(by_col.op.timing().bytes_read(), (kRows * kCols + kRows) * 8);
  EXPECT_EQ(by_col.op.timing().bytes_written(), kRows * kCols * 8);
  check(brow.id(), [&](size_t, size_t j) { return row[j]; }, "(1,m)");
  check(bvec.id(), [&](size_t, size_t j) { return row[j]; }, "(m,)");
  Result by_0d = check(b0.id(), [&](size_t, size_t) { return 0.75; }, "0-d");
  EXPECT_EQ(by_0d.op.timing().bytes_read(), (kRows * kCols + 1) * 8);

  // (n,1) against (1,m): an outer difference, neither operand expanded.
  ASSIGN_OR_FAIL(Result outer, Evaluate(c(), Elementwise("a - b", {{"a", BufferOperand(bcol.id())},
                                                       {"b", BufferOperand(brow.id())}})));
  EXPECT_EQ(ShapeOf(outer.op.outputs(0)), (std::vector<uint64_t>{kRows, kCols}));
  std::vector<double> ref;
  for (size_t i = 0; i < kRows; ++i) {
    for (size_t j = 0; j < kCols; ++j) ref.push_back(col[i] - row[j]);
  }
  ExpectClose(outer.values, ref, 0, 0, "outer");

  // A 0-d buffer with a 0-d buffer: a 0-d result.
  ASSIGN_OR_FAIL(Result zero_d, Evaluate(c(), Elementwise("a * 2", {{"a", BufferOperand(b0.id())}})));
  EXPECT_TRUE(zero_d.op.outputs(0).shape().empty());
  EXPECT_EQ(zero_d.values, std::vector<double>{1.5});
}

// In float32, the layouts that the CUDA backend runs on its broadcast paths
// (kernels/PERFORMANCE.md): x - m over rows of whole 16-byte packs, m a column, a row or
// a 0-d buffer, written through a view of whole rows of a wider buffer (the elements
// around it keep their values); and x - m over one axis with m 0-d, at a length of no
// whole number of packs, into a new buffer and in place.
TEST_F(ViewsTest, Float32BroadcastsOverWholeRowsAndZeroDimOperands) {
  constexpr size_t kRows = 37, kCols = 64, kWide = 72, kFirst = 4;
  const std::vector<float> x = Cast<float>(RandomDoubles(kRows * kCols, -5, 5, 4));
  const std::vector<float> col = Cast<float>(RandomDoubles(kRows, -5, 5, 5));
  const std::vector<float> row = Cast<float>(RandomDoubles(kCols, -5, 5, 6));
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x, {kRows, kCols}));
  ASSIGN_OR_FAIL(auto bcol, UploadArray(c(), col, {kRows, 1}));
  ASSIGN_OR_FAIL(auto brow, UploadArray(c(), row, {1, kCols}));
  ASSIGN_OR_FAIL(auto b0, UploadScalar(c(), 0.75f));
  ASSIGN_OR_FAIL(auto by, UploadArray(c(), std::vector<float>(kRows * kWide, -1), {kRows, kWide}));
  // y[:, 4:68]: rows of 64 elements, 16 bytes into rows of 72.
  v1::Output into = ExistingOutput(by.id());
  *into.mutable_view() =
      ViewOf(by.id(), "view { index { items { slice {} } items { slice { start: 4 stop: 68 } } } }")
          .view();
  const auto check = [&](const std::string& m, auto ref_m, const std::string& what) {
    ASSERT_OK(RunOp(
        c(), Elementwise("x - m", {{"x", BufferOperand(bx.id())}, {"m", BufferOperand(m)}}, into)))
        << what;
    ASSIGN_OR_FAIL(std::vector<float> y, DownloadArray<float>(c(), by.id()));
    std::vector<float> want(kRows * kWide, -1);
    for (size_t i = 0; i < kRows; ++i) {
      for (size_t j = 0; j < kCols; ++j)
        want[i * kWide + kFirst + j] = x[i * kCols + j] - ref_m(i, j);
    }
    EXPECT_EQ(y, want) << what;  // one float32 subtraction each: exact
  };
  check(
      bcol.id(), [&](size_t i, size_t) { return col[i]; }, "(n,1)");
  check(
      brow.id(), [&](size_t, size_t j) { return row[j]; }, "(1,m)");
  check(
      b0.id(), [&](size_t, size_t) { return 0.75f; }, "0-d");

  constexpr size_t kLength = 1003;
  const std::vector<float> line = Cast<float>(RandomDoubles(kLength, -5, 5, 7));
  ASSIGN_OR_FAIL(auto bline, UploadArray(c(), line));
  ASSIGN_OR_FAIL(v1::Operation op,
                 RunOp(c(), Elementwise("x - m", {{"x", BufferOperand(bline.id())},
                                                  {"m", BufferOperand(b0.id())}})));
  ASSIGN_OR_FAIL(std::vector<float> got, DownloadArray<float>(c(), op.outputs(0).id()));
  std::vector<float> want(kLength);
  for (size_t i = 0; i < kLength; ++i) want[i] = line[i] - 0.75f;
  EXPECT_EQ(got, want);

  // x -= m, in place.
  ASSERT_OK(RunOp(
      c(), Elementwise("x - m", {{"x", BufferOperand(bline.id())}, {"m", BufferOperand(b0.id())}},
                       ExistingOutput(bline.id()))));
  ASSIGN_OR_FAIL(got, DownloadArray<float>(c(), bline.id()));
  EXPECT_EQ(got, want);
}

TEST_F(ViewsTest, AnF_LayoutBufferMixesWithC_LayoutOperandsIntoAC_OrderedResult) {
  const std::vector<double> a = RandomDoubles(12, -1, 1, 4);  // logical (3, 4)
  const std::vector<double> b = RandomDoubles(12, -1, 1, 5);
  ASSIGN_OR_FAIL(auto ba, UploadArray(c(), ToMemory<double>(a, 3, 4, v1::LAYOUT_F), {3, 4},
                                      v1::LAYOUT_F));
  ASSIGN_OR_FAIL(auto bb, UploadArray(c(), b, {3, 4}));
  ASSIGN_OR_FAIL(Result r, Evaluate(c(), Elementwise("a * b", {{"a", BufferOperand(ba.id())},
                                                   {"b", BufferOperand(bb.id())}})));
  EXPECT_EQ(r.op.outputs(0).layout(), v1::LAYOUT_C);
  std::vector<double> ref;
  for (size_t k = 0; k < 12; ++k) ref.push_back(a[k] * b[k]);
  ExpectClose(r.values, ref, 0, 0, "F * C");
  // Two F-layout buffers of one shape keep F, as before views.
  ASSIGN_OR_FAIL(Result f, Evaluate(c(), Elementwise("a + a", {{"a", BufferOperand(ba.id())}})));
  EXPECT_EQ(f.op.outputs(0).layout(), v1::LAYOUT_F);
}

// A dense empty array can have stride 0 on an axis longer than 1 ((3, 0) has it on its
// axis of 3); it is no broadcast, so an operation may write a new one, as NumPy's does.
TEST_F(ViewsTest, EmptyArraysOfSeveralAxesTakeElementwiseOperations) {
  const std::vector<std::vector<uint64_t>> shapes = {{3, 0}, {4, 5, 0}, {0, 5}, {2, 0, 3}};
  for (const std::vector<uint64_t>& shape : shapes) {
    SCOPED_TRACE(::testing::PrintToString(shape));
    ASSIGN_OR_FAIL(auto x, UploadArray(c(), std::vector<double>{}, shape));
    ASSIGN_OR_FAIL(Result r, Evaluate(c(), Elementwise("x + 1", {{"x", BufferOperand(x.id())}})));
    EXPECT_EQ(std::vector<uint64_t>(r.op.outputs(0).shape().begin(),
                                    r.op.outputs(0).shape().end()),
              shape);
    EXPECT_TRUE(r.values.empty());
  }
}

TEST_F(ViewsTest, ViewsOfEveryKindReadTheElementsNumPyWould) {
  constexpr size_t kRows = 4, kCols = 6;
  const std::vector<double> x = Positions(kRows, kCols);
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x, {kRows, kCols}));
  const auto at = [&](int64_t i, int64_t j) { return x[static_cast<size_t>(i) * kCols + j]; };
  struct Case {
    std::string what;
    std::string steps;
    std::vector<uint64_t> shape;
    std::vector<double> want;  // C order
  };
  std::vector<Case> cases;
  {
    Case k{"x[::-1, 1::2]", "view { index { items { slice { step: -1 } } items { slice { start: 1 "
                            "step: 2 } } } }",
           {4, 3}, {}};
    for (int i = 3; i >= 0; --i) {
      for (int j = 1; j < 6; j += 2) k.want.push_back(at(i, j));
    }
    cases.push_back(k);
  }
  {
    Case k{"x[2]", "view { index { items { index: 2 } } }", {6}, {}};
    for (int j = 0; j < 6; ++j) k.want.push_back(at(2, j));
    cases.push_back(k);
  }
  {
    Case k{"x[:, -1]", "view { index { items { slice {} } items { index: -1 } } }", {4}, {}};
    for (int i = 0; i < 4; ++i) k.want.push_back(at(i, 5));
    cases.push_back(k);
  }
  {
    Case k{"x.T", "view { transpose {} }", {6, 4}, {}};
    for (int j = 0; j < 6; ++j) {
      for (int i = 0; i < 4; ++i) k.want.push_back(at(i, j));
    }
    cases.push_back(k);
  }
  {
    Case k{"expand_dims(x, 1)", "view { expand_dims { axes: 1 } }", {4, 1, 6}, x};
    cases.push_back(k);
  }
  {
    Case k{"squeeze(x[1:2])", "view { index { items { slice { start: 1 stop: 2 } } } } "
                              "view { squeeze {} }",
           {6}, {}};
    for (int j = 0; j < 6; ++j) k.want.push_back(at(1, j));
    cases.push_back(k);
  }
  {
    Case k{"broadcast_to(x[0], (3, 6))", "view { index { items { index: 0 } } } "
                                          "view { broadcast_to { extents: [3, 6] } }",
           {3, 6}, {}};
    for (int r = 0; r < 3; ++r) {
      for (int j = 0; j < 6; ++j) k.want.push_back(at(0, j));
    }
    cases.push_back(k);
  }
  {
    Case k{"x.reshape(3, -1)", "view { reshape { extents: [3, -1] } }", {3, 8}, x};
    cases.push_back(k);
  }
  {
    // A view of a view of a view: x.T[::-2][1], i.e. column 3 of x.
    Case k{"x.T[::-2][1]", "view { transpose {} } view { index { items { slice { step: -2 } } } } "
                           "view { index { items { index: 1 } } }",
           {4}, {}};
    for (int i = 0; i < 4; ++i) k.want.push_back(at(i, 3));
    cases.push_back(k);
  }
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    ASSIGN_OR_FAIL(Result r, Evaluate(c(), Elementwise("v + 0", {{"v", ViewOf(bx.id(), k.steps)}})));
    EXPECT_EQ(ShapeOf(r.op.outputs(0)), k.shape);
    EXPECT_EQ(r.values, k.want);
    // The same view downloaded: its elements in C order.
    v1::DownloadRequest request;
    request.set_buffer(bx.id());
    *request.mutable_view() = ViewOf(bx.id(), k.steps).view();
    std::string bytes;
    ASSIGN_OR_FAIL(v1::DownloadResponse response, c().Download(request, &bytes));
    EXPECT_EQ(response.buffer().id(), bx.id());
    // The first message describes the view, whose bytes the download counts.
    EXPECT_EQ(ShapeOf(response.buffer()), k.shape);
    EXPECT_EQ(response.buffer().size_bytes(), k.want.size() * 8);
    ASSERT_EQ(bytes.size(), k.want.size() * 8);
    std::vector<double> got(k.want.size());
    std::memcpy(got.data(), bytes.data(), bytes.size());
    EXPECT_EQ(got, k.want);
  }
}

TEST_F(ViewsTest, DownloadsOfViewsCountOffsetAndSizeInTheViewsBytes) {
  constexpr size_t kRows = 300, kCols = 500;  // views larger than one download chunk
  const std::vector<double> x = Positions(kRows, kCols);
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x, {kRows, kCols}));
  const uint64_t memory = MemoryUsed(c());
  for (const auto& [steps, contiguous] :
       std::vector<std::pair<std::string, bool>>{
           {"view { index { items { slice { start: 7 stop: 290 } } } }", true},
           {"view { transpose {} }", false}}) {
    SCOPED_TRACE(steps);
    std::vector<double> view;
    if (contiguous) {
      view.assign(x.begin() + 7 * kCols, x.begin() + 290 * kCols);
    } else {
      for (size_t j = 0; j < kCols; ++j) {
        for (size_t i = 0; i < kRows; ++i) view.push_back(x[i * kCols + j]);
      }
    }
    v1::DownloadRequest request;
    request.set_buffer(bx.id());
    *request.mutable_view() = ViewOf(bx.id(), steps).view();
    request.set_offset_bytes(8 * 1001);
    request.set_size_bytes(8 * 70000);
    request.set_chunk_bytes(65536);
    std::string bytes;
    ASSIGN_OR_FAIL(v1::DownloadResponse response, c().Download(request, &bytes));
    EXPECT_EQ(response.offset_bytes(), 8 * 1001);
    ASSERT_EQ(bytes.size(), 8u * 70000);
    std::vector<double> got(70000);
    std::memcpy(got.data(), bytes.data(), bytes.size());
    EXPECT_EQ(got, std::vector<double>(view.begin() + 1001, view.begin() + 71001));

    // A range beyond the view's bytes is refused, naming them.
    request.set_offset_bytes(view.size() * 8 - 8);
    request.set_size_bytes(16);
    absl::StatusOr<v1::DownloadResponse> beyond = c().Download(request, &bytes);
    EXPECT_EQ(beyond.status().code(), absl::StatusCode::kInvalidArgument);
    ExpectContains(std::string(beyond.status().message()), absl::StrCat("outside the view of ", bx.id()));
  }
  // The temporary of the strided download is gone with it.
  EXPECT_EQ(WaitForMemoryUsed(c(), memory), memory);
}

TEST_F(ViewsTest, WritingThroughAViewChangesOnlyItsElements) {
  constexpr size_t kRows = 5, kCols = 8;
  const std::vector<double> x = Positions(kRows, kCols);
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x, {kRows, kCols}));
  ASSIGN_OR_FAIL(auto by, UploadArray(c(), std::vector<double>(kRows * kCols, -1), {kRows, kCols}));

  // y[:, ::2] = x[:, 1::2] * 2
  v1::Output into = ExistingOutput(by.id());
  *into.mutable_view() =
      ViewOf(by.id(), "view { index { items { slice {} } items { slice { step: 2 } } } }").view();
  ASSIGN_OR_FAIL(
      Result r,
      Evaluate(c(), Elementwise("v * 2",
               {{"v", ViewOf(bx.id(), "view { index { items { slice {} } items { slice { start: 1 "
                                      "step: 2 } } } }")}},
               into)));
  EXPECT_EQ(r.op.timing().bytes_written(), kRows * kCols / 2 * 8);
  std::vector<double> want(kRows * kCols, -1);
  for (size_t i = 0; i < kRows; ++i) {
    for (size_t j = 0; j < kCols; j += 2) want[i * kCols + j] = x[i * kCols + j + 1] * 2;
  }
  EXPECT_EQ(r.values, want);

  // x[1:4, ::-1] += 1, in place through the same view of the same buffer.
  const std::string rows = "view { index { items { slice { start: 1 stop: 4 } } items { slice { "
                           "step: -1 } } } }";
  v1::Output in_place = ExistingOutput(bx.id());
  *in_place.mutable_view() = ViewOf(bx.id(), rows).view();
  ASSIGN_OR_FAIL(Result inc, Evaluate(c(), Elementwise("v + 1", {{"v", ViewOf(bx.id(), rows)}}, in_place)));
  std::vector<double> want_x = x;
  for (size_t i = 1; i < 4; ++i) {
    for (size_t j = 0; j < kCols; ++j) want_x[i * kCols + j] += 1;
  }
  EXPECT_EQ(inc.values, want_x);
  // The buffer both read and written is one access, the write.
  EXPECT_EQ(inc.op.timing().bytes_read(), 3 * kCols * 8);
}

TEST_F(ViewsTest, RefusedViewWritesChangeNothing) {
  const std::vector<double> x = Positions(4, 6);
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x, {4, 6}, v1::LAYOUT_C, "x"));
  // x[:, 1:] = x[:, :-1] + 1: NumPy's answer would depend on the order of the writes.
  v1::Output shifted = ExistingOutput("x");
  *shifted.mutable_view() =
      ViewOf("x", "view { index { items { slice {} } items { slice { start: 1 } } } }").view();
  ExpectRejected(
      c(),
      Waiting(Elementwise(
          "v + 1",
          {{"v", ViewOf("x", "view { index { items { slice {} } items { slice { stop: -1 } } } }")}},
          shifted)),
      absl::StatusCode::kInvalidArgument,
      "output view 'x' (float64(4,6)) viewed as (4,5) overlaps input 'v' 'x' (float64(4,6)) "
      "viewed as (4,5) only partly; NumPy's result would depend on the order of the writes",
      {"x"});
  // A broadcast view is read-only.
  v1::Output stretched = ExistingOutput("x");
  *stretched.mutable_view() =
      ViewOf("x", "view { index { items { index: 0 } } } view { broadcast_to { extents: [4, 6] } }")
          .view();
  ExpectRejected(c(), Waiting(Elementwise("x * 0", {{"x", BufferOperand("x")}}, stretched)),
                 absl::StatusCode::kInvalidArgument,
                 "output 'x' (float64(4,6)) broadcasts (stride 0 on an axis longer than 1): it "
                 "may be read, not written",
                 {"x"});
}

TEST_F(ViewsTest, AViewOfADeletedBufferIsNotFoundWhileWorkQueuedThroughItCompletes) {
  const std::vector<double> base = Iota(kBig);
  ASSIGN_OR_FAIL(auto big, UploadArray(c(), base));
  ASSIGN_OR_FAIL(v1::StreamInfo stream, c().CreateStream());
  QueueChain(c(), big.id(), kChain, stream.id());
  // big[::-3] * 2, queued behind the chain through a view, then the base deleted.
  const std::string steps = "view { index { items { slice { step: -3 } } } }";
  ASSIGN_OR_FAIL(v1::Operation op,
                 c().Submit(OnStream(Elementwise("v * 2", {{"v", ViewOf(big.id(), steps)}}),
                                     stream.id())));
  ASSERT_OK(c().DeleteBuffer(big.id()));
  ASSIGN_OR_FAIL(v1::Operation done, c().WaitOperation(op.id(), 60));
  ASSERT_EQ(done.state(), v1::Operation::STATE_SUCCEEDED) << done.error_message();
  ASSIGN_OR_FAIL(auto got, DownloadArray<double>(c(), done.outputs(0).id()));
  std::vector<double> want;
  for (int64_t i = static_cast<int64_t>(kBig) - 1; i >= 0; i -= 3) {
    want.push_back((base[static_cast<size_t>(i)] + kChain) * 2);
  }
  EXPECT_EQ(got, want);

  absl::StatusOr<v1::Operation> later =
      c().Submit(Waiting(Elementwise("v * 2", {{"v", ViewOf(big.id(), steps)}})));
  EXPECT_EQ(later.status().code(), absl::StatusCode::kNotFound);
  ExpectContains(std::string(later.status().message()), "input 'v'");
  v1::DownloadRequest request;
  request.set_buffer(big.id());
  *request.mutable_view() = ViewOf(big.id(), steps).view();
  std::string bytes;
  EXPECT_EQ(c().Download(request, &bytes).status().code(), absl::StatusCode::kNotFound);
}

// A backend without strided kernels (ForwardingBackend leaves ElementwiseStrided to the
// default, UNIMPLEMENTED): the copy a strided view's download needs fails, and so does
// the download, rather than streaming what the temporary held.
TEST(ViewDownloadTest, AFailedCopyOfAViewFailsItsDownload) {
  std::unique_ptr<TestServer> server =
      TestServer::StartWith(std::make_unique<ForwardingBackend>(std::make_unique<cpu::CpuBackend>(2)));
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> client = server->Connect("views");
  ASSERT_NE(client, nullptr);
  ASSIGN_OR_FAIL(auto bx, UploadArray(*client, Positions(3, 5), {3, 5}));
  v1::DownloadRequest request;
  request.set_buffer(bx.id());
  *request.mutable_view() = ViewOf(bx.id(), "view { transpose {} }").view();
  std::string bytes;
  absl::StatusOr<v1::DownloadResponse> response = client->Download(request, &bytes);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnimplemented) << response.status();
  ExpectContains(std::string(response.status().message()),
                 "copying the view in C order: the cpu backend has no strided elementwise kernels");
  // A C-ordered view needs no copy.
  *request.mutable_view() = ViewOf(bx.id(), "view { index { items { index: 1 } } }").view();
  ASSIGN_OR_FAIL(v1::DownloadResponse row, client->Download(request, &bytes));
  EXPECT_EQ(bytes.size(), 5u * 8);
}

TEST_F(ViewsTest, UsingAViewRenewsItsBuffersLease) {
  v1::CreateBufferRequest create;
  create.set_dtype(v1::DTYPE_FLOAT64);
  create.add_shape(4);
  create.add_shape(4);
  create.set_ttl_seconds(3600);
  ASSIGN_OR_FAIL(v1::BufferInfo b, c().CreateBuffer(create));
  const int64_t first = b.lease_expire_time_unix_nanos();
  ASSERT_GT(first, 0);
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_OK(RunOp(c(), Elementwise("v + 1", {{"v", ViewOf(b.id(), "view { transpose {} }")}})));
  ASSIGN_OR_FAIL(v1::BufferInfo after_op, c().GetBuffer(b.id()));
  EXPECT_GT(after_op.lease_expire_time_unix_nanos(), first);
  absl::SleepFor(absl::Milliseconds(20));
  v1::DownloadRequest request;
  request.set_buffer(b.id());
  *request.mutable_view() = ViewOf(b.id(), "view { transpose {} }").view();
  std::string bytes;
  ASSERT_OK(c().Download(request, &bytes));
  ASSIGN_OR_FAIL(v1::BufferInfo after_download, c().GetBuffer(b.id()));
  EXPECT_GT(after_download.lease_expire_time_unix_nanos(), after_op.lease_expire_time_unix_nanos());
}

TEST_F(ViewsTest, AReplayedChainReadsAndWritesThroughItsViews) {
  constexpr size_t kRows = 6, kCols = 10;
  std::vector<double> x = Positions(kRows, kCols);
  const std::vector<double> m = RandomDoubles(kRows, -1, 1, 9);
  ASSERT_OK(UploadArray(c(), x, {kRows, kCols}, v1::LAYOUT_C, "x"));
  ASSERT_OK(UploadArray(c(), m, {kRows, 1}, v1::LAYOUT_C, "m"));
  ASSERT_OK(UploadArray(c(), std::vector<double>(kRows * kCols, 0), {kCols, kRows}, v1::LAYOUT_C,
                        "y"));
  // t = x.T[::-1] - m.T ; y[:, ::2] = t[:, ::2] * 2 ; x[0] += 1
  Chain chain;
  chain.Add(Elementwise("a - b", {{"a", ViewOf("x", "view { transpose {} } view { index { items { "
                                                    "slice { step: -1 } } } }")},
                                  {"b", ViewOf("m", "view { transpose {} }")}}),
            "t");
  v1::Output even = ExistingOutput("y");
  *even.mutable_view() =
      ViewOf("y", "view { index { items { slice {} } items { slice { step: 2 } } } }").view();
  v1::Operand t_even = Tagged("t");
  *t_even.mutable_view() =
      ViewOf("t", "view { index { items { slice {} } items { slice { step: 2 } } } }").view();
  chain.Add(Elementwise("t * 2", {{"t", t_even}}, even), "into_y");
  v1::Output row0 = ExistingOutput("x");
  *row0.mutable_view() = ViewOf("x", "view { index { items { index: 0 } } }").view();
  chain.Add(Elementwise("r + 1", {{"r", ViewOf("x", "view { index { items { index: 0 } } }")}},
                        row0),
            "bump");
  std::set<std::string> ids;
  for (int run = 0; run < 4; ++run) {
    SCOPED_TRACE(absl::StrCat("run ", run));
    ASSIGN_OR_FAIL(v1::ChainResponse response, chain.Run(c()));
    for (const v1::ChainStepResult& step : response.steps()) {
      ASSERT_EQ(step.operation().state(), v1::Operation::STATE_SUCCEEDED)
          << step.tag() << ": " << step.operation().error_message();
    }
    if (run >= 1) {
      EXPECT_EQ(response.steps(0).operation().id(), response.steps(2).operation().id());
    }
    std::vector<double> want_y(kRows * kCols, 0);
    for (size_t i = 0; i < kCols; ++i) {      // t is (kCols, kRows)
      for (size_t j = 0; j < kRows; j += 2) {  // t[i, j] = x[j, kCols - 1 - i] - m[j]
        want_y[i * kRows + j] = (x[j * kCols + (kCols - 1 - i)] - m[j]) * 2;
      }
    }
    for (size_t j = 0; j < kCols; ++j) x[j] += 1;
    ASSIGN_OR_FAIL(auto y, DownloadArray<double>(c(), "y"));
    EXPECT_EQ(y, want_y);
    ASSIGN_OR_FAIL(auto got_x, DownloadArray<double>(c(), "x"));
    EXPECT_EQ(got_x, x);
  }
}

}  // namespace
}  // namespace gpucompute::testing
