// The Client's operations: Submit and the waits, asynchronous submissions in order
// (SubmitAsync and the registry of calls in flight), and the request builders.
#include <algorithm>
#include <chrono>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "client/cpp/client.h"
#include "client/cpp/client_internal.h"

namespace gpucompute {

using client_internal::SettingsOf;

namespace client_internal {

// Submits an operation and then waits for it with WaitOperation, each step started
// from the previous one's callback, until it is done, an RPC fails or it is cancelled.
// Owns everything the RPCs use; the callbacks hold it alive.
class AsyncOperationCall : public std::enable_shared_from_this<AsyncOperationCall> {
 public:
  AsyncOperationCall(CallSettings settings, v1::OperationService::Stub* stub,
                     std::shared_ptr<AsyncCallRegistry> registry, v1::SubmitRequest request)
      : settings_(std::move(settings)),
        stub_(stub),
        registry_(std::move(registry)),
        submit_request_(std::move(request)) {
    submit_request_.set_wait(false);
    submit_request_.set_wait_timeout_seconds(0);
  }

  ~AsyncOperationCall() { registry_->Remove(this); }

  std::shared_future<absl::StatusOr<v1::Operation>> future() {
    return promise_.get_future().share();
  }

  void Start() {
    registry_->Add(this, weak_from_this());
    registry_->QueueSubmit(shared_from_this());
  }

  // Sends the Submit RPC; called by the registry in submission order.
  void SendSubmit() {
    std::shared_ptr<grpc::ClientContext> context = NextContext();
    if (context == nullptr) {
      registry_->SubmitAnswered();
      return;
    }
    if (context == nullptr) return;
    stub_->async()->Submit(context.get(), &submit_request_, &response_,
                           [self = shared_from_this()](grpc::Status status) {
                             self->registry_->SubmitAnswered();
                             self->OnReply(status);
                           });
  }

  // For a call cancelled before its Submit was sent.
  void ResolveCancelled() { promise_.set_value(absl::CancelledError("the client was destroyed")); }

  // Cancels the RPC in flight and starts no other; the future resolves to CANCELLED.
  void Cancel() {
    std::shared_ptr<grpc::ClientContext> context;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      context = context_;
    }
    // Outside the lock: gRPC may run the call's callback inside TryCancel.
    if (context != nullptr) context->TryCancel();
  }

 private:
  // A fresh context for the next RPC (one context serves one call), or null when
  // cancelled (the future is then resolved). A context cancelled before its call
  // starts cancels the call when it does.
  std::shared_ptr<grpc::ClientContext> NextContext() {
    std::shared_ptr<grpc::ClientContext> context = MakeContext(settings_, /*unary=*/true);
    absl::MutexLock lock(&mu_);
    if (cancelled_) {
      promise_.set_value(absl::CancelledError("the client was destroyed"));
      return nullptr;
    }
    // The finished call holds its own reference until its callback returns, so the
    // context it used can go now.
    context_ = context;
    return context;
  }

  // Runs on a gRPC thread: never blocks, only starts the next RPC or resolves.
  void OnReply(const grpc::Status& status) {
    if (!status.ok()) {
      promise_.set_value(FromGrpcStatus(status));
      return;
    }
    if (response_.done()) {
      promise_.set_value(std::move(response_));
      return;
    }
    // A WaitOperation that returns before the operation is done (the server bounds
    // its waits) is simply repeated.
    wait_request_.set_operation_id(response_.id());
    std::shared_ptr<grpc::ClientContext> context = NextContext();
    if (context == nullptr) return;
    stub_->async()->WaitOperation(
        context.get(), &wait_request_, &response_,
        [self = shared_from_this()](grpc::Status status) { self->OnReply(status); });
  }

  const CallSettings settings_;
  v1::OperationService::Stub* const stub_;
  const std::shared_ptr<AsyncCallRegistry> registry_;
  std::promise<absl::StatusOr<v1::Operation>> promise_;
  v1::SubmitRequest submit_request_;
  v1::WaitOperationRequest wait_request_;
  v1::Operation response_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<grpc::ClientContext> context_ ABSL_GUARDED_BY(mu_);
};

void AsyncCallRegistry::QueueSubmit(std::shared_ptr<AsyncOperationCall> call) {
  {
    absl::MutexLock lock(&mu_);
    if (submitting_) {
      submit_queue_.push_back(std::move(call));
      return;
    }
    submitting_ = true;
  }
  call->SendSubmit();
}

void AsyncCallRegistry::SubmitAnswered() {
  std::shared_ptr<AsyncOperationCall> next;
  {
    absl::MutexLock lock(&mu_);
    if (submit_queue_.empty()) {
      submitting_ = false;
      return;
    }
    next = std::move(submit_queue_.front());
    submit_queue_.pop_front();
  }
  next->SendSubmit();
}

void AsyncCallRegistry::WaitForSubmissions() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](bool* submitting) { return !*submitting; }, &submitting_));
}

void AsyncCallRegistry::CancelAllAndWait() {
  std::deque<std::shared_ptr<AsyncOperationCall>> unsent;
  {
    absl::MutexLock lock(&mu_);
    unsent.swap(submit_queue_);
  }
  for (const std::shared_ptr<AsyncOperationCall>& call : unsent) call->ResolveCancelled();
  unsent.clear();
  std::vector<std::shared_ptr<AsyncOperationCall>> live;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [call, handle] : calls_) {
      if (std::shared_ptr<AsyncOperationCall> strong = handle.lock()) live.push_back(strong);
    }
  }
  for (const std::shared_ptr<AsyncOperationCall>& call : live) call->Cancel();
  // Dropping these may destroy calls, which take mu_.
  live.clear();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::map<AsyncOperationCall*, std::weak_ptr<AsyncOperationCall>>* calls) {
        return calls->empty();
      },
      &calls_));
}

}  // namespace client_internal

bool OperationFuture::Ready() const {
  return future_.valid() && future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

bool OperationFuture::Wait(absl::Duration timeout) const {
  if (!future_.valid()) return false;
  if (timeout == absl::InfiniteDuration()) {
    future_.wait();
    return true;
  }
  return future_.wait_for(absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration()))) ==
         std::future_status::ready;
}

absl::StatusOr<v1::Operation> Client::Submit(const v1::SubmitRequest& request) {
  async_calls_->WaitForSubmissions();
  return Unary(&Stubs::operations, &v1::OperationService::Stub::Submit, request);
}

absl::StatusOr<v1::Operation> Client::GetOperation(std::string_view id) {
  v1::GetOperationRequest request;
  request.set_operation_id(std::string(id));
  return Unary(&Stubs::operations, &v1::OperationService::Stub::GetOperation, request);
}

absl::StatusOr<v1::Operation> Client::WaitOperation(std::string_view id, double timeout_seconds) {
  v1::WaitOperationRequest request;
  request.set_operation_id(std::string(id));
  request.set_timeout_seconds(timeout_seconds);
  return Unary(&Stubs::operations, &v1::OperationService::Stub::WaitOperation, request);
}

OperationFuture Client::SubmitAsync(v1::SubmitRequest request) {
  auto call = std::make_shared<client_internal::AsyncOperationCall>(
      SettingsOf(options_), connection()->stubs.operations.get(), async_calls_, std::move(request));
  OperationFuture future(call->future());
  call->Start();
  return future;
}

v1::Operand BufferOperand(const ArrayRef& buffer) {
  v1::Operand operand;
  operand.set_buffer(buffer.buffer());
  *operand.mutable_view() = buffer.steps();
  return operand;
}

v1::Operand ScalarOperand(double value) {
  v1::Operand operand;
  operand.mutable_scalar()->set_float_value(value);
  return operand;
}

v1::Operand ScalarOperand(int64_t value) {
  v1::Operand operand;
  operand.mutable_scalar()->set_int_value(value);
  return operand;
}

v1::Operand ScalarOperand(int value) { return ScalarOperand(static_cast<int64_t>(value)); }

v1::Operand ScalarOperand(bool value) {
  v1::Operand operand;
  operand.mutable_scalar()->set_bool_value(value);
  return operand;
}

v1::Output ExistingOutput(const ArrayRef& buffer) {
  v1::Output output;
  output.set_buffer(buffer.buffer());
  *output.mutable_view() = buffer.steps();
  return output;
}

v1::Output NewOutput(std::string_view name, v1::DType dtype) {
  v1::Output output;
  output.set_name(std::string(name));
  output.set_dtype(dtype);
  return output;
}

v1::SubmitRequest Elementwise(std::string_view expression, NamedOperands inputs,
                              v1::Output output) {
  v1::SubmitRequest request;
  v1::ElementwiseOp* op = request.mutable_elementwise();
  op->set_expression(std::string(expression));
  for (const auto& [name, operand] : inputs) {
    (*op->mutable_inputs())[std::string(name)] = operand;
  }
  *op->mutable_output() = std::move(output);
  return request;
}

v1::SubmitRequest Reduce(v1::ReduceKind kind, const ArrayRef& input, std::optional<int> axis,
                         v1::Output output) {
  v1::SubmitRequest request;
  v1::ReduceOp* op = request.mutable_reduce();
  op->set_input(input.buffer());
  *op->mutable_input_view() = input.steps();
  op->set_kind(kind);
  if (axis.has_value()) op->set_axis(*axis);
  *op->mutable_output() = std::move(output);
  return request;
}

namespace {

// The ReduceOp of `kind` with `options` and `output`; its input is the caller's to set.
v1::SubmitRequest ReduceRequest(v1::ReduceKind kind, const ReduceOptions& options,
                                v1::Output output) {
  v1::SubmitRequest request;
  v1::ReduceOp* op = request.mutable_reduce();
  op->set_kind(kind);
  if (options.axes.has_value()) {
    // Present even when empty: axis=() reduces nothing.
    op->mutable_axes()->mutable_axes()->Add(options.axes->begin(), options.axes->end());
  }
  op->set_keepdims(options.keepdims);
  op->set_ddof(options.ddof);
  *op->mutable_output() = std::move(output);
  return request;
}

}  // namespace

v1::SubmitRequest ReduceOver(v1::ReduceKind kind, const ArrayRef& input,
                             const ReduceOptions& options, v1::Output output) {
  v1::SubmitRequest request = ReduceRequest(kind, options, std::move(output));
  request.mutable_reduce()->set_input(input.buffer());
  *request.mutable_reduce()->mutable_input_view() = input.steps();
  return request;
}

v1::SubmitRequest ReduceExpression(v1::ReduceKind kind, std::string_view expression,
                                   NamedOperands inputs, const ReduceOptions& options,
                                   v1::Output output) {
  v1::SubmitRequest request = ReduceRequest(kind, options, std::move(output));
  v1::ReduceOp* op = request.mutable_reduce();
  op->set_expression(std::string(expression));
  for (const auto& [name, operand] : inputs) {
    (*op->mutable_inputs())[std::string(name)] = operand;
  }
  return request;
}

v1::SubmitRequest Gemv(const ArrayRef& a, const ArrayRef& x, v1::Output y, bool transpose,
                       double alpha, double beta) {
  v1::SubmitRequest request;
  v1::GemvOp* op = request.mutable_gemv();
  op->set_a(a.buffer());
  *op->mutable_a_view() = a.steps();
  op->set_x(x.buffer());
  *op->mutable_x_view() = x.steps();
  *op->mutable_y() = std::move(y);
  op->set_transpose(transpose);
  op->set_alpha(alpha);
  op->set_beta(beta);
  return request;
}

v1::SubmitRequest Matmul(const ArrayRef& a, const ArrayRef& b, v1::Output c,
                         const MatmulOptions& options) {
  v1::SubmitRequest request;
  v1::MatmulOp* op = request.mutable_matmul();
  op->set_a(a.buffer());
  *op->mutable_a_view() = a.steps();
  op->set_b(b.buffer());
  *op->mutable_b_view() = b.steps();
  *op->mutable_c() = std::move(c);
  op->set_transpose_a(options.transpose_a);
  op->set_transpose_b(options.transpose_b);
  op->set_alpha(options.alpha);
  op->set_beta(options.beta);
  op->set_allow_tf32(options.allow_tf32);
  return request;
}

v1::DownloadRequest DownloadOf(const ArrayRef& array) {
  v1::DownloadRequest request;
  request.set_buffer(array.buffer());
  *request.mutable_view() = array.steps();
  return request;
}

v1::SubmitRequest Random(v1::Distribution distribution, const std::vector<uint64_t>& shape,
                         v1::DType dtype, uint64_t seed, v1::Output output) {
  v1::SubmitRequest request;
  v1::RandomOp* op = request.mutable_random();
  op->set_distribution(distribution);
  if (distribution == v1::DISTRIBUTION_NORMAL) op->set_normal_transform(v1::NORMAL_TRANSFORM_V2);
  for (uint64_t dimension : shape) op->add_shape(dimension);
  op->set_seed(seed);
  if (output.dtype() == v1::DTYPE_UNSPECIFIED) output.set_dtype(dtype);
  *op->mutable_output() = std::move(output);
  return request;
}

}  // namespace gpucompute
