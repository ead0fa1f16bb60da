// Output of the gpucompute CLI: human-readable lines, JSON, and the progress bar.
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/cli.h"

namespace gpucompute::cli {
namespace {

// Transfers below this finish too fast for a progress bar to help.
constexpr uint64_t kProgressMinBytes = uint64_t{8} << 20;
constexpr int64_t kProgressRedrawNanos = 100'000'000;

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

template <typename T>
std::string ShortestText(T value) {
  char text[64];
  const std::to_chars_result result = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, result.ptr);
}

}  // namespace

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"kB", "MB", "GB", "TB", "PB", "EB"};
  if (bytes < 1000) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes) / 1000;
  size_t unit = 0;
  while (value >= 999.95 && unit + 1 < std::size(kUnits)) {
    value /= 1000;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string FormatMilliseconds(double seconds) { return absl::StrFormat("%.3f ms", seconds * 1e3); }

std::string FormatRate(double value) {
  if (value >= 100) return absl::StrFormat("%.0f", value);
  if (value >= 10) return absl::StrFormat("%.1f", value);
  if (value >= 1) return absl::StrFormat("%.2f", value);
  // Three significant digits, so that a slow transfer never reads as 0.00.
  return absl::StrFormat("%.3g", value);
}

std::string FormatDType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return "float32";
    case v1::DTYPE_FLOAT64:
      return "float64";
    case v1::DTYPE_INT32:
      return "int32";
    case v1::DTYPE_INT64:
      return "int64";
    case v1::DTYPE_BOOL:
      return "bool";
    default:
      break;
  }
  return absl::StrCat("dtype", static_cast<int>(dtype));
}

std::string FormatArrayType(v1::DType dtype, std::span<const uint64_t> shape) {
  return absl::StrCat(FormatDType(dtype), "[", absl::StrJoin(shape, ","), "]");
}

std::string FormatBufferRef(const v1::BufferInfo& buffer) {
  std::string text = buffer.id();
  if (!buffer.name().empty()) absl::StrAppend(&text, " (", buffer.name(), ")");
  absl::StrAppend(&text, " ",
                  FormatArrayType(buffer.dtype(), std::span<const uint64_t>(
                                                      buffer.shape().data(),
                                                      static_cast<size_t>(buffer.shape_size()))));
  if (buffer.layout() == v1::LAYOUT_F && buffer.shape_size() >= 2) absl::StrAppend(&text, " F");
  return text;
}

std::string FormatScalar(const v1::Scalar& scalar, v1::DType dtype) {
  switch (scalar.value_case()) {
    case v1::Scalar::kFloatValue: {
      std::string text = dtype == v1::DTYPE_FLOAT32
                             ? ShortestText(static_cast<float>(scalar.float_value()))
                             : ShortestText(scalar.float_value());
      // As Python prints floats: 3.0, not 3, so floats and integers stay apart.
      if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
      return text;
    }
    case v1::Scalar::kIntValue:
      return absl::StrCat(scalar.int_value());
    case v1::Scalar::kBoolValue:
      return scalar.bool_value() ? "True" : "False";
    case v1::Scalar::VALUE_NOT_SET:
      break;
  }
  return "None";
}

std::string FormatOperationKind(v1::OperationKind kind) {
  switch (kind) {
    case v1::OPERATION_KIND_ELEMENTWISE:
      return "elementwise";
    case v1::OPERATION_KIND_GEMV:
      return "gemv";
    case v1::OPERATION_KIND_REDUCE:
      return "reduce";
    case v1::OPERATION_KIND_RANDOM:
      return "random";
    case v1::OPERATION_KIND_FILL:
      return "fill";
    case v1::OPERATION_KIND_COPY:
      return "copy";
    case v1::OPERATION_KIND_UPLOAD:
      return "upload";
    case v1::OPERATION_KIND_DOWNLOAD:
      return "download";
    default:
      break;
  }
  return absl::StrCat("kind", static_cast<int>(kind));
}

std::string FormatOperationState(v1::Operation::State state) {
  switch (state) {
    case v1::Operation::STATE_QUEUED:
      return "queued";
    case v1::Operation::STATE_RUNNING:
      return "running";
    case v1::Operation::STATE_SUCCEEDED:
      return "succeeded";
    case v1::Operation::STATE_FAILED:
      return "failed";
    default:
      break;
  }
  return absl::StrCat("state", static_cast<int>(state));
}

std::string FormatOperation(const v1::Operation& operation) {
  std::string line = absl::StrCat(operation.id(), " ", FormatOperationKind(operation.kind()), "  ",
                                  FormatOperationState(operation.state()));
  if (operation.state() == v1::Operation::STATE_FAILED) {
    absl::StrAppend(&line, "  error ",
                    absl::StatusCodeToString(static_cast<absl::StatusCode>(operation.error_code())),
                    ": ", operation.error_message());
    return line;
  }
  if (!operation.done()) return line;

  const v1::Timing& timing = operation.timing();
  absl::StrAppend(&line, "  device ", FormatMilliseconds(timing.device_seconds()), "  queued ",
                  FormatMilliseconds(timing.queued_seconds()));
  if (timing.compile_seconds() > 0) {
    absl::StrAppend(&line, "  compile ", FormatMilliseconds(timing.compile_seconds()));
  }
  absl::StrAppend(&line, "  read ", FormatBytes(timing.bytes_read()), "  wrote ",
                  FormatBytes(timing.bytes_written()), "  ", FormatRate(timing.gbps()), " GB/s");
  if (timing.peak_fraction() > 0) {
    absl::StrAppend(&line, " (", absl::StrFormat("%.0f", timing.peak_fraction() * 100),
                    "% of peak)");
  }
  if (timing.flops() > 0) absl::StrAppend(&line, "  ", FormatRate(timing.gflops()), " GFLOP/s");
  if (operation.outputs_size() > 0) {
    absl::StrAppend(&line, "  -> ",
                    absl::StrJoin(operation.outputs(), ", ",
                                  [](std::string* out, const v1::BufferInfo& buffer) {
                                    out->append(FormatBufferRef(buffer));
                                  }));
  }
  if (operation.values_size() > 0) {
    const v1::DType dtype =
        operation.outputs_size() > 0 ? operation.outputs(0).dtype() : v1::DTYPE_FLOAT64;
    const std::string values = absl::StrJoin(
        operation.values(), ", ",
        [dtype](std::string* out, const v1::Scalar& s) { out->append(FormatScalar(s, dtype)); });
    if (operation.values_size() == 1) {
      absl::StrAppend(&line, "  value ", values);
    } else {
      absl::StrAppend(&line, "  values [", values, "]");
    }
  }
  if (operation.kind() == v1::OPERATION_KIND_RANDOM) {
    absl::StrAppend(&line, "  next_offset ", operation.next_offset());
  }
  return line;
}

std::string FormatTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string text;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line.append(widths[i] - row[i].size() + 2, ' ');
    }
    text += line;
    text += '\n';
  }
  if (!text.empty()) text.pop_back();
  return text;
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) {
    return "{}";
  }
  return json;
}

std::string JsonString(std::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  return out;
}

ProgressBar::ProgressBar(std::string label, uint64_t total_bytes)
    : label_(std::move(label)),
      total_bytes_(total_bytes),
      enabled_(total_bytes > kProgressMinBytes && isatty(STDERR_FILENO) == 1),
      start_nanos_(NowNanos()) {}

ProgressBar::~ProgressBar() {
  // A transfer that failed midway leaves the cursor at the end of the bar; the error
  // message belongs on its own line.
  if (drawn_) std::fputc('\n', stderr);
}

void ProgressBar::Update(uint64_t done_bytes) {
  if (!enabled_) return;
  const int64_t now = NowNanos();
  if (now - last_draw_nanos_ < kProgressRedrawNanos && done_bytes < total_bytes_) return;
  last_draw_nanos_ = now;
  Draw(done_bytes);
}

void ProgressBar::Finish() {
  if (!enabled_) return;
  Draw(total_bytes_);
  std::fputc('\n', stderr);
  drawn_ = false;
  enabled_ = false;
}

ProgressFn ProgressBar::AsCallback() {
  return [this](uint64_t done_bytes, uint64_t) { Update(done_bytes); };
}

void ProgressBar::Draw(uint64_t done_bytes) {
  const double seconds = static_cast<double>(NowNanos() - start_nanos_) * 1e-9;
  const double percent = total_bytes_ == 0 ? 100.0
                                           : 100.0 * static_cast<double>(done_bytes) /
                                                 static_cast<double>(total_bytes_);
  const double gbps = seconds > 0 ? static_cast<double>(done_bytes) / seconds / 1e9 : 0;
  // "\x1b[K" clears what a longer earlier line left.
  std::fprintf(stderr, "\r%s %s / %s  %3.0f%%  %s GB/s\x1b[K", label_.c_str(),
               FormatBytes(done_bytes).c_str(), FormatBytes(total_bytes_).c_str(), percent,
               FormatRate(gbps).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace gpucompute::cli
