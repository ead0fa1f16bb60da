#include "client/cpp/npy.h"

#include <sys/stat.h>

#include <cerrno>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/string_view.h"

namespace gpucompute {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
// Magic, major and minor version: what precedes the header length field.
constexpr size_t kMagicAndVersionBytes = 8;
// NumPy pads the preamble and header to this so the data can be memory-mapped.
constexpr size_t kArrayAlign = 64;
// NumPy leaves room to rewrite the growing axis in place with up to this many digits.
constexpr size_t kGrowthAxisMaxDigits = 21;

constexpr std::string_view kSupportedDescrs = "<f4 <f8 <i4 <i8 |b1";

// What the fixed-size part of the file says.
struct Preamble {
  int major_version = 1;
  // Bytes of the length field: 2 in version 1.0, 4 later.
  size_t length_field_bytes = 2;
  uint32_t header_bytes = 0;
  uint64_t data_offset = 0;
};

// Bytes needed before the preamble can be decoded: the length field's size depends
// on the version.
size_t PreambleBytes(int major_version) {
  return kMagicAndVersionBytes + (major_version == 1 ? 2 : 4);
}

absl::StatusOr<Preamble> ParsePreamble(std::string_view prefix) {
  if (prefix.size() < kMagicAndVersionBytes) {
    return absl::InvalidArgumentError(absl::StrCat("not an .npy file: it is ", prefix.size(),
                                                   " bytes, shorter than the ",
                                                   kMagicAndVersionBytes, "-byte preamble"));
  }
  if (prefix.substr(0, kMagic.size()) != kMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("not an .npy file: it starts with \"",
                     absl::CHexEscape(ToAbsl(prefix.substr(0, kMagic.size()))),
                     "\", not the magic \"\\x93NUMPY\""));
  }
  const int major = static_cast<unsigned char>(prefix[6]);
  const int minor = static_cast<unsigned char>(prefix[7]);
  if (major < 1 || major > 3 || minor != 0) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported .npy format version ", major, ".",
                                                   minor, " (supported: 1.0, 2.0, 3.0)"));
  }
  Preamble preamble;
  preamble.major_version = major;
  preamble.length_field_bytes = major == 1 ? 2 : 4;
  const size_t preamble_bytes = PreambleBytes(major);
  if (prefix.size() < preamble_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated .npy file: it ends inside the header length field (", prefix.size(),
                     " of ", preamble_bytes, " bytes)"));
  }
  uint32_t length = 0;
  for (size_t i = 0; i < preamble.length_field_bytes; ++i) {
    length |= static_cast<uint32_t>(static_cast<unsigned char>(prefix[kMagicAndVersionBytes + i]))
              << (8 * i);
  }
  if (length > kMaxNpyHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("malformed .npy file: header length ", length,
                                                   " exceeds the limit of ", kMaxNpyHeaderBytes,
                                                   " bytes"));
  }
  preamble.header_bytes = length;
  preamble.data_offset = preamble_bytes + length;
  return preamble;
}

// Parses the header dictionary: the subset of Python literal syntax np.save writes.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : text_(text) {}

  absl::StatusOr<NpyHeader> Parse() {
    NpyHeader header;
    bool seen_descr = false;
    bool seen_fortran_order = false;
    bool seen_shape = false;
    SkipSpace();
    if (!Consume('{')) return Error("expected '{'");
    while (true) {
      SkipSpace();
      if (Consume('}')) break;
      absl::StatusOr<std::string_view> key = ParseString("a quoted key");
      if (!key.ok()) return key.status();
      SkipSpace();
      if (!Consume(':')) return Error(absl::StrCat("expected ':' after '", ToAbsl(*key), "'"));
      SkipSpace();
      if (*key == "descr") {
        if (seen_descr) return Error("duplicate key 'descr'");
        seen_descr = true;
        if (Peek() == '[') {
          return absl::InvalidArgumentError(
              "unsupported .npy dtype: structured arrays (a list descr) are not "
              "supported");
        }
        absl::StatusOr<std::string_view> descr = ParseString("a quoted descr");
        if (!descr.ok()) return descr.status();
        absl::StatusOr<DType> dtype = DTypeFromNpyDescr(*descr);
        if (!dtype.ok()) return dtype.status();
        header.dtype = *dtype;
      } else if (*key == "fortran_order") {
        if (seen_fortran_order) return Error("duplicate key 'fortran_order'");
        seen_fortran_order = true;
        absl::StatusOr<bool> value = ParseBool();
        if (!value.ok()) return value.status();
        header.fortran_order = *value;
      } else if (*key == "shape") {
        if (seen_shape) return Error("duplicate key 'shape'");
        seen_shape = true;
        absl::StatusOr<std::vector<uint64_t>> shape = ParseShape();
        if (!shape.ok()) return shape.status();
        header.shape = *std::move(shape);
      } else {
        return Error(absl::StrCat("unexpected key '", ToAbsl(*key),
                                  "' (expected 'descr', 'fortran_order', 'shape')"));
      }
      SkipSpace();
      if (Consume(',')) continue;
      if (Consume('}')) break;
      return Error("expected ',' or '}'");
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the dictionary");
    if (!seen_descr) return Error("missing key 'descr'");
    if (!seen_fortran_order) return Error("missing key 'fortran_order'");
    if (!seen_shape) return Error("missing key 'shape'");
    return header;
  }

 private:
  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  bool Consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  absl::Status Error(std::string_view what) const {
    constexpr size_t kShownBytes = 120;
    std::string_view shown = text_.substr(0, kShownBytes);
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed .npy header at byte ", pos_, ": ", ToAbsl(what), " in \"",
        absl::CHexEscape(ToAbsl(shown)), text_.size() > kShownBytes ? "..." : "", "\""));
  }

  // A Python string literal without prefix or escapes, which is all NumPy writes
  // for the keys and descrs it supports.
  absl::StatusOr<std::string_view> ParseString(std::string_view what) {
    const char quote = Peek();
    if (quote != '\'' && quote != '"') return Error(absl::StrCat("expected ", ToAbsl(what)));
    const size_t start = ++pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      const char c = text_[pos_];
      if (c == '\\') return Error("escape sequences in strings are not supported");
      if (c < 0x20 || c > 0x7e) return Error("unexpected character in a string");
      ++pos_;
    }
    if (pos_ == text_.size()) return Error("unterminated string");
    std::string_view value = text_.substr(start, pos_ - start);
    ++pos_;
    return value;
  }

  bool ConsumeWord(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    const size_t end = pos_ + word.size();
    if (end < text_.size()) {
      const char next = text_[end];
      if ((next >= 'a' && next <= 'z') || (next >= 'A' && next <= 'Z') ||
          (next >= '0' && next <= '9') || next == '_') {
        return false;
      }
    }
    pos_ = end;
    return true;
  }

  absl::StatusOr<bool> ParseBool() {
    if (ConsumeWord("True")) return true;
    if (ConsumeWord("False")) return false;
    return Error("fortran_order must be True or False");
  }

  // A non-negative decimal integer literal. Python 2 wrote long integers with an 'L'
  // suffix, which NumPy still accepts.
  absl::StatusOr<uint64_t> ParseDimension() {
    if (Peek() == '-') return Error("negative dimension");
    const size_t start = pos_;
    uint64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const uint64_t digit = static_cast<uint64_t>(text_[pos_] - '0');
      if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) {
        return Error("dimension does not fit in 64 bits");
      }
      value = value * 10 + digit;
      ++pos_;
    }
    if (pos_ == start) return Error("expected a dimension (a non-negative integer)");
    if (pos_ - start > 1 && text_[start] == '0') {
      return Error("dimension with a leading zero");
    }
    if (Peek() == 'L' || Peek() == 'l') ++pos_;
    return value;
  }

  absl::StatusOr<std::vector<uint64_t>> ParseShape() {
    if (!Consume('(')) return Error("shape must be a tuple");
    std::vector<uint64_t> shape;
    bool trailing_comma = false;
    while (true) {
      SkipSpace();
      if (Consume(')')) break;
      if (shape.size() == kMaxNpyDimensions) {
        return Error(absl::StrCat("more than ", kMaxNpyDimensions, " dimensions"));
      }
      absl::StatusOr<uint64_t> dimension = ParseDimension();
      if (!dimension.ok()) return dimension.status();
      shape.push_back(*dimension);
      SkipSpace();
      trailing_comma = Consume(',');
      if (trailing_comma) continue;
      if (Consume(')')) break;
      return Error("expected ',' or ')' in the shape");
    }
    // In Python "(3)" is the integer 3, not a tuple.
    if (shape.size() == 1 && !trailing_comma) {
      return Error("shape must be a tuple: one dimension is written (N,)");
    }
    return shape;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

std::string ShapeRepr(const std::vector<uint64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

std::string FileError(std::string_view what, const std::string& path) {
  return absl::StrCat(ToAbsl(what), " ", path);
}

}  // namespace

absl::StatusOr<uint64_t> NpyElementCount(const NpyHeader& header) {
  for (uint64_t dimension : header.shape) {
    if (dimension == 0) return 0;
  }
  uint64_t count = 1;
  for (uint64_t dimension : header.shape) {
    if (count > std::numeric_limits<uint64_t>::max() / dimension) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeRepr(header.shape), " has more than 2^64 elements"));
    }
    count *= dimension;
  }
  return count;
}

absl::StatusOr<uint64_t> NpyDataBytes(const NpyHeader& header) {
  absl::StatusOr<uint64_t> count = NpyElementCount(header);
  if (!count.ok()) return count.status();
  const uint64_t itemsize = DTypeSize(header.dtype);
  if (*count > std::numeric_limits<uint64_t>::max() / itemsize) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeRepr(header.shape), " of ",
                                                   ToAbsl(DTypeName(header.dtype)),
                                                   " needs more than 2^64 bytes"));
  }
  return *count * itemsize;
}

std::string_view NpyDescr(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return "|b1";
    case DType::kInt32:
      return "<i4";
    case DType::kInt64:
      return "<i8";
    case DType::kFloat32:
      return "<f4";
    case DType::kFloat64:
      return "<f8";
  }
  return "?";
}

absl::StatusOr<DType> DTypeFromNpyDescr(std::string_view descr) {
  for (DType dtype :
       {DType::kBool, DType::kInt32, DType::kInt64, DType::kFloat32, DType::kFloat64}) {
    if (descr == NpyDescr(dtype)) return dtype;
  }
  const std::string shown = absl::CHexEscape(ToAbsl(descr.substr(0, 32)));
  if (!descr.empty() && descr[0] == '>') {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported .npy dtype '", shown,
                     "': big-endian data is not supported; save it little-endian, e.g. with "
                     "arr.astype(arr.dtype.newbyteorder('<'))"));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported .npy dtype '", shown,
                                                 "' (supported: ", ToAbsl(kSupportedDescrs), ")"));
}

v1::DType ToProtoDType(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return v1::DTYPE_BOOL;
    case DType::kInt32:
      return v1::DTYPE_INT32;
    case DType::kInt64:
      return v1::DTYPE_INT64;
    case DType::kFloat32:
      return v1::DTYPE_FLOAT32;
    case DType::kFloat64:
      return v1::DTYPE_FLOAT64;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<DType> FromProtoDType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_BOOL:
      return DType::kBool;
    case v1::DTYPE_INT32:
      return DType::kInt32;
    case v1::DTYPE_INT64:
      return DType::kInt64;
    case v1::DTYPE_FLOAT32:
      return DType::kFloat32;
    case v1::DTYPE_FLOAT64:
      return DType::kFloat64;
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported dtype ", v1::DType_Name(dtype), " (",
                                                 static_cast<int>(dtype), ")"));
}

absl::StatusOr<DType> DTypeFromName(std::string_view name) {
  for (DType dtype :
       {DType::kBool, DType::kInt32, DType::kInt64, DType::kFloat32, DType::kFloat64}) {
    if (name == DTypeName(dtype)) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", absl::CHexEscape(ToAbsl(name.substr(0, 32))),
                   "' (expected float32, float64, int32, int64 or bool)"));
}

absl::StatusOr<std::string> EncodeNpyHeader(const NpyHeader& header) {
  if (header.shape.size() > kMaxNpyDimensions) {
    return absl::InvalidArgumentError(absl::StrCat(header.shape.size(), " dimensions; at most ",
                                                   kMaxNpyDimensions, " are supported"));
  }
  absl::StatusOr<uint64_t> data_bytes = NpyDataBytes(header);
  if (!data_bytes.ok()) return data_bytes.status();

  // Keys in sorted order and Python reprs, as np.save formats them.
  std::string dict = absl::StrCat("{'descr': '", ToAbsl(NpyDescr(header.dtype)),
                                  "', 'fortran_order': ", header.fortran_order ? "True" : "False",
                                  ", 'shape': ", ShapeRepr(header.shape), ", }");
  if (!header.shape.empty()) {
    const uint64_t growth_axis = header.fortran_order ? header.shape.back() : header.shape.front();
    const size_t digits = absl::StrCat(growth_axis).size();
    if (digits < kGrowthAxisMaxDigits) dict.append(kGrowthAxisMaxDigits - digits, ' ');
  }
  // The dictionary, padding and a final newline end on a kArrayAlign boundary; NumPy
  // adds a whole kArrayAlign of padding when the text already ends on one.
  int major = 1;
  size_t preamble_bytes = PreambleBytes(1);
  size_t unpadded = preamble_bytes + dict.size() + 1;
  size_t padding = kArrayAlign - unpadded % kArrayAlign;
  if (dict.size() + padding + 1 > std::numeric_limits<uint16_t>::max()) {
    major = 2;
    preamble_bytes = PreambleBytes(2);
    unpadded = preamble_bytes + dict.size() + 1;
    padding = kArrayAlign - unpadded % kArrayAlign;
  }
  const uint32_t header_bytes = static_cast<uint32_t>(dict.size() + padding + 1);

  std::string out;
  out.reserve(preamble_bytes + header_bytes);
  out.append(kMagic.data(), kMagic.size());
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  for (size_t i = 0; i < preamble_bytes - kMagicAndVersionBytes; ++i) {
    out.push_back(static_cast<char>((header_bytes >> (8 * i)) & 0xff));
  }
  out.append(dict);
  out.append(padding, ' ');
  out.push_back('\n');
  return out;
}

absl::StatusOr<NpyParsedHeader> ParseNpyHeader(std::string_view prefix) {
  absl::StatusOr<Preamble> preamble = ParsePreamble(prefix);
  if (!preamble.ok()) return preamble.status();
  if (prefix.size() < preamble->data_offset) {
    return absl::InvalidArgumentError(absl::StrCat("truncated .npy file: the header needs ",
                                                   preamble->data_offset,
                                                   " bytes but the file has ", prefix.size()));
  }
  const std::string_view text =
      prefix.substr(PreambleBytes(preamble->major_version), preamble->header_bytes);
  absl::StatusOr<NpyHeader> header = HeaderParser(text).Parse();
  if (!header.ok()) return header.status();
  absl::StatusOr<uint64_t> data_bytes = NpyDataBytes(*header);
  if (!data_bytes.ok()) return data_bytes.status();

  NpyParsedHeader parsed;
  parsed.header = *std::move(header);
  parsed.major_version = preamble->major_version;
  parsed.data_offset = preamble->data_offset;
  parsed.data_bytes = *data_bytes;
  return parsed;
}

namespace {

absl::Status DataSizeMismatch(const NpyParsedHeader& parsed, uint64_t actual) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed .npy file: it has ", actual, " data bytes but shape ",
                   ShapeRepr(parsed.header.shape), " of ", ToAbsl(DTypeName(parsed.header.dtype)),
                   " needs ", parsed.data_bytes));
}

}  // namespace

absl::StatusOr<NpyView> ParseNpy(std::string_view file) {
  absl::StatusOr<NpyParsedHeader> parsed = ParseNpyHeader(file);
  if (!parsed.ok()) return parsed.status();
  const uint64_t actual = file.size() - parsed->data_offset;
  if (actual != parsed->data_bytes) return DataSizeMismatch(*parsed, actual);
  NpyView view;
  view.data = file.substr(parsed->data_offset);
  view.parsed = *std::move(parsed);
  return view;
}

void NpyReader::FileCloser::operator()(std::FILE* file) const { std::fclose(file); }

absl::StatusOr<NpyReader> NpyReader::Open(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) return absl::ErrnoToStatus(errno, FileError("cannot open", path));

  // Reads until `prefix` holds `size` bytes or the file ends.
  std::string prefix;
  auto read_to = [&](size_t size) -> absl::Status {
    const size_t have = prefix.size();
    if (size <= have) return absl::OkStatus();
    prefix.resize(size);
    const size_t got = std::fread(prefix.data() + have, 1, size - have, file.get());
    prefix.resize(have + got);
    if (std::ferror(file.get())) return absl::ErrnoToStatus(errno, FileError("cannot read", path));
    return absl::OkStatus();
  };
  auto with_path = [&](const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
  };

  // The version decides the length field's size, so read the largest preamble first.
  if (absl::Status status = read_to(PreambleBytes(2)); !status.ok()) return status;
  absl::StatusOr<Preamble> preamble = ParsePreamble(prefix);
  if (!preamble.ok()) return with_path(preamble.status());
  if (absl::Status status = read_to(preamble->data_offset); !status.ok()) return status;
  absl::StatusOr<NpyParsedHeader> parsed = ParseNpyHeader(prefix);
  if (!parsed.ok()) return with_path(parsed.status());
  // A header shorter than the largest preamble leaves data bytes in `prefix`; go back
  // to the first of them.
  if (prefix.size() > parsed->data_offset) {
    if (std::fseek(file.get(), static_cast<long>(parsed->data_offset), SEEK_SET) != 0) {
      return absl::ErrnoToStatus(errno, FileError("cannot seek in", path));
    }
  }

  // A regular file's size is known up front; other files (pipes) are checked as they
  // are read.
  struct stat info;
  if (fstat(fileno(file.get()), &info) == 0 && S_ISREG(info.st_mode)) {
    const uint64_t size = static_cast<uint64_t>(info.st_size);
    const uint64_t actual = size >= parsed->data_offset ? size - parsed->data_offset : 0;
    if (actual != parsed->data_bytes) {
      return with_path(DataSizeMismatch(*parsed, actual));
    }
  }
  return NpyReader(path, std::move(file), *std::move(parsed));
}

absl::StatusOr<size_t> NpyReader::Read(std::span<std::byte> out) {
  const uint64_t remaining = parsed_.data_bytes - bytes_read_;
  const size_t wanted = static_cast<size_t>(std::min<uint64_t>(out.size(), remaining));
  if (wanted == 0) return 0;
  const size_t got = std::fread(out.data(), 1, wanted, file_.get());
  bytes_read_ += got;
  if (got < wanted) {
    if (std::ferror(file_.get())) {
      return absl::ErrnoToStatus(errno, FileError("cannot read", path_));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": truncated .npy file: the data ended after ", bytes_read_, " of ",
                     parsed_.data_bytes, " bytes"));
  }
  return got;
}

void NpyWriter::FileCloser::operator()(std::FILE* file) const { std::fclose(file); }

absl::StatusOr<NpyWriter> NpyWriter::Create(const std::string& path, const NpyHeader& header) {
  absl::StatusOr<std::string> encoded = EncodeNpyHeader(header);
  if (!encoded.ok()) return encoded.status();
  const uint64_t data_bytes = *NpyDataBytes(header);
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "wb"));
  if (file == nullptr) return absl::ErrnoToStatus(errno, FileError("cannot create", path));
  if (std::fwrite(encoded->data(), 1, encoded->size(), file.get()) != encoded->size()) {
    return absl::ErrnoToStatus(errno, FileError("cannot write", path));
  }
  return NpyWriter(path, std::move(file), data_bytes);
}

absl::Status NpyWriter::Write(std::string_view bytes) {
  if (file_ == nullptr) return absl::FailedPreconditionError("the .npy writer is closed");
  if (bytes.size() > data_bytes_ - bytes_written_) {
    return absl::OutOfRangeError(
        absl::StrCat(path_, ": ", bytes.size(), " more bytes would exceed the ", data_bytes_,
                     " data bytes the header declares (", bytes_written_, " written)"));
  }
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_.get()) != bytes.size()) {
    return absl::ErrnoToStatus(errno, FileError("cannot write", path_));
  }
  bytes_written_ += bytes.size();
  return absl::OkStatus();
}

absl::Status NpyWriter::Close() {
  if (file_ == nullptr) return absl::FailedPreconditionError("the .npy writer is closed");
  // fclose flushes; its failure (a full disk, say) means the file is incomplete.
  const int result = std::fclose(file_.release());
  if (result != 0) return absl::ErrnoToStatus(errno, FileError("cannot write", path_));
  if (bytes_written_ != data_bytes_) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": only ", bytes_written_, " of the ",
                                                      data_bytes_, " data bytes were written"));
  }
  return absl::OkStatus();
}

}  // namespace gpucompute
