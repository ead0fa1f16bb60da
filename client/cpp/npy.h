// NumPy .npy files (format versions 1.0, 2.0 and 3.0) for the element types the
// service supports: '<f4' '<f8' '<i4' '<i8' '|b1', C or Fortran order, any shape.
//
// The reader is written for files from anywhere: the header length is bounded, the
// header dictionary must be exactly what NumPy writes (the keys 'descr',
// 'fortran_order' and 'shape', each once, as Python literals), sizes are checked
// without overflow, and the file's size must match the shape. Every problem is an
// InvalidArgument status that says what was wrong; nothing crashes or allocates more
// than the bounded header.
//
// Data is never converted: bytes are little-endian as stored, and fortran_order only
// says how they are laid out. Big files are streamed: NpyReader and NpyWriter move the
// data in caller-sized pieces and never hold the whole array.
#ifndef GPUCOMPUTE_CLIENT_CPP_NPY_H_
#define GPUCOMPUTE_CLIENT_CPP_NPY_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "kernels/dtype.h"

namespace gpucompute {

// Longest header (the dictionary and its padding) the reader accepts. NumPy's own
// reader stops at 10000 bytes by default; a header for 64 dimensions of 20 digits each
// needs under 2 KiB.
inline constexpr uint32_t kMaxNpyHeaderBytes = 64 * 1024;
// Most dimensions the reader accepts (NumPy 2's limit).
inline constexpr size_t kMaxNpyDimensions = 64;

// What an .npy header describes.
struct NpyHeader {
  DType dtype = DType::kFloat64;
  // Empty for a 0-dimensional array (one element).
  std::vector<uint64_t> shape;
  bool fortran_order = false;

  friend bool operator==(const NpyHeader&, const NpyHeader&) = default;
};

// A header as found in a file.
struct NpyParsedHeader {
  NpyHeader header;
  // 1, 2 or 3.
  int major_version = 1;
  // Offset of the first data byte: the preamble, the length field and the header.
  uint64_t data_offset = 0;
  // product(shape) * itemsize; checked not to overflow.
  uint64_t data_bytes = 0;
};

// Number of elements and bytes of the data a header describes; InvalidArgument when
// they do not fit in 64 bits.
absl::StatusOr<uint64_t> NpyElementCount(const NpyHeader& header);
absl::StatusOr<uint64_t> NpyDataBytes(const NpyHeader& header);

// The descr NumPy writes for `dtype` on a little-endian machine: "<f4", "|b1", ...
std::string_view NpyDescr(DType dtype);
// The inverse of NpyDescr. Any other descr (big-endian, structured, unsigned, ...) is
// InvalidArgument naming it.
absl::StatusOr<DType> DTypeFromNpyDescr(std::string_view descr);

// Conversions between the wire enum and the kernels' enum. DTYPE_UNSPECIFIED and
// unknown values are InvalidArgument.
v1::DType ToProtoDType(DType dtype);
absl::StatusOr<DType> FromProtoDType(v1::DType dtype);
// "float32", "int64", "bool", ... (NumPy's names), as used on command lines.
absl::StatusOr<DType> DTypeFromName(std::string_view name);

// The bytes NumPy's np.save writes before the data: magic, version, header length and
// the header dictionary padded with spaces to a multiple of 64 bytes. Version 1.0
// unless the header needs a 32-bit length (then 2.0). Byte for byte what NumPy 1.24
// writes for the same array.
absl::StatusOr<std::string> EncodeNpyHeader(const NpyHeader& header);

// Parses the header at the start of `prefix`, which must hold at least the whole
// header (data may follow; it is not looked at).
absl::StatusOr<NpyParsedHeader> ParseNpyHeader(std::string_view prefix);

// Parses a whole in-memory .npy file and checks its size against the shape.
struct NpyView {
  NpyParsedHeader parsed;
  std::string_view data;
};
absl::StatusOr<NpyView> ParseNpy(std::string_view file);
// The view would outlive a temporary file.
absl::StatusOr<NpyView> ParseNpy(std::string&& file) = delete;

// An .npy file opened for reading. Open parses the header and checks the file's size
// against it; Read then returns the data in order, in pieces of the caller's size.
class NpyReader {
 public:
  static absl::StatusOr<NpyReader> Open(const std::string& path);

  NpyReader(NpyReader&&) = default;
  NpyReader& operator=(NpyReader&&) = default;

  const NpyParsedHeader& parsed() const { return parsed_; }
  const NpyHeader& header() const { return parsed_.header; }
  uint64_t data_bytes() const { return parsed_.data_bytes; }
  uint64_t bytes_read() const { return bytes_read_; }

  // Fills up to out.size() bytes with the next data bytes and returns how many; 0
  // once all data has been read. A file that shrank since Open is an error.
  absl::StatusOr<size_t> Read(std::span<std::byte> out);

 private:
  struct FileCloser {
    void operator()(std::FILE* file) const;
  };
  NpyReader(std::string path, std::unique_ptr<std::FILE, FileCloser> file, NpyParsedHeader parsed)
      : path_(std::move(path)), file_(std::move(file)), parsed_(std::move(parsed)) {}

  std::string path_;
  std::unique_ptr<std::FILE, FileCloser> file_;
  NpyParsedHeader parsed_;
  uint64_t bytes_read_ = 0;
};

// An .npy file being written: Create writes the header, Write appends data in order,
// Close checks that exactly the declared number of bytes arrived and that everything
// reached the file. A writer destroyed without Close closes the file without checks
// (the caller is abandoning it).
class NpyWriter {
 public:
  static absl::StatusOr<NpyWriter> Create(const std::string& path, const NpyHeader& header);

  NpyWriter(NpyWriter&&) = default;
  NpyWriter& operator=(NpyWriter&&) = default;

  uint64_t data_bytes() const { return data_bytes_; }
  uint64_t bytes_written() const { return bytes_written_; }

  // More data than the header declares is OutOfRange.
  absl::Status Write(std::string_view bytes);
  absl::Status Close();

 private:
  struct FileCloser {
    void operator()(std::FILE* file) const;
  };
  NpyWriter(std::string path, std::unique_ptr<std::FILE, FileCloser> file, uint64_t data_bytes)
      : path_(std::move(path)), file_(std::move(file)), data_bytes_(data_bytes) {}

  std::string path_;
  std::unique_ptr<std::FILE, FileCloser> file_;
  uint64_t data_bytes_ = 0;
  uint64_t bytes_written_ = 0;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_CLIENT_CPP_NPY_H_
