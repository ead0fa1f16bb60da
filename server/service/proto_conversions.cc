// Conversions between the API's messages and the server's types (proto_conversions.h).
#include "server/service/proto_conversions.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gpucompute {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      BoundedErrorMessage(status.message()));
}

namespace {

// The end of the longest prefix of `text` of at most `bytes` that does not split a UTF-8
// sequence (a cut before a continuation byte would leave invalid UTF-8).
size_t Utf8Floor(absl::string_view text, size_t bytes) {
  while (bytes > 0 && bytes < text.size() &&
         (static_cast<unsigned char>(text[bytes]) & 0xC0) == 0x80) {
    --bytes;
  }
  return bytes;
}

}  // namespace

std::string BoundedErrorMessage(absl::string_view message) {
  if (message.size() <= kMaxErrorMessageBytes) return std::string(message);
  constexpr size_t kKeep = (kMaxErrorMessageBytes - 64) / 2;
  const size_t head = Utf8Floor(message, kKeep);
  const size_t tail = Utf8Floor(message, message.size() - kKeep);
  return absl::StrCat(message.substr(0, head), "... [", tail - head, " bytes left out] ...",
                      message.substr(tail));
}

absl::StatusOr<DType> FromProto(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return DType::kFloat32;
    case v1::DTYPE_FLOAT64:
      return DType::kFloat64;
    case v1::DTYPE_INT32:
      return DType::kInt32;
    case v1::DTYPE_INT64:
      return DType::kInt64;
    case v1::DTYPE_BOOL:
      return DType::kBool;
    case v1::DTYPE_UNSPECIFIED:
      return absl::InvalidArgumentError("dtype is required");
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
}

v1::DType ToProto(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return v1::DTYPE_FLOAT32;
    case DType::kFloat64:
      return v1::DTYPE_FLOAT64;
    case DType::kInt32:
      return v1::DTYPE_INT32;
    case DType::kInt64:
      return v1::DTYPE_INT64;
    case DType::kBool:
      return v1::DTYPE_BOOL;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<Layout> FromProto(v1::Layout layout) {
  switch (layout) {
    case v1::LAYOUT_UNSPECIFIED:
    case v1::LAYOUT_C:
      return Layout::kC;
    case v1::LAYOUT_F:
      return Layout::kF;
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown layout ", static_cast<int>(layout)));
}

v1::OperationKind ToProto(OperationKind kind) {
  switch (kind) {
    case OperationKind::kElementwise:
      return v1::OPERATION_KIND_ELEMENTWISE;
    case OperationKind::kGemv:
      return v1::OPERATION_KIND_GEMV;
    case OperationKind::kReduce:
      return v1::OPERATION_KIND_REDUCE;
    case OperationKind::kRandom:
      return v1::OPERATION_KIND_RANDOM;
    case OperationKind::kFill:
      return v1::OPERATION_KIND_FILL;
    case OperationKind::kCopy:
      return v1::OPERATION_KIND_COPY;
    case OperationKind::kUpload:
      return v1::OPERATION_KIND_UPLOAD;
    case OperationKind::kDownload:
      return v1::OPERATION_KIND_DOWNLOAD;
    case OperationKind::kMatmul:
      return v1::OPERATION_KIND_MATMUL;
  }
  return v1::OPERATION_KIND_UNSPECIFIED;
}

void ToProto(const BufferMeta& meta, v1::BufferInfo* info) {
  info->set_id(meta.id);
  info->set_name(meta.name);
  info->set_dtype(ToProto(meta.dtype));
  for (uint64_t d : meta.shape) info->add_shape(d);
  info->set_layout(meta.layout == Layout::kF ? v1::LAYOUT_F : v1::LAYOUT_C);
  info->set_size_bytes(meta.size_bytes());
  info->set_device(meta.device);
  info->set_create_time_unix_nanos(meta.create_time_unix_nanos);
}

LeaseClocks LeaseClocks::Now() { return {SteadyNanos(), absl::ToUnixNanos(absl::Now())}; }

LeaseReport ReportLease(const Lease& lease, const LeaseClocks& now) {
  const int64_t ttl = lease.ttl_nanos.load();
  if (ttl == 0) return {};
  // A lease held by a writer starts when the writer completes: a ttl from now at the
  // earliest.
  const int64_t remaining = lease.held() ? ttl : lease.deadline_nanos.load() - now.steady_nanos;
  // The deadline is on the steady clock; the API speaks wall-clock time.
  return {static_cast<double>(ttl) / 1e9, now.unix_nanos + remaining};
}

namespace {

// Sets info's ttl and expiry from `lease`; neither without a lease.
void LeaseToProto(const Lease& lease, v1::BufferInfo* info) {
  const LeaseReport report = ReportLease(lease, LeaseClocks::Now());
  if (report.ttl_seconds == 0) return;
  info->set_ttl_seconds(report.ttl_seconds);
  info->set_lease_expire_time_unix_nanos(report.expire_time_unix_nanos);
}

}  // namespace

void ToProto(const BufferEntry& entry, v1::BufferInfo* info) {
  ToProto(static_cast<const BufferMeta&>(entry), info);
  LeaseToProto(entry.lease, info);
}

void LiveLeaseToProto(const BufferMeta& meta, v1::BufferInfo* info) {
  if (std::shared_ptr<const Lease> lease = meta.live_lease.lock()) LeaseToProto(*lease, info);
}

v1::Operation::State ToProto(OperationStatus::State s) {
  switch (s) {
    case OperationStatus::State::kQueued:
      return v1::Operation::STATE_QUEUED;
    case OperationStatus::State::kRunning:
      return v1::Operation::STATE_RUNNING;
    case OperationStatus::State::kSucceeded:
      return v1::Operation::STATE_SUCCEEDED;
    case OperationStatus::State::kFailed:
      return v1::Operation::STATE_FAILED;
  }
  return v1::Operation::STATE_UNSPECIFIED;
}

void AppendValues(const OpResult& r, v1::Operation* op) {
  const size_t itemsize = DTypeSize(r.values_dtype);
  for (size_t off = 0; off + itemsize <= r.values.size(); off += itemsize) {
    v1::Scalar* s = op->add_values();
    VisitDType(r.values_dtype, [&](auto zero) {
      using T = decltype(zero);
      if constexpr (std::is_same_v<T, bool>) {
        s->set_bool_value(r.values[off] != 0);
      } else {
        T v;
        std::memcpy(&v, r.values.data() + off, sizeof(T));
        if constexpr (std::is_floating_point_v<T>) {
          s->set_float_value(v);
        } else {
          s->set_int_value(v);
        }
      }
    });
  }
}

void ToProto(const OperationStatus& status, v1::Operation* op) {
  op->set_id(status.id);
  op->set_kind(ToProto(status.kind));
  op->set_stream_id(status.stream_id);
  for (const BufferMeta& m : status.outputs) {
    v1::BufferInfo* info = op->add_outputs();
    ToProto(m, info);
    // As GetBuffer reports it now: the lease has run since the operation was queued.
    LiveLeaseToProto(m, info);
  }
  ToProtoOutcome(status, op);
}

void SetError(const absl::Status& error, v1::Operation* op) {
  op->set_error_code(static_cast<int32_t>(error.code()));
  op->set_error_message(BoundedErrorMessage(error.message()));
}

void SetDeviceSeconds(double seconds, v1::Timing* t) {
  t->set_device_seconds(seconds);
  if (seconds <= 0) return;
  t->set_gbps(static_cast<double>(t->bytes_read() + t->bytes_written()) / seconds / 1e9);
  t->set_gflops(static_cast<double>(t->flops()) / seconds / 1e9);
}

void ToProtoOutcome(const OperationStatus& status, v1::Operation* op) {
  op->set_state(ToProto(status.state));
  op->set_done(status.done());
  if (!status.error.ok()) SetError(status.error, op);
  if (!status.done()) return;
  v1::Timing* t = op->mutable_timing();
  const OpTiming& ti = status.timing;
  t->set_queued_seconds(ti.queued_seconds);
  t->set_graph_operations(ti.graph_operations);
  t->set_compile_seconds(ti.compile_seconds);
  t->set_bytes_read(ti.bytes_read);
  t->set_bytes_written(ti.bytes_written);
  t->set_flops(ti.flops);
  SetDeviceSeconds(ti.device_seconds, t);
  t->set_stream_id(status.stream_id);
  t->set_device(status.device);
  AppendValues(status.result, op);
  op->set_next_offset(status.result.next_offset);
}

absl::StatusOr<uint64_t> ScalarBits(const v1::Scalar& scalar, DType dtype) {
  return VisitDType(dtype, [&](auto zero) -> absl::StatusOr<uint64_t> {
    using T = decltype(zero);
    uint64_t bits = 0;
    auto store = [&](auto v) {
      if constexpr (std::is_same_v<T, bool>) {
        const uint8_t b = v ? 1 : 0;
        std::memcpy(&bits, &b, 1);
      } else {
        const T t = static_cast<T>(v);
        std::memcpy(&bits, &t, sizeof(T));
      }
      return bits;
    };
    switch (scalar.value_case()) {
      case v1::Scalar::kBoolValue:
        return store(scalar.bool_value());
      case v1::Scalar::kIntValue: {
        const int64_t i = scalar.int_value();
        if constexpr (std::is_same_v<T, bool>) {
          if (i != 0 && i != 1)
            return absl::InvalidArgumentError(absl::StrCat(i, " is not a bool (0 or 1)"));
        } else if constexpr (std::is_same_v<T, int32_t>) {
          if (i < std::numeric_limits<int32_t>::min() || i > std::numeric_limits<int32_t>::max()) {
            return absl::InvalidArgumentError(absl::StrCat(i, " does not fit in int32"));
          }
        }
        return store(i);
      }
      case v1::Scalar::kFloatValue: {
        const double f = scalar.float_value();
        if constexpr (std::is_integral_v<T>) {
          // A float may go into an integer buffer only when it is an exact integer in range.
          const double lo =
              std::is_same_v<T, bool> ? 0.0 : static_cast<double>(std::numeric_limits<T>::min());
          const double hi =
              std::is_same_v<T, bool> ? 1.0 : static_cast<double>(std::numeric_limits<T>::max());
          if (!std::isfinite(f) || f != std::trunc(f) || f < lo || f >= hi + 1.0) {
            return absl::InvalidArgumentError(
                absl::StrCat(f, " cannot be stored exactly in a ", DTypeName(dtype), " buffer"));
          }
        }
        return store(f);
      }
      case v1::Scalar::VALUE_NOT_SET:
        break;
    }
    return absl::InvalidArgumentError("scalar has no value");
  });
}

}  // namespace gpucompute
