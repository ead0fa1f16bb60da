// The file one persisted buffer is written to (--persist-dir), and its reader.
//
// Format version 1. All integers little-endian; offsets in bytes.
//
//   offset  size  field
//   0       8     magic "\x89GPCBUF\n" (the high byte and the newline catch files
//                 mangled as text, as PNG's signature does)
//   8       4     format version (1)
//   12      4     header length H: bytes from offset 0 through the header CRC
//   16      2     scope length S (the buffer's owner scope, BufferMeta::client, verbatim:
//                 it carries the tenant where the server has tenants)
//   18      2     id length I
//   20      2     name length N
//   22      1     dtype (kernels/dtype.h's DType value)
//   23      1     layout (0: C order, 1: Fortran order)
//   24      1     dimensions D (at most kMaxDimensions)
//   25      1     device the buffer was on
//   26      8     payload length P, which must equal product(shape) * itemsize
//   34      8     the buffer's lease, its ttl in nanoseconds (0: none); a restored
//                 buffer's lease starts afresh at the restore
//   42      8*D   shape
//   42+8D   S     scope
//           I     id ("buf-" and 32 hex digits)
//           N     name (non-empty: only named buffers persist)
//   H-4     4     CRC32C of bytes [0, H-4)
//   H       P     payload: the buffer's bytes in its layout's order
//   H+P     4     CRC32C of the payload
//
// The file is exactly H + P + 4 bytes. A reader refuses a file that does not start with
// the magic (foreign), is of another version, has a header whose CRC or fields are
// wrong, or is not exactly that long; nothing of such a file is loaded.
#ifndef GPUCOMPUTE_SERVER_PERSISTENCE_PERSIST_FORMAT_H_
#define GPUCOMPUTE_SERVER_PERSISTENCE_PERSIST_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "server/core/buffer_registry.h"

namespace gpucompute {

inline constexpr char kPersistMagic[] = "\x89GPCBUF\n";
inline constexpr size_t kPersistMagicBytes = 8;
inline constexpr uint32_t kPersistFormatVersion = 1;
// Magic, version and header length: what a reader needs to know how much header follows.
inline constexpr size_t kPersistPrefixBytes = 16;
inline constexpr size_t kPersistFixedHeaderBytes = 42;
// Scope, id and name lengths are 16-bit; with the shape and CRC this bounds the header.
inline constexpr size_t kPersistMaxHeaderBytes =
    kPersistFixedHeaderBytes + 8 * kMaxDimensions + 3 * 0xffff + 4;
// Files are named "<id>.gpcbuf"; one being written is "<id>.gpcbuf.tmp".
inline constexpr char kPersistSuffix[] = ".gpcbuf";
inline constexpr char kPersistTempSuffix[] = ".gpcbuf.tmp";

struct PersistedHeader {
  std::string scope;
  std::string id;
  std::string name;
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kC;
  std::vector<uint64_t> shape;
  int device = 0;
  uint64_t payload_bytes = 0;
  int64_t ttl_nanos = 0;
};

// The header's bytes, its CRC included. INVALID_ARGUMENT if a field does not fit the
// format (a scope, id or name over 65535 bytes, too many dimensions, a device over 255).
absl::StatusOr<std::string> EncodePersistHeader(const PersistedHeader& header);

// From the file's first kPersistPrefixBytes: the header length H. INVALID_ARGUMENT for a
// foreign file (no magic) or a header length out of range, FAILED_PRECONDITION for
// another format version.
absl::StatusOr<size_t> DecodePersistPrefix(absl::string_view prefix);

// Decodes and checks exactly the header's H bytes (prefix included): CRC, field
// lengths, dtype, layout, shape against the payload length, lease, id and name. DATA_LOSS for
// a CRC mismatch, INVALID_ARGUMENT for a field that is wrong.
absl::StatusOr<PersistedHeader> DecodePersistHeader(absl::string_view header);

// A whole file in memory (tests, the fuzz target): the header and a view of the payload
// within `file`, after every check above, the length and the payload's CRC included.
struct PersistedFile {
  PersistedHeader header;
  absl::string_view payload;
};
absl::StatusOr<PersistedFile> DecodePersistFile(absl::string_view file);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_PERSISTENCE_PERSIST_FORMAT_H_
