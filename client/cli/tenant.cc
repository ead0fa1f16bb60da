// `gpucompute tenant export DIR` and `gpucompute tenant import DIR`: moving a tenant's
// named buffers from one server to another through files.
//
// An export directory holds one file per named buffer, "<id>.gpcbuf", in the format the
// server persists buffers in (server/persistence/persist_format.h, whose writer and
// reader this file uses), and a MANIFEST written last: its presence says the export is
// complete. The manifest's first line is kManifestMagic; each further line is
// "<file> <name>" (a name runs to the end of its line: names hold no control characters). A file's
// scope is the exporting client's name; import ignores the scope and the id, and creates each
// buffer under the importing caller with its name.
//
// Both directions stream one gRPC chunk at a time, so a buffer larger than this
// machine's memory moves as well as a small one.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/cli.h"
#include "client/cpp/npy.h"
#include "common/crc32c.h"
#include "server/persistence/persist_format.h"

namespace gpucompute::cli {
namespace {

namespace fs = std::filesystem;

constexpr char kManifestName[] = "MANIFEST";
constexpr char kManifestMagic[] = "gpucompute-tenant-export 1";

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

absl::Status FileError(std::string_view verb, const fs::path& path) {
  return absl::UnavailableError(
      absl::StrCat("cannot ", ToAbsl(verb), " ", path.string(), ": ", std::strerror(errno)));
}

absl::Status WriteAll(std::FILE* file, std::string_view bytes, const fs::path& path) {
  if (std::fwrite(bytes.data(), 1, bytes.size(), file) != bytes.size()) {
    return FileError("write", path);
  }
  return absl::OkStatus();
}

std::string LittleEndian32(uint32_t value) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

absl::StatusOr<Client*> Connected(CliContext& context) {
  absl::StatusOr<Client*> client = context.client();
  if (!client.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot connect: ", client.status().message()));
  }
  return client;
}

// The persisted header of `buffer`, as the exporting client `scope` holds it.
absl::StatusOr<PersistedHeader> HeaderOf(const v1::BufferInfo& buffer, std::string scope) {
  absl::StatusOr<DType> dtype = FromProtoDType(buffer.dtype());
  if (!dtype.ok()) return dtype.status();
  PersistedHeader header;
  header.scope = std::move(scope);
  header.id = buffer.id();
  header.name = buffer.name();
  header.dtype = *dtype;
  header.layout = buffer.layout() == v1::LAYOUT_F ? Layout::kF : Layout::kC;
  header.shape.assign(buffer.shape().begin(), buffer.shape().end());
  header.device = buffer.device();
  header.payload_bytes = buffer.size_bytes();
  header.ttl_nanos = static_cast<int64_t>(buffer.ttl_seconds() * 1e9);
  return header;
}

// Writes one buffer to `path` as the server would persist it: header, the downloaded
// bytes as they arrive, their CRC. Through a temporary file, so that `path` exists
// only complete. On a server error, *server_failed is set.
absl::Status ExportBuffer(Client& client, const v1::BufferInfo& buffer, const std::string& scope,
                          const fs::path& path, bool* server_failed) {
  absl::StatusOr<PersistedHeader> header = HeaderOf(buffer, scope);
  if (!header.ok()) return header.status();
  absl::StatusOr<std::string> encoded = EncodePersistHeader(*header);
  if (!encoded.ok()) return encoded.status();
  const fs::path temporary = absl::StrCat(path.string(), ".tmp");
  File file(std::fopen(temporary.c_str(), "wb"));
  if (file == nullptr) return FileError("create", temporary);
  absl::Status status = WriteAll(file.get(), *encoded, temporary);
  uint32_t crc = 0;
  uint64_t written = 0;
  bool write_failed = false;
  if (status.ok()) {
    DownloadSink sink = [&](uint64_t, std::string_view chunk) {
      crc = ExtendCrc32c(crc, chunk.data(), chunk.size());
      written += chunk.size();
      absl::Status wrote = WriteAll(file.get(), chunk, temporary);
      write_failed = !wrote.ok();
      return wrote;
    };
    v1::DownloadRequest request;
    // By id: a name could be rebound while the export runs.
    request.set_buffer(buffer.id());
    absl::StatusOr<v1::DownloadResponse> response = client.Download(request, sink);
    status = response.status();
    *server_failed = !status.ok() && !write_failed;
  }
  if (status.ok() && written != header->payload_bytes) {
    status = absl::DataLossError(absl::StrCat("buffer ", buffer.id(), " sent ", written,
                                              " bytes, its size is ", header->payload_bytes));
  }
  if (status.ok()) status = WriteAll(file.get(), LittleEndian32(crc), temporary);
  if (status.ok() && std::fflush(file.get()) != 0) status = FileError("write", temporary);
  file.reset();
  std::error_code error;
  if (status.ok()) {
    fs::rename(temporary, path, error);
    if (error)
      status = absl::UnavailableError(
          absl::StrCat("cannot rename ", temporary.string(), ": ", error.message()));
  }
  if (!status.ok()) fs::remove(temporary, error);
  return status;
}

Outcome Export(CliContext& context, const fs::path& dir) {
  const std::string what = "tenant export";
  std::error_code error;
  if (fs::exists(dir / kManifestName, error)) {
    return Outcome::Local(
        what, absl::AlreadyExistsError(absl::StrCat(dir.string(),
                                                    " already holds an export: choose another "
                                                    "directory, or remove this one first")));
  }
  absl::StatusOr<Client*> client = Connected(context);
  if (!client.ok()) return UsageFrom(client.status());
  absl::StatusOr<v1::ListBuffersResponse> listed = (*client)->ListBuffers();
  if (!listed.ok()) return Outcome::Server(what, listed.status());
  fs::create_directories(dir, error);
  if (error) {
    return Outcome::Local(what, absl::UnavailableError(absl::StrCat("cannot create ", dir.string(),
                                                                    ": ", error.message())));
  }
  const std::string scope =
      context.options().client_name.empty() ? "default" : context.options().client_name;
  std::string manifest = absl::StrCat(kManifestMagic, "\n");
  uint64_t count = 0;
  uint64_t bytes = 0;
  for (const v1::BufferInfo& buffer : listed->buffers()) {
    // Unnamed buffers are a client's scratch: nobody could find them again after a move.
    if (buffer.name().empty()) continue;
    const std::string file_name = absl::StrCat(buffer.id(), kPersistSuffix);
    bool server_failed = false;
    absl::Status status = ExportBuffer(**client, buffer, scope, dir / file_name, &server_failed);
    const std::string about = absl::StrCat(what, " ", buffer.name());
    if (!status.ok()) {
      return server_failed ? Outcome::Server(about, status) : Outcome::Local(about, status);
    }
    absl::StrAppend(&manifest, file_name, " ", buffer.name(), "\n");
    ++count;
    bytes += buffer.size_bytes();
  }
  const fs::path temporary = dir / absl::StrCat(kManifestName, ".tmp");
  {
    File file(std::fopen(temporary.c_str(), "wb"));
    absl::Status status = file == nullptr ? FileError("create", temporary)
                                          : WriteAll(file.get(), manifest, temporary);
    if (status.ok() && std::fclose(file.release()) != 0) status = FileError("write", temporary);
    if (!status.ok()) return Outcome::Local(what, status);
  }
  fs::rename(temporary, dir / kManifestName, error);
  if (error) {
    return Outcome::Local(what, absl::UnavailableError(absl::StrCat(
                                    "cannot rename ", temporary.string(), ": ", error.message())));
  }
  if (context.json()) {
    context.Print(absl::StrCat("{\"directory\":", JsonString(dir.string()), ",\"buffers\":", count,
                               ",\"bytes\":\"", bytes, "\"}"));
  } else {
    context.Print(absl::StrCat("exported ", count, " named buffers (", FormatBytes(bytes), ") to ",
                               dir.string()));
  }
  return Outcome::Ok();
}

// One file of an export, its header read and checked.
struct ImportFile {
  fs::path path;
  PersistedHeader header;
  size_t header_bytes = 0;
};

absl::StatusOr<ImportFile> OpenImportFile(const fs::path& path, std::string_view name) {
  ImportFile out{path, {}, 0};
  File file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) return FileError("open", path);
  auto read = [&](size_t n) -> absl::StatusOr<std::string> {
    std::string bytes(n, '\0');
    if (std::fread(bytes.data(), 1, n, file.get()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(path.string(), " is truncated"));
    }
    return bytes;
  };
  absl::StatusOr<std::string> prefix = read(kPersistPrefixBytes);
  if (!prefix.ok()) return prefix.status();
  absl::StatusOr<size_t> length = DecodePersistPrefix(*prefix);
  if (!length.ok())
    return absl::Status(length.status().code(),
                        absl::StrCat(path.string(), ": ", length.status().message()));
  absl::StatusOr<std::string> rest = read(*length - kPersistPrefixBytes);
  if (!rest.ok()) return rest.status();
  absl::StatusOr<PersistedHeader> header = DecodePersistHeader(*prefix + *rest);
  if (!header.ok()) {
    return absl::Status(header.status().code(),
                        absl::StrCat(path.string(), ": ", header.status().message()));
  }
  std::error_code error;
  const uint64_t size = fs::file_size(path, error);
  // The payload length is at most what a shape can describe (DecodePersistHeader), far
  // below 2^64 - H - 4.
  if (error || size != *length + header->payload_bytes + 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), " is not the ", *length + header->payload_bytes + 4,
                     " bytes its header promises: the export is incomplete or damaged"));
  }
  if (header->name != name) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), " holds buffer '", header->name,
                                                   "', the manifest says '", ToAbsl(name), "'"));
  }
  out.header = *std::move(header);
  out.header_bytes = *length;
  return out;
}

absl::StatusOr<std::vector<ImportFile>> ReadExport(const fs::path& dir) {
  std::ifstream in(dir / kManifestName);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        dir.string(), " has no ", kManifestName,
        ": it is no export, or an export that did not finish (tenant export writes it last)"));
  }
  std::string line;
  if (!std::getline(in, line) || line != kManifestMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat((dir / kManifestName).string(), " does not start with '", kManifestMagic,
                     "': written by another gpucompute version, or not an export"));
  }
  std::vector<ImportFile> files;
  std::set<std::string> names;
  while (std::getline(in, line)) {
    // Names may hold spaces, file names ("<id>.gpcbuf") do not.
    std::vector<std::string> fields = absl::StrSplit(line, absl::MaxSplits(' ', 1));
    if (fields.size() != 2 || fields[0].find('/') != std::string::npos || fields[0] == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat((dir / kManifestName).string(), ": malformed line '", line, "'"));
    }
    if (!names.insert(fields[1]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat((dir / kManifestName).string(), " names buffer '", fields[1], "' twice"));
    }
    absl::StatusOr<ImportFile> file = OpenImportFile(dir / fields[0], fields[1]);
    if (!file.ok()) return file.status();
    files.push_back(*std::move(file));
  }
  return files;
}

// Uploads one exported buffer under its name. The payload's CRC is checked as the last
// bytes are read: a mismatch fails the read, which cancels the upload, so a damaged
// file creates nothing. On a server error, *server_failed is set.
absl::StatusOr<v1::BufferInfo> ImportBuffer(Client& client, const ImportFile& in,
                                            bool* server_failed) {
  File file(std::fopen(in.path.c_str(), "rb"));
  if (file == nullptr) return FileError("open", in.path);
  if (std::fseek(file.get(), static_cast<long>(in.header_bytes), SEEK_SET) != 0) {
    return FileError("read", in.path);
  }
  const PersistedHeader& h = in.header;
  v1::UploadHeader upload;
  v1::CreateBufferRequest* create = upload.mutable_create();
  create->set_dtype(ToProtoDType(h.dtype));
  for (uint64_t d : h.shape) create->add_shape(d);
  create->set_layout(h.layout == Layout::kF ? v1::LAYOUT_F : v1::LAYOUT_C);
  create->set_name(h.name);
  create->set_ttl_seconds(static_cast<double>(h.ttl_nanos) / 1e9);
  uint64_t left = h.payload_bytes;
  uint32_t crc = 0;
  bool read_failed = false;
  UploadReader reader = [&](std::span<std::byte> out) -> absl::StatusOr<size_t> {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size(), left));
    absl::Status status;
    if (std::fread(out.data(), 1, n, file.get()) != n) {
      status = absl::DataLossError(absl::StrCat(in.path.string(), " is truncated"));
    }
    crc = ExtendCrc32c(crc, out.data(), n);
    left -= n;
    if (status.ok() && left == 0) {
      unsigned char stored[4] = {};
      if (std::fread(stored, 1, 4, file.get()) != 4 ||
          (stored[0] | stored[1] << 8 | stored[2] << 16 | uint32_t{stored[3]} << 24) != crc) {
        status = absl::DataLossError(absl::StrCat(
            in.path.string(), ": the payload's CRC32C does not match: the file is corrupt"));
      }
    }
    if (!status.ok()) {
      read_failed = true;
      return status;
    }
    return n;
  };
  absl::StatusOr<v1::UploadResponse> response = client.Upload(upload, h.payload_bytes, reader);
  if (!response.ok()) {
    *server_failed = !read_failed;
    return response.status();
  }
  return response->buffer();
}

Outcome Import(CliContext& context, const fs::path& dir, bool replace) {
  const std::string what = "tenant import";
  absl::StatusOr<std::vector<ImportFile>> files = ReadExport(dir);
  if (!files.ok()) return Outcome::Local(what, files.status());
  absl::StatusOr<Client*> client = Connected(context);
  if (!client.ok()) return UsageFrom(client.status());
  absl::StatusOr<v1::ListBuffersResponse> listed = (*client)->ListBuffers();
  if (!listed.ok()) return Outcome::Server(what, listed.status());
  std::set<std::string> existing;
  for (const v1::BufferInfo& buffer : listed->buffers()) {
    if (!buffer.name().empty()) existing.insert(buffer.name());
  }
  std::vector<std::string> clashes;
  for (const ImportFile& file : *files) {
    if (existing.contains(file.header.name)) clashes.push_back(file.header.name);
  }
  if (!clashes.empty() && !replace) {
    return Outcome::Server(
        what, absl::AlreadyExistsError(absl::StrCat(
                  "the server already has buffers named ", absl::StrJoin(clashes, ", "),
                  "; nothing was imported (--replace replaces them)")));
  }
  // A failure part way removes what this import created, so that a retry starts clean.
  std::vector<std::string> created;
  auto undo = [&] {
    for (const std::string& id : created) (void)(*client)->DeleteBuffer(id);
  };
  uint64_t bytes = 0;
  for (const ImportFile& file : *files) {
    const std::string about = absl::StrCat(what, " ", file.header.name);
    if (existing.contains(file.header.name)) {
      if (absl::Status status = (*client)->DeleteBuffer(file.header.name); !status.ok()) {
        undo();
        return Outcome::Server(about, status);
      }
    }
    bool server_failed = false;
    absl::StatusOr<v1::BufferInfo> buffer = ImportBuffer(**client, file, &server_failed);
    if (!buffer.ok()) {
      undo();
      return server_failed ? Outcome::Server(about, buffer.status())
                           : Outcome::Local(about, buffer.status());
    }
    created.push_back(buffer->id());
    bytes += buffer->size_bytes();
  }
  if (context.json()) {
    context.Print(absl::StrCat("{\"directory\":", JsonString(dir.string()),
                               ",\"buffers\":", created.size(), ",\"bytes\":\"", bytes, "\"}"));
  } else {
    context.Print(absl::StrCat("imported ", created.size(), " named buffers (", FormatBytes(bytes),
                               ") from ", dir.string()));
  }
  return Outcome::Ok();
}

}  // namespace

Outcome RunTenant(CliContext& context, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 2, 2)) return *usage;
  const std::string& action = args.positional()[0];
  const fs::path dir = args.positional()[1];
  if (action == "export") {
    if (args.Has("--replace")) return Outcome::Usage("--replace is for import");
    return Export(context, dir);
  }
  if (action == "import") return Import(context, dir, args.Has("--replace"));
  return Outcome::Usage(absl::StrCat("unknown action '", action, "': export or import"));
}

}  // namespace gpucompute::cli
