// The bad-input matrix: every RPC of gpucompute.v1 sent bad input of each kind that
// applies to it (malformed, oversized, wrong-type, out-of-range, unauthenticated,
// other-tenant, and non-admin callers of the admin RPCs), through a real server with two
// tenants, alice and bob, and an admin. Every case must get its exact status code and a
// message that says what was wrong, and must leave everything as it was: both tenants'
// buffers (their metadata and every byte), streams and regions, the bytes of their
// shared-memory objects, and the usage and quota figures GetServerInfo reports.
//
// Requests go out as raw bytes through a generic stub, so that the table can send what
// the client library refuses to (no token, bogus enum values, garbage, a chunk past the
// declared size), and so that each case names exactly the method it calls. At the end the
// test prints how many cases of each category passed for each RPC.
#include <fcntl.h>
#include <sys/mman.h>  // shm_open
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/text_format.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/substitute.h"
#include "client/cpp/client.h"
#include "server/server.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {
namespace {

using grpc::StatusCode;

// ---------------------------------------------------------------------------
// Categories and the count table.

enum Category {
  kMalformed,
  kOversized,
  kWrongType,
  kOutOfRange,
  kUnauthenticated,
  kOtherTenant,
  kNonAdmin,
  kNumCategories
};

constexpr const char* kCategoryNames[kNumCategories] = {
    "malformed",       "oversized",    "wrong-type", "out-of-range",
    "unauthenticated", "other-tenant", "non-admin"};

// The API's file, whose services and methods the table is checked against.
const google::protobuf::FileDescriptor& ApiFile() { return *v1::BufferInfo::descriptor()->file(); }

// "BufferService.GetBuffer" -> its method; null if the API has no such RPC.
const google::protobuf::MethodDescriptor* FindRpc(const std::string& rpc) {
  const std::vector<std::string> parts = absl::StrSplit(rpc, '.');
  if (parts.size() != 2) return nullptr;
  const google::protobuf::ServiceDescriptor* service = ApiFile().FindServiceByName(parts[0]);
  return service == nullptr ? nullptr : service->FindMethodByName(parts[1]);
}

// Every RPC of the API, in the order of the .proto file.
std::vector<std::string> AllRpcs() {
  std::vector<std::string> rpcs;
  const google::protobuf::FileDescriptor& file = ApiFile();
  for (int s = 0; s < file.service_count(); ++s) {
    const google::protobuf::ServiceDescriptor* service = file.service(s);
    for (int m = 0; m < service->method_count(); ++m) {
      rpcs.push_back(absl::StrCat(service->name(), ".", service->method(m)->name()));
    }
  }
  return rpcs;
}

std::string CountTable(const std::map<std::string, std::array<int, kNumCategories>>& counts) {
  const std::vector<std::string> rpcs = AllRpcs();
  size_t width = 5;
  for (const std::string& rpc : rpcs) width = std::max(width, rpc.size());
  std::ostringstream out;
  const auto row = [&](const std::string& name, const std::array<int, kNumCategories>& n) {
    out << std::left << std::setw(static_cast<int>(width)) << name << std::right;
    int total = 0;
    for (int c = 0; c < kNumCategories; ++c) {
      out << " " << std::setw(static_cast<int>(std::string(kCategoryNames[c]).size())) << n[c];
      total += n[c];
    }
    out << " " << std::setw(5) << total << "\n";
  };
  out << std::left << std::setw(static_cast<int>(width)) << "RPC";
  for (const char* name : kCategoryNames) out << " " << name;
  out << " total\n";
  std::array<int, kNumCategories> totals{};
  for (const std::string& rpc : rpcs) {
    auto it = counts.find(rpc);
    const std::array<int, kNumCategories> n =
        it == counts.end() ? std::array<int, kNumCategories>{} : it->second;
    row(rpc, n);
    for (int c = 0; c < kNumCategories; ++c) totals[c] += n[c];
  }
  row("total", totals);
  return out.str();
}

// ---------------------------------------------------------------------------
// Raw calls.

grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromByteBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (!buffer.Dump(&slices).ok()) return bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return bytes;
}

struct RawResult {
  grpc::Status status;
  std::vector<std::string> responses;
};

// Calls `rpc` ("Service.Method") with `messages` as they are, then half-closes and reads
// every response. `authorization` is the metadata's value; empty sends none. Unary
// methods take exactly one message; a stream of the client's ends early once the server
// has answered.
// `tenant`, when not empty, is sent as the metadata kTenantMetadataKey.
RawResult RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& rpc,
                  const std::string& authorization, const std::vector<std::string>& messages,
                  const std::string& tenant = "") {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (!authorization.empty()) context.AddMetadata("authorization", authorization);
  if (!tenant.empty()) context.AddMetadata(kTenantMetadataKey, tenant);
  const std::string method =
      absl::StrCat("/", ApiFile().package(), ".", absl::StrReplaceAll(rpc, {{".", "/"}}));
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, method, &cq);
  int tag = 0;
  const auto step = [&]() {
    void* got = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&got, &ok));
    EXPECT_EQ(got, &tag);
    return ok;
  };
  call->StartCall(&tag);
  bool open = step();
  for (const std::string& message : messages) {
    if (!open) break;
    call->Write(ToByteBuffer(message), &tag);
    open = step();
  }
  if (open) {
    call->WritesDone(&tag);
    step();
  }
  RawResult result;
  for (;;) {
    grpc::ByteBuffer response;
    call->Read(&response, &tag);
    if (!step()) break;
    result.responses.push_back(FromByteBuffer(response));
  }
  call->Finish(&result.status, &tag);
  step();
  cq.Shutdown();
  void* ignored_tag;
  bool ignored_ok;
  while (cq.Next(&ignored_tag, &ignored_ok)) {
  }
  return result;
}

// `text` (protobuf text format) as a message of the type `rpc` takes, serialized.
std::string Request(const std::string& rpc, const std::string& text) {
  const google::protobuf::MethodDescriptor* method = FindRpc(rpc);
  if (method == nullptr) {
    ADD_FAILURE() << "the API has no RPC " << rpc;
    return "";
  }
  std::unique_ptr<google::protobuf::Message> message(
      google::protobuf::MessageFactory::generated_factory()
          ->GetPrototype(method->input_type())
          ->New());
  if (!google::protobuf::TextFormat::ParseFromString(text, message.get())) {
    ADD_FAILURE() << "not a " << method->input_type()->full_name() << ": " << text;
  }
  return message->SerializeAsString();
}

// A message of type T from text format.
template <typename T>
T Text(const std::string& text) {
  T message;
  if (!google::protobuf::TextFormat::ParseFromString(text, &message)) {
    ADD_FAILURE() << "not a " << T::descriptor()->full_name() << ": " << text;
  }
  return message;
}

// Upload stream messages: a header (text format of UploadHeader), and a chunk.
std::string HeaderMessage(const std::string& header_text) {
  v1::UploadRequest request;
  *request.mutable_header() = Text<v1::UploadHeader>(header_text);
  return request.SerializeAsString();
}

std::string ChunkMessage(size_t bytes, std::optional<uint32_t> crc32c = std::nullopt) {
  v1::UploadRequest request;
  request.set_chunk(std::string(bytes, '\x5a'));
  if (crc32c.has_value()) request.set_chunk_crc32c(*crc32c);
  return request.SerializeAsString();
}

// A Session's status for one bad operation: the call's own error, else the error the last
// answer carries (a rejected operation is answered FAILED with its code and message).
grpc::Status SessionStatus(const RawResult& result, size_t sent) {
  if (!result.status.ok()) return result.status;
  std::vector<v1::ChainStepResult> answers;
  for (const std::string& bytes : result.responses) {
    v1::SessionResponse message;
    if (!message.ParseFromString(bytes)) {
      return grpc::Status(StatusCode::INTERNAL, "the test could not parse the answer");
    }
    answers.insert(answers.end(), message.answers().begin(), message.answers().end());
  }
  if (answers.size() != sent) {
    return grpc::Status(StatusCode::INTERNAL, absl::StrCat("the test got ", answers.size(),
                                                           " answers to ", sent, " operations"));
  }
  const v1::Operation& last = answers.back().operation();
  if (last.state() != v1::Operation::STATE_FAILED) return grpc::Status::OK;
  return grpc::Status(static_cast<StatusCode>(last.error_code()), last.error_message());
}

// ---------------------------------------------------------------------------
// The world the cases must leave as it was.

// A POSIX shared-memory object holding a known pattern, removed when this goes.
class ShmObject {
 public:
  ShmObject(std::string name, size_t size, uint8_t seed) : name_(std::move(name)) {
    const int fd = shm_open(name_.c_str(), O_CREAT | O_TRUNC | O_RDWR, 0600);
    if (fd < 0) {
      ADD_FAILURE() << "shm_open " << name_ << ": " << std::strerror(errno);
      return;
    }
    std::string bytes(size, '\0');
    for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(seed + i * 7);
    EXPECT_EQ(pwrite(fd, bytes.data(), size, 0), static_cast<ssize_t>(size));
    close(fd);
  }
  ~ShmObject() { shm_unlink(name_.c_str()); }
  ShmObject(const ShmObject&) = delete;
  ShmObject& operator=(const ShmObject&) = delete;

  const std::string& name() const { return name_; }
  // What the object holds now.
  std::string Contents() const {
    const int fd = shm_open(name_.c_str(), O_RDONLY, 0);
    if (fd < 0) return absl::StrCat("(cannot open: ", std::strerror(errno), ")");
    struct stat st;
    std::string bytes;
    if (fstat(fd, &st) == 0) {
      bytes.resize(static_cast<size_t>(st.st_size));
      if (pread(fd, bytes.data(), bytes.size(), 0) != st.st_size) bytes = "(short read)";
    }
    close(fd);
    return bytes;
  }

 private:
  std::string name_;
};

// Everything a rejected request must leave as it was, as lines that a failure prints the
// difference of. test_server.h's Snapshot of each caller, and around it what that does
// not cover: each buffer's dtype, shape, layout, lease and bytes, the streams, the
// regions, the quota figures and the shared-memory objects' bytes.
struct WorldSnapshot {
  Snapshot alice, bob, admin;
  std::vector<std::string> lines;
  bool operator==(const WorldSnapshot&) const = default;
};

std::string Diff(const WorldSnapshot& before, const WorldSnapshot& after) {
  std::ostringstream out;
  if (!(before.alice == after.alice))
    out << "alice: " << before.alice << " -> " << after.alice << "\n";
  if (!(before.bob == after.bob)) out << "bob: " << before.bob << " -> " << after.bob << "\n";
  if (!(before.admin == after.admin))
    out << "admin: " << before.admin << " -> " << after.admin << "\n";
  for (const std::string& line : before.lines) {
    if (std::find(after.lines.begin(), after.lines.end(), line) == after.lines.end()) {
      out << "- " << line << "\n";
    }
  }
  for (const std::string& line : after.lines) {
    if (std::find(before.lines.begin(), before.lines.end(), line) == before.lines.end()) {
      out << "+ " << line << "\n";
    }
  }
  return out.str();
}

// ---------------------------------------------------------------------------
// The cases.

struct Case {
  std::string rpc;  // "BufferService.GetBuffer"
  Category category;
  std::string what;  // what is wrong with the request
  std::function<grpc::Status()> send;
  StatusCode code;
  std::string says;  // a fragment of the message
  // Other-tenant cases: the same call with an unknown id of the same kind instead of the
  // other tenant's `id`, which must answer exactly alike.
  std::function<grpc::Status()> send_unknown;
  std::string id, unknown_id;
  // The message must be `says` exactly, not merely contain it.
  bool exact = false;
};

constexpr char kAliceToken[] = "alice-3c1e0b77d2";
constexpr char kBobToken[] = "bob-90f5aa1243";
constexpr char kAdminToken[] = "admin-6d0c4e1f8b";
constexpr char kWrongToken[] = "not-a-token-41e7";

// The callers, as the value of their 'authorization' metadata.
constexpr char kAlice[] = "Bearer alice-3c1e0b77d2";
constexpr char kBob[] = "Bearer bob-90f5aa1243";
constexpr char kAdmin[] = "Bearer admin-6d0c4e1f8b";
static_assert(std::string_view(kAlice).substr(7) == kAliceToken);
static_assert(std::string_view(kBob).substr(7) == kBobToken);
static_assert(std::string_view(kAdmin).substr(7) == kAdminToken);

// Ids of each kind that nobody holds.
constexpr char kNoBuffer[] = "buf-00000000000000000000000000000000";
constexpr char kNoStream[] = "str-00000000000000000000000000000000";
constexpr char kNoOperation[] = "op-00000000000000000000000000000000";
constexpr char kNoRegion[] = "shm-00000000000000000000000000000000";
constexpr char kNoTransfer[] = "upl-00000000000000000000000000000000";

// alice's quota is the default; bob's lets him reach the server's memory limit, and he
// holds as many streams as he may.
constexpr char kQuotas[] =
    "default device_bytes=1MiB buffers=32 streams=8 operations=64\n"
    "tenant bob device_bytes=1GiB streams=2\n";
constexpr uint64_t kMemoryLimit = 64 * kMiB;

// Text-format pieces of requests.
std::string Quoted(const std::string& s) { return absl::StrCat("\"", absl::CEscape(s), "\""); }

std::string ElementwiseText(const std::string& expression, const std::string& x,
                            const std::string& output = "") {
  return absl::Substitute(
      "elementwise { expression: $0 inputs { key: \"x\" value { buffer: $1 } } $2 }",
      Quoted(expression), Quoted(x),
      output.empty() ? "" : absl::StrCat("output { buffer: ", Quoted(output), " }"));
}

class BadInputMatrixTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = ::testing::TempDir();
    tokens_file_ = absl::StrCat(dir, "/matrix_tokens_", getpid());
    quota_file_ = absl::StrCat(dir, "/matrix_quotas_", getpid());
    std::ofstream(tokens_file_) << kAliceToken << " alice\n"
                                << kBobToken << " bob\n"
                                << kAdminToken << " ops admin\n";
    std::ofstream(quota_file_) << kQuotas;
    server_ = TestServer::StartWith(nullptr, kMemoryLimit, 2, [&](ServerOptions& o) {
      o.tokens_file = tokens_file_;
      o.quota_file = quota_file_;
      o.allow_shared_memory = true;
      o.allow_cuda_ipc = true;
    });
    ASSERT_NE(server_, nullptr);
    channel_ = server_->RawChannel();
    alice_ = As(kAliceToken);
    bob_ = As(kBobToken);
    admin_ = As(kAdminToken);
    ASSERT_TRUE(alice_ != nullptr && bob_ != nullptr && admin_ != nullptr);

    const std::string prefix = absl::StrCat("/gpucompute-matrix-", getpid());
    alice_shm_ = std::make_unique<ShmObject>(prefix + "-alice", 512, 3);
    bob_shm_ = std::make_unique<ShmObject>(prefix + "-bob", 256, 101);
    // A FIFO where a shared-memory object would be (opened read-write, it does not block).
    not_shm_ = prefix + "-fifo";
    has_fifo_ = mkfifo(absl::StrCat("/dev/shm", not_shm_).c_str(), 0600) == 0;

    // alice: named buffers of several dtypes and shapes, a buffer with a lease, a stream,
    // a finished operation on it, two regions and an upload in progress.
    ASSIGN_OR_FAIL(v1::BufferInfo a,
                   UploadArray(*alice_, std::vector<int32_t>{5, 6, 7, 8}, {}, v1::LAYOUT_C, "a"));
    a_ = a.id();
    ASSERT_OK(UploadArray(*alice_, RandomDoubles(12, -1, 1, 7), {3, 4}, v1::LAYOUT_F, "m"));
    ASSERT_OK(UploadArray(*alice_, RandomDoubles(4, -1, 1, 8), {}, v1::LAYOUT_C, "v"));
    ASSERT_OK(
        UploadArray(*alice_, std::vector<int32_t>{1, 2, 3, 4, 5, 6}, {2, 3}, v1::LAYOUT_C, "im"));
    ASSERT_OK(UploadArray(*alice_, std::vector<float>(8, 0.5f), {4, 2}, v1::LAYOUT_C, "f"));
    ASSERT_OK(alice_->CreateBuffer(
        Text<v1::CreateBufferRequest>("dtype: DTYPE_FLOAT32 shape: 8 ttl_seconds: 3600 "
                                      "fill { float_value: 2.5 }")));
    ASSIGN_OR_FAIL(v1::StreamInfo stream, alice_->CreateStream());
    stream_ = stream.id();
    ASSIGN_OR_FAIL(
        v1::Operation op,
        alice_->Submit(Text<v1::SubmitRequest>(absl::StrCat(
            "wait: true stream_id: ", Quoted(stream_), " ", ElementwiseText("x + 0", "a", "a")))));
    ASSERT_EQ(op.state(), v1::Operation::STATE_SUCCEEDED) << op.error_message();
    operation_ = op.id();
    ASSIGN_OR_FAIL(v1::ListStreamsResponse streams, alice_->ListStreams());
    for (const v1::StreamInfo& s : streams.streams()) {
      if (s.is_default()) default_stream_ = s.id();
    }
    ASSERT_FALSE(default_stream_.empty());
    region_ = RegisterRegion(kAlice, alice_shm_->name(), 0, 256, false);
    read_only_region_ = RegisterRegion(kAlice, alice_shm_->name(), 256, 256, true);
    ASSIGN_OR_FAIL(v1::BeginUploadResponse pending,
                   alice_->BeginUpload(Text<v1::BeginUploadRequest>(
                       "header { create { dtype: DTYPE_INT32 shape: 4 name: \"pending\" } } "
                       "idle_timeout_seconds: 3600")));
    transfer_ = pending.transfer_id();

    // bob: a buffer, a stream besides his default one (his quota's two), and a region.
    ASSERT_OK(UploadArray(*bob_, std::vector<double>{1, 2, 3, 4}, {}, v1::LAYOUT_C, "b"));
    ASSERT_OK(bob_->ListStreams());  // makes his default stream
    ASSERT_OK(bob_->CreateStream());
    bob_region_ = RegisterRegion(kBob, bob_shm_->name(), 0, 256, false);
    ASSERT_FALSE(region_.empty());
    ASSERT_FALSE(read_only_region_.empty());
    ASSERT_FALSE(bob_region_.empty());
  }

  void TearDown() override {
    if (has_fifo_) unlink(absl::StrCat("/dev/shm", not_shm_).c_str());
    std::remove(tokens_file_.c_str());
    std::remove(quota_file_.c_str());
  }

  std::unique_ptr<Client> As(const std::string& token) {
    absl::StatusOr<std::unique_ptr<Client>> client =
        server_->ConnectWith([&](ClientOptions& o) { o.token = token; });
    EXPECT_OK(client);
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::string RegisterRegion(const std::string& who, const std::string& name, uint64_t offset,
                             uint64_t size, bool read_only) {
    RawResult r = RawCall(channel_, "SharedMemoryService.RegisterRegion", who,
                          {Request("SharedMemoryService.RegisterRegion",
                                   absl::Substitute("system { name: $0 offset_bytes: $1 "
                                                    "size_bytes: $2 read_only: $3 }",
                                                    Quoted(name), offset, size, read_only))});
    EXPECT_OK(r.status);
    v1::RegionInfo info;
    if (!r.status.ok() || r.responses.size() != 1 || !info.ParseFromString(r.responses[0]))
      return "";
    return info.id();
  }

  // What the cases must not change.
  WorldSnapshot TakeWorldSnapshot() {
    WorldSnapshot s;
    s.alice = TakeSnapshot(*alice_);
    s.bob = TakeSnapshot(*bob_);
    s.admin = TakeSnapshot(*admin_);
    for (auto [who, client] : {std::pair{"alice", alice_.get()}, std::pair{"bob", bob_.get()}}) {
      absl::StatusOr<v1::ListBuffersResponse> buffers = client->ListBuffers();
      EXPECT_OK(buffers);
      if (buffers.ok()) {
        for (const v1::BufferInfo& b : buffers->buffers()) {
          s.lines.push_back(absl::StrCat(
              who, " buffer ", b.id(), " '", b.name(), "' ", v1::DType_Name(b.dtype()), "[",
              absl::StrJoin(b.shape(), ","), "] ", v1::Layout_Name(b.layout()), " device ",
              b.device(), " ttl ", b.ttl_seconds(), " created ", b.create_time_unix_nanos()));
          absl::StatusOr<std::string> bytes = DownloadBytes(*client, b.id());
          EXPECT_OK(bytes);
          s.lines.push_back(absl::StrCat(who, " bytes of ", b.id(), ": ",
                                         bytes.ok() ? absl::BytesToHexString(*bytes) : "?"));
        }
      }
      absl::StatusOr<v1::ListStreamsResponse> streams = client->ListStreams();
      EXPECT_OK(streams);
      if (streams.ok()) {
        for (const v1::StreamInfo& st : streams->streams()) {
          s.lines.push_back(absl::StrCat(who, " stream ", st.id(), " device ", st.device(),
                                         st.is_default() ? " default" : "", " pending ",
                                         st.pending_operations()));
        }
      }
      absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
      EXPECT_OK(info);
      if (info.ok()) {
        const v1::Limits& l = info->limits();
        s.lines.push_back(
            absl::StrCat(who, " usage: tenant ", info->tenant(), " memory ",
                         info->tenant_memory_used_bytes(), " buffers ", info->tenant_buffer_count(),
                         " quotas ", l.tenant_max_device_bytes(), "/", l.tenant_max_buffers(), "/",
                         l.tenant_max_streams(), "/", l.tenant_max_operations_in_flight()));
      }
      RawResult regions = RawCall(channel_, "SharedMemoryService.ListRegions",
                                  absl::StrCat("Bearer ", client->options().token), {""});
      EXPECT_OK(regions.status);
      v1::ListRegionsResponse list;
      if (regions.responses.size() == 1 && list.ParseFromString(regions.responses[0])) {
        for (const v1::RegionInfo& r : list.regions()) {
          s.lines.push_back(absl::StrCat(
              who, " region ", r.id(), " ", v1::RegionKind_Name(r.kind()), " ", r.shm_name(), " [",
              r.shm_offset_bytes(), ", +", r.size_bytes(), ")", r.read_only() ? " read-only" : ""));
        }
      }
    }
    absl::StatusOr<v1::ServerInfo> info = admin_->GetServerInfo();
    EXPECT_OK(info);
    if (info.ok()) {
      s.lines.push_back(absl::StrCat("server: memory ", info->memory_used_bytes(), " of ",
                                     info->memory_limit_bytes(), ", buffers ",
                                     info->buffer_count()));
    }
    s.lines.push_back(
        absl::StrCat("alice's object: ", absl::BytesToHexString(alice_shm_->Contents())));
    s.lines.push_back(absl::StrCat("bob's object: ", absl::BytesToHexString(bob_shm_->Contents())));
    return s;
  }

  // --- Adding cases.

  void Add(const std::string& rpc, Category category, const std::string& what,
           std::function<grpc::Status()> send, StatusCode code, const std::string& says) {
    cases_.push_back(Case{rpc, category, what, std::move(send), code, says, {}, "", ""});
  }

  // alice's unary call of `rpc` with `text`, a request that must name a `kind` (a stream,
  // an operation, a region) in `field` and names none: INVALID_ARGUMENT saying exactly
  // that, as for an empty buffer reference, never NOT_FOUND.
  void NamesNo(const std::string& rpc, const std::string& what, const std::string& text,
               const std::string& kind, const std::string& field) {
    Unary(rpc, kMalformed, what, kAlice, text, StatusCode::INVALID_ARGUMENT,
          absl::StrCat("the request names no ", kind, ": set '", field, "'"));
    cases_.back().exact = true;
  }

  // A unary call of `rpc` by `who` with the request `text`.
  void Unary(const std::string& rpc, Category category, const std::string& what,
             const std::string& who, const std::string& text, StatusCode code,
             const std::string& says) {
    Add(
        rpc, category, what, [this, rpc, who, text] { return Send(who, rpc, text); }, code, says);
  }

  grpc::Status Send(const std::string& who, const std::string& rpc, const std::string& text) {
    return RawCall(channel_, rpc, who, {Request(rpc, text)}).status;
  }

  // A stream of `messages` (each serialized) to `rpc` by `who`.
  void Stream(const std::string& rpc, Category category, const std::string& what,
              const std::string& who, std::vector<std::string> messages, StatusCode code,
              const std::string& says) {
    Add(
        rpc, category, what,
        [this, rpc, who, messages] { return RawCall(channel_, rpc, who, messages).status; }, code,
        says);
  }

  // A Session by `who` sending `requests` (ChainStep text, one per message), answered
  // for the last.
  void SessionCase(Category category, const std::string& what, const std::string& who,
                   std::vector<std::string> requests, StatusCode code, const std::string& says) {
    Add(
        "SessionService.Session", category, what,
        [this, who, requests] { return SendSession(who, requests); }, code, says);
  }

  grpc::Status SendSession(const std::string& who, const std::vector<std::string>& requests) {
    std::vector<std::string> messages;
    for (const std::string& r : requests) {
      messages.push_back(Request("SessionService.Session", absl::StrCat("ops { ", r, " }")));
    }
    return SessionStatus(RawCall(channel_, "SessionService.Session", who, messages),
                         messages.size());
  }

  // bob calls `call` with alice's `id`, and with `unknown_id` of the same kind.
  void OtherTenant(const std::string& rpc, const std::string& what, const std::string& id,
                   const std::string& unknown_id,
                   std::function<grpc::Status(const std::string&)> call, const std::string& says) {
    cases_.push_back(Case{rpc, kOtherTenant, what, [call, id] { return call(id); },
                          StatusCode::NOT_FOUND, says,
                          [call, unknown_id] { return call(unknown_id); }, id, unknown_id});
  }

  // bob's unary call of `rpc` with `text`, in which "$0" stands for the id.
  void OtherTenantUnary(const std::string& rpc, const std::string& what, const std::string& id,
                        const std::string& unknown_id, const std::string& text,
                        const std::string& says) {
    OtherTenant(
        rpc, what, id, unknown_id,
        [this, rpc, text](const std::string& x) {
          return Send(kBob, rpc, absl::Substitute(text, Quoted(x)));
        },
        says);
  }

  void AddBufferCases();
  void AddBufferReferenceCases(const std::string& rpc, const std::string& other_kind_id);
  void AddUploadCases();
  void AddStreamCases();
  void AddOperationCases();
  void AddServerCases();
  void AddSharedMemoryCases();
  void AddSessionCases();
  void AddAuthenticationCases();
  void AddUnparsableCases();
  void AddTenantHeaderCases();

  std::string tokens_file_, quota_file_;
  std::unique_ptr<TestServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Client> alice_, bob_, admin_;
  std::unique_ptr<ShmObject> alice_shm_, bob_shm_;
  std::string not_shm_;  // the name of a FIFO in /dev/shm, when has_fifo_
  bool has_fifo_ = false;
  // alice's objects.
  std::string a_, stream_, default_stream_, operation_, region_, read_only_region_, transfer_;
  std::string bob_region_;
  std::vector<Case> cases_;
};

// ---------------------------------------------------------------------------
// BufferService: CreateBuffer, Download, GetBuffer, ListBuffers, DeleteBuffer, RenewLease.

void BadInputMatrixTest::AddBufferCases() {
  const std::string create = "BufferService.CreateBuffer";
  const std::string long_name(300, 'n');
  Unary(create, kMalformed, "no dtype", kAlice, "shape: 4", StatusCode::INVALID_ARGUMENT,
        "dtype is required");
  Unary(create, kMalformed, "a name that looks like an id", kAlice,
        "dtype: DTYPE_FLOAT32 shape: 4 name: \"buf-x\"", StatusCode::INVALID_ARGUMENT,
        "may not start with 'buf-'");
  Unary(create, kMalformed, "a name with a control character", kAlice,
        "dtype: DTYPE_FLOAT32 shape: 4 name: \"a\\001b\"", StatusCode::INVALID_ARGUMENT,
        "buffer name contains a control character");
  Unary(create, kMalformed, "a fill with no value", kAlice, "dtype: DTYPE_FLOAT32 shape: 4 fill {}",
        StatusCode::INVALID_ARGUMENT, "fill value: scalar has no value");
  Unary(create, kWrongType, "dtype 99", kAlice, "dtype: 99 shape: 4", StatusCode::INVALID_ARGUMENT,
        "unknown dtype 99");
  Unary(create, kWrongType, "layout 7", kAlice, "dtype: DTYPE_FLOAT32 shape: [2, 2] layout: 7",
        StatusCode::INVALID_ARGUMENT, "unknown layout 7");
  Unary(create, kWrongType, "a fractional fill of an int32 buffer", kAlice,
        "dtype: DTYPE_INT32 shape: 4 fill { float_value: 1.5 }", StatusCode::INVALID_ARGUMENT,
        "1.5 cannot be stored exactly in a int32 buffer");
  Unary(create, kWrongType, "a fill of 2 for a bool buffer", kAlice,
        "dtype: DTYPE_BOOL shape: 4 fill { int_value: 2 }", StatusCode::INVALID_ARGUMENT,
        "2 is not a bool (0 or 1)");
  Unary(create, kOutOfRange, "an int32 fill beyond int32", kAlice,
        "dtype: DTYPE_INT32 shape: 4 fill { int_value: 3000000000 }", StatusCode::INVALID_ARGUMENT,
        "3000000000 does not fit in int32");
  Unary(create, kOutOfRange, "device 9", kAlice, "dtype: DTYPE_FLOAT32 shape: 4 device: 9",
        StatusCode::INVALID_ARGUMENT, "device 9 does not exist");
  Unary(create, kOutOfRange, "device -1", kAlice, "dtype: DTYPE_FLOAT32 shape: 4 device: -1",
        StatusCode::INVALID_ARGUMENT, "device -1 does not exist");
  Unary(create, kOutOfRange, "a negative ttl", kAlice,
        "dtype: DTYPE_FLOAT32 shape: 4 ttl_seconds: -1", StatusCode::INVALID_ARGUMENT,
        "ttl_seconds must be a finite number from 0 to 2592000");
  Unary(create, kOutOfRange, "a NaN ttl", kAlice, "dtype: DTYPE_FLOAT32 shape: 4 ttl_seconds: nan",
        StatusCode::INVALID_ARGUMENT, "ttl_seconds must be a finite number");
  Unary(create, kOutOfRange, "a ttl beyond 30 days", kAlice,
        "dtype: DTYPE_FLOAT32 shape: 4 ttl_seconds: 1e7", StatusCode::INVALID_ARGUMENT,
        "ttl_seconds must be a finite number from 0 to 2592000");
  Unary(create, kOversized, "9 dimensions", kAlice,
        "dtype: DTYPE_FLOAT32 shape: [1, 1, 1, 1, 1, 1, 1, 1, 1]", StatusCode::INVALID_ARGUMENT,
        "has 9 dimensions; the server allows at most 8 (--max-dimensions)");
  Unary(create, kOversized, "100000 dimensions", kAlice,
        absl::StrCat("dtype: DTYPE_FLOAT32 shape: [",
                     absl::StrJoin(std::vector<int>(100000, 1), ","), "]"),
        StatusCode::INVALID_ARGUMENT,
        "shape [1, 1, 1, 1, 1, 1, 1, 1, ...] has 100000 dimensions; the server allows at most 8");
  Unary(create, kOversized, "a shape whose size overflows", kAlice,
        "dtype: DTYPE_FLOAT64 shape: [4294967296, 4294967296]", StatusCode::INVALID_ARGUMENT,
        "elements; the server allows at most 1099511627776 (--max-elements)");
  Unary(create, kOversized, "2 MiB, over alice's device_bytes quota", kAlice,
        "dtype: DTYPE_FLOAT64 shape: 262144", StatusCode::RESOURCE_EXHAUSTED,
        "tenant 'alice' is at its quota 'device_bytes' of 1048576");
  Unary(create, kOversized, "128 MiB, over the server's memory limit", kBob,
        "dtype: DTYPE_FLOAT64 shape: 16777216", StatusCode::RESOURCE_EXHAUSTED,
        "would exceed the server's memory limit");
  Unary(create, kOversized, "a 300-byte name", kAlice,
        absl::StrCat("dtype: DTYPE_FLOAT32 shape: 4 name: ", Quoted(long_name)),
        StatusCode::INVALID_ARGUMENT, "buffer name is 300 bytes; at most 256 are allowed");

  const std::string download = "BufferService.Download";
  AddBufferReferenceCases(download, stream_);
  Stream(download, kMalformed, "bytes that are no DownloadRequest", kAlice, {"\xff\xff"},
         StatusCode::INVALID_ARGUMENT, "a malformed gpucompute.v1.DownloadRequest message");
  Unary(download, kMalformed, "an id that is no id", kAlice, "buffer: \"buf-zz\"",
        StatusCode::NOT_FOUND, "buffer buf-zz not found");
  Unary(download, kOversized, "a range of 1 TiB", kAlice,
        absl::Substitute("buffer: $0 size_bytes: 1099511627776", Quoted(a_)),
        StatusCode::INVALID_ARGUMENT, "bytes [0, +1099511627776) are outside buffer");
  Unary(download, kOutOfRange, "an offset past the end", kAlice,
        absl::Substitute("buffer: $0 offset_bytes: 17", Quoted(a_)), StatusCode::INVALID_ARGUMENT,
        "bytes [17, +0) are outside buffer");
  Unary(download, kOutOfRange, "a range whose end overflows", kAlice,
        absl::Substitute("buffer: $0 offset_bytes: 8 size_bytes: 18446744073709551615", Quoted(a_)),
        StatusCode::INVALID_ARGUMENT, "bytes [8, +18446744073709551615) are outside buffer");
  Unary(download, kOutOfRange, "a view index out of bounds", kAlice,
        "buffer: \"m\" view { index { items { slice {} } items { index: -5 } } }",
        StatusCode::INVALID_ARGUMENT,
        "download 'm' (float64(3,4)): view step 0 (index) of shape (3,4): index -5 is out of "
        "bounds for axis 1 with size 4");
  Unary(download, kOutOfRange, "a range past the end of a view", kAlice,
        "buffer: \"m\" view { index { items { index: 1 } } } offset_bytes: 8 size_bytes: 32",
        StatusCode::INVALID_ARGUMENT,
        "bytes [8, +32) are outside the view of 'm' (float64(3,4)) viewed as (4,) of 32 bytes");

  AddBufferReferenceCases("BufferService.GetBuffer", operation_);
  AddBufferReferenceCases("BufferService.DeleteBuffer", region_);

  const std::string renew = "BufferService.RenewLease";
  AddBufferReferenceCases(renew, transfer_);
  Unary(renew, kOutOfRange, "a negative ttl", kAlice,
        absl::Substitute("buffer: $0 ttl_seconds: -1", Quoted(a_)), StatusCode::INVALID_ARGUMENT,
        "ttl_seconds must be a finite number from 0 to 2592000");
  Unary(renew, kOutOfRange, "an infinite ttl", kAlice,
        absl::Substitute("buffer: $0 ttl_seconds: inf", Quoted(a_)), StatusCode::INVALID_ARGUMENT,
        "ttl_seconds must be a finite number");
  Unary(renew, kOutOfRange, "a ttl beyond 30 days", kAlice,
        absl::Substitute("buffer: $0 ttl_seconds: 3e6", Quoted(a_)), StatusCode::INVALID_ARGUMENT,
        "ttl_seconds must be a finite number from 0 to 2592000");
  OtherTenantUnary(renew, "alice's buffer, with a new ttl", a_, kNoBuffer,
                   "buffer: $0 ttl_seconds: 1", "not found");

  // A tenant named: for an admin alone, and only as a tenant name or "(unauthenticated)".
  Unary("BufferService.ListBuffers", kNonAdmin, "another tenant's buffers, no admin", kAlice,
        "tenant: \"bob\"", StatusCode::PERMISSION_DENIED,
        "listing a tenant's buffers needs an admin token; tenant 'alice' is not an admin");
  Unary("BufferService.ListBuffers", kMalformed, "a tenant that is no tenant name", kAdmin,
        "tenant: \"bob smith\"", StatusCode::INVALID_ARGUMENT,
        "tenant: a tenant name must be 1 to 64 characters of A-Z a-z 0-9 . _ -, or "
        "'(unauthenticated)' for the buffers persisted without authentication");
  Unary("BufferService.DeleteBuffer", kNonAdmin, "a buffer of no tenant, no admin", kAlice,
        absl::Substitute("tenant: \"(unauthenticated)\" buffer: $0", Quoted(a_)),
        StatusCode::PERMISSION_DENIED,
        "deleting a tenant's buffer needs an admin token; tenant 'alice' is not an admin");
  Unary("BufferService.DeleteBuffer", kWrongType, "a tenant's buffer by name", kAdmin,
        "tenant: \"alice\" buffer: \"a\"", StatusCode::INVALID_ARGUMENT,
        "with a tenant, name the buffer by its id ('buf-...'), not 'a'");
  Unary("BufferService.DeleteBuffer", kOtherTenant, "alice's buffer, as bob's", kAdmin,
        absl::Substitute("tenant: \"bob\" buffer: $0", Quoted(a_)), StatusCode::NOT_FOUND,
        absl::StrCat("buffer ", a_, " not found"));
}

// The cases of an RPC whose request names one buffer in its field `buffer` and needs
// nothing else: none, a long one, `other_kind_id` (an id of another kind), and alice's
// buffer by id and by name.
void BadInputMatrixTest::AddBufferReferenceCases(const std::string& rpc,
                                                 const std::string& other_kind_id) {
  Unary(rpc, kMalformed, "no buffer", kAlice, "", StatusCode::INVALID_ARGUMENT, "no buffer given");
  Unary(rpc, kOversized, "a 64 KiB reference", kAlice,
        absl::StrCat("buffer: ", Quoted(std::string(64 << 10, 'r'))), StatusCode::NOT_FOUND,
        "bytes left out");
  Unary(rpc, kWrongType, "an id of another kind", kAlice,
        absl::StrCat("buffer: ", Quoted(other_kind_id)), StatusCode::NOT_FOUND,
        absl::StrCat("no buffer named '", other_kind_id, "'"));
  OtherTenantUnary(rpc, "alice's buffer", a_, kNoBuffer, "buffer: $0", "not found");
  OtherTenantUnary(rpc, "alice's buffer's name", "a", "nope", "buffer: $0", "no buffer named");
}

// ---------------------------------------------------------------------------
// BufferService: Upload and BeginUpload.

void BadInputMatrixTest::AddUploadCases() {
  const std::string upload = "BufferService.Upload";
  const std::string new_int4 = "create { dtype: DTYPE_INT32 shape: 4 }";  // 16 bytes
  const std::string into_a = absl::StrCat("buffer: ", Quoted(a_));        // 16 bytes
  Stream(upload, kMalformed, "a chunk first", kAlice, {ChunkMessage(16)},
         StatusCode::INVALID_ARGUMENT, "the first upload message must be the header");
  Stream(upload, kMalformed, "a second header", kAlice,
         {HeaderMessage(new_int4), HeaderMessage(new_int4)}, StatusCode::INVALID_ARGUMENT,
         "only chunks may follow the upload header");
  Stream(upload, kMalformed, "a header with no target", kAlice, {HeaderMessage("size_bytes: 16")},
         StatusCode::INVALID_ARGUMENT, "the upload header names no target");
  Stream(upload, kMalformed, "no message at all", kAlice, {}, StatusCode::INVALID_ARGUMENT,
         "the upload sent no header");
  Stream(upload, kMalformed, "bytes that are no UploadRequest", kAlice, {"\xff\xff\xff"},
         StatusCode::INVALID_ARGUMENT, "a malformed UploadRequest message");
  Stream(upload, kMalformed, "a message with both a header and a chunk", kAlice,
         {HeaderMessage(new_int4) + ChunkMessage(16)}, StatusCode::INVALID_ARGUMENT,
         "carries more than one of 'header' and 'chunk'");
  Stream(upload, kMalformed, "a chunk of the wrong wire type", kAlice,
         {HeaderMessage(new_int4), std::string("\x10\x05", 2)}, StatusCode::INVALID_ARGUMENT,
         "field 'chunk' has the wrong wire type");
  Stream(upload, kMalformed, "a new buffer with a fill", kAlice,
         {HeaderMessage("create { dtype: DTYPE_INT32 shape: 4 fill { int_value: 1 } }"),
          ChunkMessage(16)},
         StatusCode::INVALID_ARGUMENT, "an upload provides the contents; 'fill' is not allowed");
  Stream(upload, kMalformed, "a new buffer at offset 8", kAlice,
         {HeaderMessage(new_int4 + " offset_bytes: 8"), ChunkMessage(16)},
         StatusCode::INVALID_ARGUMENT, "an upload that creates a buffer must start at offset 0");
  Stream(upload, kMalformed, "a range header that also names a target", kAlice,
         {HeaderMessage(
             absl::StrCat(into_a, " transfer_id: ", Quoted(kNoTransfer), " size_bytes: 4"))},
         StatusCode::INVALID_ARGUMENT,
         "a range stream's header names its transfer_id and no target");
  Stream(upload, kMalformed, "a chunk whose CRC32C does not match", kAlice,
         {HeaderMessage(into_a + " size_bytes: 16"), ChunkMessage(16, 0x12345678)},
         StatusCode::DATA_LOSS, "the chunk at byte 0 of the upload does not match its CRC32C");
  Stream(upload, kMalformed, "fewer bytes than declared", kAlice,
         {HeaderMessage(into_a + " size_bytes: 16"), ChunkMessage(8)}, StatusCode::INVALID_ARGUMENT,
         "an upload stream ended after 8 of the 16 bytes it declared");
  Stream(upload, kOversized, "a chunk past the declared size", kAlice,
         {HeaderMessage(new_int4), ChunkMessage(20)}, StatusCode::INVALID_ARGUMENT,
         "the upload stream sent more than the 16 bytes it declared");
  Stream(upload, kOversized, "a second chunk past the declared size", kAlice,
         {HeaderMessage(into_a + " size_bytes: 16"), ChunkMessage(16), ChunkMessage(1)},
         StatusCode::INVALID_ARGUMENT, "the upload stream sent more than the 16 bytes it declared");
  Stream(upload, kOversized, "size_bytes larger than the new buffer", kAlice,
         {HeaderMessage(new_int4 + " size_bytes: 64"), ChunkMessage(64)},
         StatusCode::INVALID_ARGUMENT,
         "size_bytes is 64 but a int32 buffer of that shape holds 16 bytes");
  Stream(upload, kOversized, "a new buffer over alice's quota", kAlice,
         {HeaderMessage("create { dtype: DTYPE_FLOAT64 shape: 262144 }"), ChunkMessage(1024)},
         StatusCode::RESOURCE_EXHAUSTED, "tenant 'alice' is at its quota 'device_bytes'");
  Stream(upload, kOversized, "64 bytes into a 16-byte buffer", kAlice,
         {HeaderMessage(into_a + " size_bytes: 64"), ChunkMessage(64)},
         StatusCode::INVALID_ARGUMENT, "bytes [0, +64) are outside buffer");
  Add(
      upload, kOversized, "a chunk over the server's 64 MiB message limit",
      [this, into_a] {
        return RawCall(channel_, "BufferService.Upload", kAlice,
                       {HeaderMessage(into_a + " size_bytes: 16"), ChunkMessage(kMaxMessageBytes)})
            .status;
      },
      StatusCode::RESOURCE_EXHAUSTED, "Received message larger than max");
  Stream(upload, kWrongType, "dtype 42", kAlice, {HeaderMessage("create { dtype: 42 shape: 4 }")},
         StatusCode::INVALID_ARGUMENT, "unknown dtype 42");
  Stream(
      upload, kWrongType, "a stream id as the buffer", kAlice,
      {HeaderMessage(absl::StrCat("buffer: ", Quoted(stream_), " size_bytes: 4")), ChunkMessage(4)},
      StatusCode::NOT_FOUND, absl::StrCat("no buffer named '", stream_, "'"));
  Stream(upload, kOutOfRange, "an offset past the end", kAlice,
         {HeaderMessage(into_a + " offset_bytes: 20 size_bytes: 4"), ChunkMessage(4)},
         StatusCode::INVALID_ARGUMENT, "bytes [20, +4) are outside buffer");
  Stream(upload, kOutOfRange, "a range ending past the end", kAlice,
         {HeaderMessage(into_a + " offset_bytes: 8 size_bytes: 16"), ChunkMessage(16)},
         StatusCode::INVALID_ARGUMENT, "bytes [8, +16) are outside buffer");
  Stream(upload, kOutOfRange, "device 9", kAlice,
         {HeaderMessage("create { dtype: DTYPE_INT32 shape: 4 device: 9 }"), ChunkMessage(16)},
         StatusCode::INVALID_ARGUMENT, "device 9 does not exist");
  // Range streams of a multi-range upload alice begins for the case.
  const auto range = [this](const std::string& range_header) {
    return [this, range_header]() -> grpc::Status {
      RawResult begun = RawCall(channel_, "BufferService.BeginUpload", kAlice,
                                {Request("BufferService.BeginUpload",
                                         "header { create { dtype: DTYPE_INT32 shape: 4 } }")});
      v1::BeginUploadResponse response;
      if (!begun.status.ok() || begun.responses.size() != 1 ||
          !response.ParseFromString(begun.responses[0])) {
        return grpc::Status(StatusCode::INTERNAL, "the test's BeginUpload failed");
      }
      return RawCall(channel_, "BufferService.Upload", kAlice,
                     {HeaderMessage(absl::StrCat("transfer_id: ", Quoted(response.transfer_id()),
                                                 " ", range_header)),
                      ChunkMessage(1)})
          .status;
    };
  };
  Add(upload, kOversized, "a range larger than its upload", range("offset_bytes: 0 size_bytes: 32"),
      StatusCode::INVALID_ARGUMENT, "range [0, +32) is outside the upload's 16 bytes");
  Add(upload, kOutOfRange, "a range past the end of its upload",
      range("offset_bytes: 100 size_bytes: 1"), StatusCode::INVALID_ARGUMENT,
      "range [100, +1) is outside the upload's 16 bytes");
  Add(upload, kOutOfRange, "an empty range", range("offset_bytes: 4 size_bytes: 0"),
      StatusCode::INVALID_ARGUMENT, "a range stream must carry at least one byte");
  OtherTenant(
      upload, "alice's buffer", a_, kNoBuffer,
      [this](const std::string& id) {
        return RawCall(channel_, "BufferService.Upload", kBob,
                       {HeaderMessage(absl::StrCat("buffer: ", Quoted(id), " size_bytes: 16")),
                        ChunkMessage(16)})
            .status;
      },
      "not found");
  OtherTenant(
      upload, "a range of alice's upload", transfer_, kNoTransfer,
      [this](const std::string& id) {
        return RawCall(channel_, "BufferService.Upload", kBob,
                       {HeaderMessage(absl::StrCat("transfer_id: ", Quoted(id),
                                                   " offset_bytes: 0 size_bytes: 16")),
                        ChunkMessage(16)})
            .status;
      },
      "no upload in progress has transfer id");

  const std::string begin = "BufferService.BeginUpload";
  Unary(begin, kMalformed, "a header with no target", kAlice, "header { size_bytes: 16 }",
        StatusCode::INVALID_ARGUMENT, "the upload header names no target");
  Unary(begin, kMalformed, "a header naming a transfer id", kAlice,
        absl::StrCat("header { ", new_int4, " transfer_id: ", Quoted(kNoTransfer), " }"),
        StatusCode::INVALID_ARGUMENT, "a new upload's header may not name a transfer_id");
  Unary(begin, kMalformed, "no size for an existing buffer", kAlice,
        absl::StrCat("header { ", into_a, " }"), StatusCode::INVALID_ARGUMENT,
        "a multi-range upload needs size_bytes of at least 1");
  Unary(begin, kMalformed, "an empty new buffer", kAlice,
        "header { create { dtype: DTYPE_INT32 shape: 0 } }", StatusCode::INVALID_ARGUMENT,
        "a multi-range upload carries at least one byte");
  Unary(begin, kMalformed, "a new buffer with a fill", kAlice,
        "header { create { dtype: DTYPE_INT32 shape: 4 fill { int_value: 1 } } }",
        StatusCode::INVALID_ARGUMENT, "'fill' is not allowed");
  Unary(begin, kOversized, "a new buffer over alice's quota", kAlice,
        "header { create { dtype: DTYPE_FLOAT64 shape: 262144 } }", StatusCode::RESOURCE_EXHAUSTED,
        "tenant 'alice' is at its quota 'device_bytes'");
  Unary(begin, kOversized, "size_bytes larger than the new buffer", kAlice,
        absl::StrCat("header { ", new_int4, " size_bytes: 64 }"), StatusCode::INVALID_ARGUMENT,
        "size_bytes is 64 but a int32 buffer of that shape holds 16 bytes");
  Unary(begin, kOversized, "64 bytes into a 16-byte buffer", kAlice,
        absl::StrCat("header { ", into_a, " size_bytes: 64 }"), StatusCode::INVALID_ARGUMENT,
        "bytes [0, +64) are outside buffer");
  Unary(begin, kWrongType, "dtype 42", kAlice, "header { create { dtype: 42 shape: 4 } }",
        StatusCode::INVALID_ARGUMENT, "unknown dtype 42");
  Unary(begin, kWrongType, "a region id as the buffer", kAlice,
        absl::Substitute("header { buffer: $0 size_bytes: 4 }", Quoted(region_)),
        StatusCode::NOT_FOUND, absl::StrCat("no buffer named '", region_, "'"));
  Unary(begin, kOutOfRange, "a negative idle timeout", kAlice,
        absl::StrCat("header { ", new_int4, " } idle_timeout_seconds: -1"),
        StatusCode::INVALID_ARGUMENT, "timeout must be >= 0 seconds, got -1");
  Unary(begin, kOutOfRange, "a NaN idle timeout", kAlice,
        absl::StrCat("header { ", new_int4, " } idle_timeout_seconds: nan"),
        StatusCode::INVALID_ARGUMENT, "timeout must be >= 0 seconds, got nan");
  Unary(begin, kOutOfRange, "an offset past the end", kAlice,
        absl::StrCat("header { ", into_a, " offset_bytes: 20 size_bytes: 1 }"),
        StatusCode::INVALID_ARGUMENT, "bytes [20, +1) are outside buffer");
  Unary(begin, kOutOfRange, "device 9", kAlice,
        "header { create { dtype: DTYPE_INT32 shape: 4 device: 9 } }", StatusCode::INVALID_ARGUMENT,
        "device 9 does not exist");
  OtherTenantUnary(begin, "alice's buffer", a_, kNoBuffer, "header { buffer: $0 size_bytes: 16 }",
                   "not found");
}

// ---------------------------------------------------------------------------
// StreamService.

void BadInputMatrixTest::AddStreamCases() {
  const std::string create = "StreamService.CreateStream";
  Unary(create, kOutOfRange, "device 9", kAlice, "device: 9", StatusCode::INVALID_ARGUMENT,
        "device 9 does not exist");
  Unary(create, kOutOfRange, "device -1", kAlice, "device: -1", StatusCode::INVALID_ARGUMENT,
        "device -1 does not exist");
  Unary(create, kOversized, "a stream beyond bob's quota", kBob, "", StatusCode::RESOURCE_EXHAUSTED,
        "tenant 'bob' is at its quota 'streams' of 2");

  const std::string del = "StreamService.DeleteStream";
  NamesNo(del, "no stream", "", "stream", "stream_id");
  Unary(del, kWrongType, "a buffer id", kAlice, absl::StrCat("stream_id: ", Quoted(a_)),
        StatusCode::NOT_FOUND, absl::StrCat("stream ", a_, " not found"));
  Unary(del, kWrongType, "the default stream", kAlice,
        absl::StrCat("stream_id: ", Quoted(default_stream_)), StatusCode::FAILED_PRECONDITION,
        "is a default stream and cannot be deleted");
  OtherTenantUnary(del, "alice's stream", stream_, kNoStream, "stream_id: $0", "not found");
  OtherTenantUnary(del, "alice's default stream", default_stream_, kNoStream, "stream_id: $0",
                   "not found");

  const std::string sync = "StreamService.SynchronizeStream";
  Unary(sync, kOutOfRange, "a negative timeout", kAlice, "timeout_seconds: -1",
        StatusCode::INVALID_ARGUMENT, "timeout must be >= 0 seconds, got -1");
  Unary(sync, kOutOfRange, "a NaN timeout", kAlice,
        absl::StrCat("stream_id: ", Quoted(stream_), " timeout_seconds: nan"),
        StatusCode::INVALID_ARGUMENT, "timeout must be >= 0 seconds, got nan");
  Unary(sync, kWrongType, "an operation id", kAlice,
        absl::StrCat("stream_id: ", Quoted(operation_)), StatusCode::NOT_FOUND,
        absl::StrCat("stream ", operation_, " not found"));
  OtherTenantUnary(sync, "alice's stream", stream_, kNoStream, "stream_id: $0 timeout_seconds: 5",
                   "not found");
}

// ---------------------------------------------------------------------------
// OperationService.

void BadInputMatrixTest::AddOperationCases() {
  const std::string submit = "OperationService.Submit";
  const auto op = [&](Category category, const std::string& what, const std::string& who,
                      const std::string& text, StatusCode code, const std::string& says) {
    Unary(submit, category, what, who, "wait: true " + text, code, says);
  };
  const std::string random_new =
      "random { output { dtype: DTYPE_FLOAT64 } distribution: DISTRIBUTION_UNIFORM";
  op(kMalformed, "no operation", kAlice, "", StatusCode::INVALID_ARGUMENT,
     "the request names no operation");
  op(kMalformed, "an expression that does not parse", kAlice, ElementwiseText("x +", "a"),
     StatusCode::INVALID_ARGUMENT, "position");
  op(kMalformed, "an unbound name", kAlice, ElementwiseText("x + y", "a"),
     StatusCode::INVALID_ARGUMENT, "'y' is not bound to an input");
  op(kMalformed, "an input bound to nothing", kAlice,
     "elementwise { expression: \"x\" inputs { key: \"x\" value {} } }",
     StatusCode::INVALID_ARGUMENT, "input 'x' is bound to nothing");
  op(kMalformed, "a scalar with no value", kAlice,
     "elementwise { expression: \"x\" inputs { key: \"x\" value { scalar {} } } }",
     StatusCode::INVALID_ARGUMENT, "input 'x' is a scalar with no value");
  op(kMalformed, "no reduce kind", kAlice, "reduce { input: \"v\" }", StatusCode::INVALID_ARGUMENT,
     "reduce kind is required");
  op(kMalformed, "no reduce input", kAlice, "reduce { kind: REDUCE_KIND_SUM }",
     StatusCode::INVALID_ARGUMENT, "reduce input is required");
  op(kMalformed, "no gemv matrix", kAlice, "gemv { x: \"v\" }", StatusCode::INVALID_ARGUMENT,
     "gemv matrix 'a' is required");
  op(kMalformed, "no distribution", kAlice, "random { output { dtype: DTYPE_FLOAT64 } shape: 4 }",
     StatusCode::INVALID_ARGUMENT, "random distribution is required");
  op(kMalformed, "a new random buffer without a dtype", kAlice,
     "random { distribution: DISTRIBUTION_UNIFORM shape: 4 }", StatusCode::INVALID_ARGUMENT,
     "a new random buffer needs output.dtype");
  op(kMalformed, "a ttl for an existing output", kAlice,
     "random { distribution: DISTRIBUTION_UNIFORM output { buffer: \"v\" ttl_seconds: 5 } }",
     StatusCode::INVALID_ARGUMENT, "output.ttl_seconds applies to a new buffer");
  op(kOversized, "a 70000-byte expression", kAlice,
     ElementwiseText(std::string(70000 - 1, ' ') + "x", "a"), StatusCode::INVALID_ARGUMENT,
     "expression is 70000 bytes; the server allows at most 65536 (--max-expression-bytes)");
  op(kOversized, "a new buffer over alice's quota", kAlice, random_new + " shape: 262144 }",
     StatusCode::RESOURCE_EXHAUSTED, "tenant 'alice' is at its quota 'device_bytes'");
  op(kOversized, "a new buffer over the server's memory limit", kBob,
     random_new + " shape: 16777216 }", StatusCode::RESOURCE_EXHAUSTED,
     "would exceed the server's memory limit");
  op(kOversized, "9 dimensions", kAlice, random_new + " shape: [1, 1, 1, 1, 1, 1, 1, 1, 1] }",
     StatusCode::INVALID_ARGUMENT,
     "has 9 dimensions; the server allows at most 8 (--max-dimensions)");
  op(kOversized, "a shape whose size overflows", kAlice,
     random_new + " shape: [4294967296, 4294967296] }", StatusCode::INVALID_ARGUMENT,
     "elements; the server allows at most 1099511627776 (--max-elements)");
  op(kWrongType, "gemv of an int32 matrix", kAlice, "gemv { a: \"im\" x: \"v\" }",
     StatusCode::INVALID_ARGUMENT, "gemv matrix 'im' (int32[2, 3]) must be float32 or float64");
  op(kWrongType, "gemv with a vector of the wrong length", kAlice, "gemv { a: \"m\" x: \"m\" }",
     StatusCode::INVALID_ARGUMENT, "gemv vector x 'm' (float64[3, 4]) must be float64[4]");
  op(kWrongType, "random integers into float64", kAlice,
     "random { output { dtype: DTYPE_FLOAT64 } distribution: DISTRIBUTION_INTEGERS shape: 4 "
     "low: 0 high: 9 }",
     StatusCode::INVALID_ARGUMENT, "random integers need an int32 or int64 output, not float64");
  op(kWrongType, "uniform values into an int32 buffer", kAlice,
     "random { output { buffer: \"a\" } distribution: DISTRIBUTION_UNIFORM }",
     StatusCode::INVALID_ARGUMENT, "need a float32 or float64 output, not int32");
  op(kWrongType, "a float result into an int32 buffer", kAlice,
     ElementwiseText("x * 0.5", "a", "a"), StatusCode::INVALID_ARGUMENT,
     "the result is float64 and cannot be written as int32 (only same-kind casts are allowed)");
  op(kWrongType, "reduce kind 99", kAlice, "reduce { input: \"v\" kind: 99 }",
     StatusCode::INVALID_ARGUMENT, "unknown reduce kind 99");
  op(kWrongType, "distribution 77", kAlice,
     "random { output { dtype: DTYPE_FLOAT64 } distribution: 77 shape: 4 }",
     StatusCode::INVALID_ARGUMENT, "unknown distribution 77");
  op(kWrongType, "output dtype 99", kAlice,
     "elementwise { expression: \"x\" inputs { key: \"x\" value { buffer: \"v\" } } "
     "output { dtype: 99 } }",
     StatusCode::INVALID_ARGUMENT, "unknown dtype 99");
  op(kWrongType, "inputs whose shapes do not broadcast", kAlice,
     "elementwise { expression: \"x + y\" inputs { key: \"x\" value { buffer: \"v\" } } "
     "inputs { key: \"y\" value { buffer: \"m\" view { transpose {} } } } }",
     StatusCode::INVALID_ARGUMENT,
     "operands could not be broadcast together with shapes (4,) (4,3)");
  op(kWrongType, "an output of another shape", kAlice, ElementwiseText("x", "v", "m"),
     StatusCode::INVALID_ARGUMENT, "has shape [3, 4] but the result has shape [4]");
  op(kWrongType, "a shape that differs from the random output's", kAlice,
     "random { output { buffer: \"v\" } distribution: DISTRIBUTION_UNIFORM shape: 8 }",
     StatusCode::INVALID_ARGUMENT, "shape [8] differs from the output 'v'");
  op(kOutOfRange, "axis 2 of a 2-D input", kAlice,
     "reduce { input: \"m\" kind: REDUCE_KIND_SUM axis: 2 }", StatusCode::INVALID_ARGUMENT,
     "axis 2 is out of bounds for array of dimension 2");
  op(kOutOfRange, "axis -3 of a 2-D input", kAlice,
     "reduce { input: \"m\" kind: REDUCE_KIND_SUM axis: -3 }", StatusCode::INVALID_ARGUMENT,
     "axis -3 is out of bounds for array of dimension 2");
  op(kOutOfRange, "axis 1 of a 1-D input", kAlice,
     "reduce { input: \"v\" kind: REDUCE_KIND_SUM axis: 1 }", StatusCode::INVALID_ARGUMENT,
     "axis 1 is out of bounds for array of dimension 1");
  op(kOutOfRange, "random integers with low == high", kAlice,
     "random { output { dtype: DTYPE_INT64 } distribution: DISTRIBUTION_INTEGERS shape: 4 "
     "low: 5 high: 5 }",
     StatusCode::INVALID_ARGUMENT, "random integers need low < high; got [5, 5)");
  op(kOutOfRange, "random integers beyond int32", kAlice,
     "random { output { dtype: DTYPE_INT32 } distribution: DISTRIBUTION_INTEGERS shape: 4 "
     "low: 0 high: 10000000000 }",
     StatusCode::INVALID_ARGUMENT, "does not fit an int32 output");
  op(kOutOfRange, "a negative stddev", kAlice,
     "random { output { dtype: DTYPE_FLOAT64 } distribution: DISTRIBUTION_NORMAL shape: 4 "
     "stddev: -1 }",
     StatusCode::INVALID_ARGUMENT, "normal needs a finite mean and a finite, non-negative stddev");
  op(kOutOfRange, "a counter offset that overflows", kAlice,
     random_new + " shape: 16 offset: 18446744073709551615 }", StatusCode::INVALID_ARGUMENT,
     "overflows 64 bits");
  op(kOutOfRange, "a negative wait timeout", kAlice,
     "wait_timeout_seconds: -1 " + ElementwiseText("x + 0", "a", "a"), StatusCode::INVALID_ARGUMENT,
     "timeout must be >= 0 seconds, got -1");
  op(kOutOfRange, "a negative output ttl", kAlice,
     "random { output { dtype: DTYPE_FLOAT64 ttl_seconds: -1 } distribution: DISTRIBUTION_UNIFORM "
     "shape: 4 }",
     StatusCode::INVALID_ARGUMENT, "ttl_seconds must be a finite number");
  // Views and broadcasting.
  const auto viewed = [](const std::string& expression, const std::string& x_view,
                         const std::string& output) {
    return absl::Substitute(
        "elementwise { expression: $0 inputs { key: \"x\" value { buffer: \"m\" $1 } } $2 }",
        Quoted(expression), x_view, output);
  };
  op(kWrongType, "an output view that broadcasts", kAlice,
     viewed("x * 0", "",
            "output { buffer: \"m\" view { index { items { index: 0 } } } "
            "view { broadcast_to { extents: [3, 4] } } }"),
     StatusCode::INVALID_ARGUMENT,
     "output 'm' (float64(3,4)) broadcasts (stride 0 on an axis longer than 1): it may be read, "
     "not written");
  op(kWrongType, "an output view that overlaps an input partly", kAlice,
     viewed("x + 1", "view { index { items { slice {} } items { slice { stop: -1 } } } }",
            "output { buffer: \"m\" view { index { items { slice {} } items { slice { start: 1 } "
            "} } } }"),
     StatusCode::INVALID_ARGUMENT,
     "output view 'm' (float64(3,4)) viewed as (3,3) overlaps input 'x' 'm' (float64(3,4)) "
     "viewed as (3,3) only partly; NumPy's result would depend on the order of the writes");
  op(kOutOfRange, "a view index out of bounds", kAlice,
     viewed("x + 1", "view { index { items { index: 3 } } }", ""), StatusCode::INVALID_ARGUMENT,
     "input 'x' 'm' (float64(3,4)): view step 0 (index) of shape (3,4): index 3 is out of bounds "
     "for axis 0 with size 3");
  op(kOutOfRange, "a view slice of step 0", kAlice,
     viewed("x + 1", "view { index { items { slice { step: 0 } } } }", ""),
     StatusCode::INVALID_ARGUMENT,
     "input 'x' 'm' (float64(3,4)): view step 0 (index) of shape (3,4): slice step cannot be zero");
  op(kWrongType, "a reshape the strides do not allow", kAlice,
     viewed("x + 1", "view { reshape { extents: 12 } }", ""), StatusCode::INVALID_ARGUMENT,
     "view step 0 (reshape) of shape (3,4): cannot reshape a view of shape (3,4) into shape "
     "(12,) without copying its elements; copy it into a new buffer first (an elementwise 'x')");
  std::string many_steps;
  for (int k = 0; k < 65; ++k) many_steps += "view { transpose {} } ";
  op(kOversized, "65 view steps", kAlice, viewed("x + 1", many_steps, ""),
     StatusCode::INVALID_ARGUMENT,
     "input 'x' 'm' (float64(3,4)): a view has 65 steps; the server allows at most 64");
  op(kOversized, "a view of 9 dimensions", kAlice,
     viewed("x + 1", "view { expand_dims { axes: [0, 1, 2, 3, 4, 5, 6] } }", ""),
     StatusCode::INVALID_ARGUMENT,
     "the view would have 9 dimensions; the server allows at most 8");
  op(kWrongType, "a transpose that is no permutation", kAlice,
     viewed("x + 1", "view { transpose { axes: [1, 1] } }", ""), StatusCode::INVALID_ARGUMENT,
     "view step 0 (transpose) of shape (3,4): repeated axis in transpose");
  op(kMalformed, "an output view of a new buffer", kAlice,
     viewed("x + 1", "", "output { view { transpose {} } }"), StatusCode::INVALID_ARGUMENT,
     "output.view applies to an existing output.buffer; a new buffer is written whole");
  op(kMalformed, "an output view of a gemv", kAlice,
     "gemv { a: \"m\" x: \"v\" y { buffer: \"v\" view { transpose {} } } }",
     StatusCode::INVALID_ARGUMENT,
     "output.view applies to elementwise operations only; write the whole buffer");
  op(kMalformed, "a view of a scalar operand", kAlice,
     "elementwise { expression: \"s + 1\" inputs { key: \"s\" value { scalar { float_value: 1 } "
     "view { transpose {} } } } }",
     StatusCode::INVALID_ARGUMENT, "input 's' is a scalar; a view applies to a buffer");
  op(kWrongType, "a gemv matrix view with no unit stride", kAlice,
     "gemv { a: \"m\" a_view { index { items { slice { step: 2 } } items { slice { step: 2 } } "
     "} } x: \"v\" x_view { index { items { slice { stop: 2 } } } } }",
     StatusCode::INVALID_ARGUMENT,
     "gemv matrix 'a' 'm' (float64(3,4)) viewed as (2,2) has matrices with strides (2, 6) in "
     "elements; BLAS needs a unit stride on one of their two axes and a positive stride on the "
     "other, at least the first's extent: copy it first (an elementwise 'x' into a new buffer)");
  op(kWrongType, "a shift by a float", kAlice, ElementwiseText("x << 1.5", "a"),
     StatusCode::INVALID_ARGUMENT,
     "at position 2: ufunc 'left_shift' not supported for the input types (int32, float); "
     "operator '<<' takes integers or bools");
  op(kMalformed, "Python's 'and' between arrays", kAlice, ElementwiseText("x > 1 and x < 3", "a"),
     StatusCode::INVALID_ARGUMENT,
     "at position 6: 'and' is not supported (an array has no single truth value); use "
     "logical_and(a, b), or a & b on bools");
  op(kWrongType, "round() to a float number of decimals", kAlice,
     ElementwiseText("round(x, 0.5)", "a"), StatusCode::INVALID_ARGUMENT,
     "at position 9: the decimals of round() must be an integer literal or an integer scalar "
     "input");
  op(kWrongType, "normal transform 4", kAlice,
     "random { output { dtype: DTYPE_FLOAT64 } distribution: DISTRIBUTION_NORMAL shape: 4 "
     "normal_transform: 4 }",
     StatusCode::INVALID_ARGUMENT,
     "unknown normal_transform 4; there are NORMAL_TRANSFORM_V1 (1, also the default 0), "
     "NORMAL_TRANSFORM_V2 (2) and NORMAL_TRANSFORM_V3 (3)");
  const auto bob_op = [this, submit](const std::string& what, const std::string& id,
                                     const std::string& unknown, const std::string& text) {
    OtherTenantUnary(submit, what, id, unknown, "wait: true " + text, "not found");
  };
  bob_op("alice's buffer as an operand", a_, kNoBuffer,
         "elementwise { expression: \"x + 1\" inputs { key: \"x\" value { buffer: $0 } } }");
  bob_op("alice's buffer as the output", a_, kNoBuffer,
         "elementwise { expression: \"x + 1\" inputs { key: \"x\" value { buffer: \"b\" } } "
         "output { buffer: $0 } }");
  bob_op("alice's stream", stream_, kNoStream,
         "stream_id: $0 elementwise { expression: \"x + 1\" "
         "inputs { key: \"x\" value { buffer: \"b\" } } }");
  bob_op("alice's matrix in a gemv", a_, kNoBuffer, "gemv { a: $0 x: \"b\" }");
  bob_op("alice's buffer as a reduce input", a_, kNoBuffer,
         "reduce { input: $0 kind: REDUCE_KIND_SUM }");
  bob_op("alice's buffer as a random output", a_, kNoBuffer,
         "random { output { buffer: $0 } distribution: DISTRIBUTION_INTEGERS low: 0 high: 2 }");
  // matmul: "m" is float64 (3, 4) in F layout, "v" float64 (4,), "im" int32 (2, 3), "f"
  // float32 (4, 2).
  const std::string mt = "b: \"m\" b_view { transpose {} }";  // (4, 3)
  op(kMalformed, "no matmul operand a", kAlice, "matmul { b: \"m\" }",
     StatusCode::INVALID_ARGUMENT, "matmul operand 'a' is required");
  op(kWrongType, "matmul with mismatched inner dimensions", kAlice,
     "matmul { a: \"m\" b: \"m\" }", StatusCode::INVALID_ARGUMENT,
     "matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc signature "
     "(n?,k),(k,m?)->(n?,m?) (size 3 is different from 4); operand 'a' is 'm' (float64(3,4)), "
     "operand 'b' is 'm' (float64(3,4))");
  op(kWrongType, "matmul of batches that do not broadcast", kAlice,
     "matmul { a: \"m\" a_view { broadcast_to { extents: [2, 3, 4] } } " + mt +
         " b_view { broadcast_to { extents: [3, 4, 3] } } }",
     StatusCode::INVALID_ARGUMENT,
     "matmul: operands could not be broadcast together in their batch dimension (2 and 3); "
     "operand 'a' is 'm' (float64(3,4)) viewed as (2,3,4), operand 'b' is 'm' "
     "(float64(3,4)) viewed as (3,4,3)");
  op(kWrongType, "matmul of int32 matrices", kAlice, "matmul { a: \"im\" b: \"im\" }",
     StatusCode::INVALID_ARGUMENT,
     "matmul operand 'a' 'im' (int32(2,3)) must be float32 or float64");
  op(kWrongType, "matmul of float64 by float32", kAlice, "matmul { a: \"m\" b: \"f\" }",
     StatusCode::INVALID_ARGUMENT,
     "matmul operands must have one dtype; operand 'a' is 'm' (float64(3,4)), operand 'b' is "
     "'f' (float32(4,2))");
  op(kWrongType, "allow_tf32 with float64", kAlice,
     "matmul { a: \"m\" " + mt + " allow_tf32: true }", StatusCode::INVALID_ARGUMENT,
     "allow_tf32 applies to float32 operands only; these are float64");
  op(kWrongType, "a matmul operand with no unit stride", kAlice,
     "matmul { a: \"m\" a_view { index { items { slice { step: 2 } } items { slice { step: 2 } } "
     "} } b: \"m\" b_view { index { items { slice { step: 2 } } items { slice { stop: 2 } } } } }",
     StatusCode::INVALID_ARGUMENT,
     "matmul operand 'a' 'm' (float64(3,4)) viewed as (2,2) has matrices with strides (2, 6) "
     "in elements; BLAS needs a unit stride on one of their two axes and a positive stride on "
     "the other, at least the first's extent: copy it first (an elementwise 'x' into a new "
     "buffer)");
  op(kWrongType, "a broadcast matmul operand", kAlice,
     "matmul { a: \"v\" a_view { broadcast_to { extents: [3, 4] } } " + mt + " }",
     StatusCode::INVALID_ARGUMENT,
     "matmul operand 'a' 'v' (float64(4,)) viewed as (3,4) repeats elements along an axis of "
     "its matrices (a broadcast view, stride 0), which BLAS cannot read: copy it first");
  op(kWrongType, "a matmul output that is an operand's buffer", kAlice,
     "matmul { a: \"m\" a_view { index { items { slice {} } items { slice { stop: 3 } } } } "
     "b: \"m\" c { buffer: \"m\" } }",
     StatusCode::INVALID_ARGUMENT,
     "matmul output c must not be the buffer of operand 'a' (BLAS would read what it writes): "
     "write to another buffer");
  op(kWrongType, "a matmul output of the wrong shape", kAlice,
     "matmul { a: \"m\" " + mt + " c { buffer: \"v\" } }", StatusCode::INVALID_ARGUMENT,
     "output 'v' (float64[4]) has shape [4] but the result has shape [3, 3]");
  op(kWrongType, "a matmul output through a view", kAlice,
     "matmul { a: \"m\" " + mt + " c { buffer: \"m\" view { transpose {} } } }",
     StatusCode::INVALID_ARGUMENT,
     "output.view applies to elementwise operations; matmul writes a whole buffer c");

  const std::string get = "OperationService.GetOperation";
  NamesNo(get, "no operation id", "", "operation", "operation_id");
  Unary(get, kOversized, "a 64 KiB id", kAlice,
        absl::StrCat("operation_id: ", Quoted(std::string(64 << 10, 'o'))), StatusCode::NOT_FOUND,
        "bytes left out");
  Unary(get, kWrongType, "a buffer id", kAlice, absl::StrCat("operation_id: ", Quoted(a_)),
        StatusCode::NOT_FOUND, absl::StrCat("operation ", a_, " not found"));
  OtherTenantUnary(get, "alice's operation", operation_, kNoOperation, "operation_id: $0",
                   "not found");

  const std::string wait = "OperationService.WaitOperation";
  NamesNo(wait, "no operation id", "", "operation", "operation_id");
  NamesNo(wait, "no operation id, with a timeout", "timeout_seconds: 5", "operation",
          "operation_id");
  Unary(wait, kOutOfRange, "a negative timeout", kAlice,
        absl::StrCat("operation_id: ", Quoted(operation_), " timeout_seconds: -1"),
        StatusCode::INVALID_ARGUMENT, "timeout must be >= 0 seconds, got -1");
  Unary(wait, kOutOfRange, "a NaN timeout", kAlice,
        absl::StrCat("operation_id: ", Quoted(operation_), " timeout_seconds: nan"),
        StatusCode::INVALID_ARGUMENT, "timeout must be >= 0 seconds, got nan");
  Unary(wait, kWrongType, "a stream id", kAlice, absl::StrCat("operation_id: ", Quoted(stream_)),
        StatusCode::NOT_FOUND, absl::StrCat("operation ", stream_, " not found"));
  OtherTenantUnary(wait, "alice's operation", operation_, kNoOperation,
                   "operation_id: $0 timeout_seconds: 5", "not found");

  // Reductions over axes, of views and of expressions (NumPy's words where NumPy has some).
  op(kMalformed, "duplicate reduce axes", kAlice,
     "reduce { input: \"m\" kind: REDUCE_KIND_SUM axes { axes: 0 axes: -2 } }",
     StatusCode::INVALID_ARGUMENT, "duplicate value in 'axis'");
  op(kOutOfRange, "reduce axes out of range", kAlice,
     "reduce { input: \"m\" kind: REDUCE_KIND_SUM axes { axes: 1 axes: 2 } }",
     StatusCode::INVALID_ARGUMENT, "axis 2 is out of bounds for array of dimension 2");
  op(kMalformed, "reduce axis and axes both", kAlice,
     "reduce { input: \"m\" kind: REDUCE_KIND_SUM axis: 0 axes { axes: 1 } }",
     StatusCode::INVALID_ARGUMENT, "reduce takes axis or axes, not both");
  op(kMalformed, "argmin over two axes", kAlice,
     "reduce { input: \"m\" kind: REDUCE_KIND_ARGMIN axes { axes: 0 axes: 1 } }",
     StatusCode::INVALID_ARGUMENT, "argmin takes one axis, or none for the whole array; got 2");
  op(kMalformed, "ddof with a sum", kAlice, "reduce { input: \"m\" kind: REDUCE_KIND_SUM ddof: 1 }",
     StatusCode::INVALID_ARGUMENT, "ddof applies to var and std only, not sum");
  op(kOutOfRange, "a NaN ddof", kAlice, "reduce { input: \"m\" kind: REDUCE_KIND_VAR ddof: nan }",
     StatusCode::INVALID_ARGUMENT, "ddof must be finite, not nan");
  op(kMalformed, "reduce input and expression both", kAlice,
     "reduce { input: \"m\" kind: REDUCE_KIND_SUM expression: \"x\" "
     "inputs { key: \"x\" value { buffer: \"v\" } } }",
     StatusCode::INVALID_ARGUMENT,
     "reduce takes either an input or an expression with its inputs, not both");
  op(kMalformed, "reduce inputs without an expression", kAlice,
     "reduce { kind: REDUCE_KIND_SUM inputs { key: \"x\" value { buffer: \"v\" } } }",
     StatusCode::INVALID_ARGUMENT, "reduce inputs are given but the expression is empty");
  op(kMalformed, "an input view of a reduced expression", kAlice,
     "reduce { kind: REDUCE_KIND_SUM expression: \"x\" inputs { key: \"x\" value { buffer: "
     "\"v\" } } input_view { transpose {} } }",
     StatusCode::INVALID_ARGUMENT, "input_view applies to input");
  op(kWrongType, "reduced expression operands that do not broadcast", kAlice,
     "reduce { kind: REDUCE_KIND_SUM expression: \"x + y\" "
     "inputs { key: \"x\" value { buffer: \"m\" } } "
     "inputs { key: \"y\" value { buffer: \"im\" } } }",
     StatusCode::INVALID_ARGUMENT,
     "operands could not be broadcast together with shapes (3,4) (2,3)");
  op(kOutOfRange, "a reduce input view out of range", kAlice,
     "reduce { input: \"m\" kind: REDUCE_KIND_SUM input_view { index { items { index: 3 } } } }",
     StatusCode::INVALID_ARGUMENT, "reduce input 'm' (float64(3,4)): view step 0 (index) of shape (3,4): index 3 is out of "
     "bounds for axis 0 with size 3");
  op(kOversized, "a reduction of a broadcast view of 2^44 elements", kAlice,
     "reduce { input: \"m\" kind: REDUCE_KIND_SUM input_view { broadcast_to { extents: "
     "[1048576, 4194304, 3, 4] } } }",
     StatusCode::INVALID_ARGUMENT,
     "the reduction visits 52776558133248 elements (shape (1048576,4194304,3,4)); the server "
     "allows at most 1099511627776 (--max-elements)");
  op(kOversized, "reduced operands that broadcast past 64 bits", kAlice,
     "reduce { kind: REDUCE_KIND_SUM expression: \"x + y\" "
     "inputs { key: \"x\" value { buffer: \"m\" view { broadcast_to { extents: [4294967296, "
     "1, 3, 4] } } } } inputs { key: \"y\" value { buffer: \"m\" view { broadcast_to { "
     "extents: [1, 4294967296, 3, 4] } } } } }",
     StatusCode::INVALID_ARGUMENT,
     "the operands broadcast to shape (4294967296,4294967296,3,4), whose element count "
     "overflows 64 bits");
  op(kWrongType, "an elementwise shape the operands do not broadcast to", kAlice,
     "elementwise { expression: \"x + 1\" inputs { key: \"x\" value { buffer: \"m\" } } "
     "shape { extents: [4, 3] } }",
     StatusCode::INVALID_ARGUMENT,
     "the operands' broadcast shape (3,4) does not broadcast to the requested shape (4,3)");
  op(kOutOfRange, "index() of an axis the result does not have", kAlice,
     "elementwise { expression: \"index(2) + index(-3)\" shape { extents: [2, 3] } }",
     StatusCode::INVALID_ARGUMENT,
     "index(2) names no axis of the result, which has rank 2 (shape (2,3)): k must be from -2 "
     "to 1");
  op(kOutOfRange, "index() of a 0-d result", kAlice, "elementwise { expression: \"index(0)\" }",
     StatusCode::INVALID_ARGUMENT,
     "index(0) names no axis of the result, which has rank 0 (shape ()); give "
     "ElementwiseOp.shape for a result with axes");
  op(kOutOfRange, "an elementwise shape with a negative extent", kAlice,
     "elementwise { expression: \"index(0)\" shape { extents: [2, -1] } }",
     StatusCode::INVALID_ARGUMENT, "shape (2,-1) has a negative extent at axis 1");
  op(kOversized, "an elementwise shape past --max-elements", kAlice,
     "elementwise { expression: \"index(0)\" shape { extents: [4294967296, 4294967296] } }",
     StatusCode::INVALID_ARGUMENT,
     "elements; the server allows at most 1099511627776 (--max-elements)");
  op(kWrongType, "index() in a reduced expression", kAlice,
     "reduce { kind: REDUCE_KIND_SUM expression: \"x * index(0)\" "
     "inputs { key: \"x\" value { buffer: \"v\" } } }",
     StatusCode::INVALID_ARGUMENT,
     "index() is not supported in a reduction's expression: compute the expression into a "
     "buffer with ElementwiseOp (and its shape) and reduce that");
  op(kWrongType, "a gemv matrix read backwards along its leading dimension", kAlice,
     "gemv { a: \"m\" a_view { index { items { slice { step: -1 } } } } x: \"v\" }",
     StatusCode::INVALID_ARGUMENT,
     "gemv matrix 'a' 'm' (float64(3,4)) has matrices with strides (-1, 3) in elements; BLAS "
     "needs a unit stride on one of their two axes and a positive stride on the other, at "
     "least the first's extent: copy it first (an elementwise 'x' into a new buffer)");
  op(kWrongType, "a broadcast gemv vector", kAlice,
     "gemv { a: \"m\" x: \"v\" x_view { index { items { slice { stop: 1 } } } } "
     "x_view { broadcast_to { extents: 4 } } }",
     StatusCode::INVALID_ARGUMENT,
     "gemv vector x 'v' (float64(4,)) repeats one element (a broadcast view, stride 0), which "
     "BLAS cannot read: copy it first (an elementwise 'x' into a new buffer)");
  op(kWrongType, "index() of a scalar input's axis", kAlice,
     "elementwise { expression: \"index(k)\" inputs { key: \"k\" value { scalar { "
     "int_value: 0 } } } shape { extents: [2] } }",
     StatusCode::INVALID_ARGUMENT, "at position 6: the axis of index() must be an integer literal");
}

// ---------------------------------------------------------------------------
// ServerService: the admin RPCs (the others take no input but the caller's).

void BadInputMatrixTest::AddServerCases() {
  const std::string trim = "ServerService.TrimMemoryPool";
  Unary(trim, kOutOfRange, "device 5", kAdmin, "device: 5", StatusCode::INVALID_ARGUMENT,
        "device 5 does not exist");
  Unary(trim, kOutOfRange, "device -1", kAdmin, "device: -1", StatusCode::INVALID_ARGUMENT,
        "device -1 does not exist");
  for (const char* rpc : {"TrimMemoryPool", "StartProfiler", "StopProfiler"}) {
    for (const auto& [who, tenant] : {std::pair{kAlice, "alice"}, std::pair{kBob, "bob"}}) {
      Unary(absl::StrCat("ServerService.", rpc), kNonAdmin, absl::StrCat(tenant, ", no admin"), who,
            "", StatusCode::PERMISSION_DENIED,
            absl::StrCat(rpc, " needs an admin token; tenant '", tenant, "' is not an admin"));
    }
  }
}

// ---------------------------------------------------------------------------
// SharedMemoryService.

void BadInputMatrixTest::AddSharedMemoryCases() {
  const std::string reg = "SharedMemoryService.RegisterRegion";
  const std::string object = Quoted(alice_shm_->name());
  Unary(reg, kMalformed, "no memory", kAlice, "", StatusCode::INVALID_ARGUMENT,
        "the request names no memory: set 'system' or 'cuda_ipc'");
  Unary(reg, kMalformed, "a name without the leading '/'", kAlice,
        "system { name: \"gpucompute\" size_bytes: 16 }", StatusCode::INVALID_ARGUMENT,
        "shared-memory name must be '/' and 1 to 254 more characters");
  Unary(reg, kMalformed, "a name with a directory", kAlice,
        "system { name: \"/a/b\" size_bytes: 16 }", StatusCode::INVALID_ARGUMENT,
        "shared-memory name may contain no '/' after the first");
  Unary(reg, kOversized, "a 300-byte name", kAlice,
        absl::StrCat("system { name: ", Quoted("/" + std::string(299, 's')), " size_bytes: 16 }"),
        StatusCode::INVALID_ARGUMENT,
        "shared-memory name must be '/' and 1 to 254 more characters");
  Unary(reg, kOversized, "a region larger than the object", kAlice,
        absl::StrCat("system { name: ", object, " size_bytes: 1048576 }"),
        StatusCode::INVALID_ARGUMENT,
        absl::StrCat("bytes [0, +1048576) are outside shared-memory object '", alice_shm_->name(),
                     "' of 512 bytes"));
  Unary(reg, kOutOfRange, "an offset past the object's end", kAlice,
        absl::StrCat("system { name: ", object, " offset_bytes: 1000 size_bytes: 1 }"),
        StatusCode::INVALID_ARGUMENT, "bytes [1000, +1) are outside shared-memory object");
  Unary(reg, kOutOfRange, "an empty region", kAlice,
        absl::StrCat("system { name: ", object, " size_bytes: 0 }"), StatusCode::INVALID_ARGUMENT,
        "a shared-memory region needs size_bytes > 0");
  Unary(reg, kOutOfRange, "a CUDA IPC region on device 7", kAlice,
        "cuda_ipc { handle: \"xyz\" size_bytes: 16 device: 7 }", StatusCode::INVALID_ARGUMENT,
        "device 7 does not exist");
  Unary(reg, kOutOfRange, "an empty CUDA IPC region", kAlice,
        "cuda_ipc { handle: \"xyz\" size_bytes: 0 }", StatusCode::INVALID_ARGUMENT,
        "a CUDA IPC region needs size_bytes > 0");
  if (has_fifo_) {
    Unary(reg, kWrongType, "a FIFO, not a shared-memory object", kAlice,
          absl::StrCat("system { name: ", Quoted(not_shm_), " size_bytes: 16 }"),
          StatusCode::INVALID_ARGUMENT,
          absl::StrCat("'", not_shm_, "' is not a shared-memory object"));
  }

  const std::string unreg = "SharedMemoryService.UnregisterRegion";
  NamesNo(unreg, "no region", "", "region", "region_id");
  Unary(unreg, kOversized, "a 64 KiB id", kAlice,
        absl::StrCat("region_id: ", Quoted(std::string(64 << 10, 's'))), StatusCode::NOT_FOUND,
        "bytes left out");
  Unary(unreg, kWrongType, "a buffer id", kAlice, absl::StrCat("region_id: ", Quoted(a_)),
        StatusCode::NOT_FOUND, absl::StrCat("region ", a_, " not found"));
  OtherTenantUnary(unreg, "alice's region", region_, kNoRegion, "region_id: $0", "not found");

  const std::string from = "SharedMemoryService.CopyFromRegion";
  const std::string r = absl::StrCat("region_id: ", Quoted(region_), " ");
  const std::string into_a = absl::StrCat("buffer: ", Quoted(a_), " ");
  Unary(from, kMalformed, "no target", kAlice, r + "size_bytes: 16", StatusCode::INVALID_ARGUMENT,
        "the copy names no target: set 'create', 'buffer' or 'transfer_id'");
  Unary(from, kMalformed, "an unknown upload", kAlice,
        r + "transfer_id: \"upl-0123\" size_bytes: 16", StatusCode::NOT_FOUND,
        "no upload in progress has transfer id 'upl-0123'");
  Unary(from, kWrongType, "a buffer id as the upload", kAlice,
        absl::StrCat(r, "transfer_id: ", Quoted(a_), " size_bytes: 16"), StatusCode::NOT_FOUND,
        absl::StrCat("no upload in progress has transfer id '", a_, "'"));
  Unary(from, kMalformed, "a new buffer with a fill", kAlice,
        r + "create { dtype: DTYPE_INT32 shape: 4 fill { int_value: 0 } }",
        StatusCode::INVALID_ARGUMENT, "a copy provides the contents; 'fill' is not allowed");
  Unary(from, kMalformed, "a new buffer at offset 8", kAlice,
        r + "create { dtype: DTYPE_INT32 shape: 4 } offset_bytes: 8", StatusCode::INVALID_ARGUMENT,
        "a copy that creates a buffer must start at offset 0");
  NamesNo(from, "no region, into a buffer", into_a, "region", "region_id");
  NamesNo(from, "no region, into a new buffer", "create { dtype: DTYPE_INT32 shape: 4 }", "region",
          "region_id");
  NamesNo(from, "no region, on a stream", absl::StrCat(into_a, "stream_id: ", Quoted(stream_)),
          "region", "region_id");
  Unary(from, kOversized, "a new buffer larger than the region", kAlice,
        r + "create { dtype: DTYPE_FLOAT64 shape: 128 }", StatusCode::INVALID_ARGUMENT,
        absl::StrCat("bytes [0, +1024) are outside region ", region_, " of 256 bytes"));
  Unary(from, kOversized, "a new buffer over alice's quota", kAlice,
        r + "create { dtype: DTYPE_FLOAT64 shape: 262144 }", StatusCode::RESOURCE_EXHAUSTED,
        "tenant 'alice' is at its quota 'device_bytes'");
  Unary(from, kOversized, "size_bytes larger than the new buffer", kAlice,
        r + "size_bytes: 64 create { dtype: DTYPE_INT32 shape: 4 }", StatusCode::INVALID_ARGUMENT,
        "size_bytes is 64 but a int32 buffer of that shape holds 16 bytes");
  Unary(from, kOutOfRange, "a region offset past its end", kAlice,
        r + into_a + "region_offset_bytes: 250", StatusCode::INVALID_ARGUMENT,
        absl::StrCat("bytes [250, +16) are outside region ", region_));
  Unary(from, kOutOfRange, "a buffer offset past its end", kAlice, r + into_a + "offset_bytes: 20",
        StatusCode::INVALID_ARGUMENT, "bytes [20, +0) are outside buffer");
  Unary(from, kOutOfRange, "a range ending past the buffer's end", kAlice,
        r + into_a + "offset_bytes: 8 size_bytes: 16", StatusCode::INVALID_ARGUMENT,
        "bytes [8, +16) are outside buffer");
  Unary(from, kOutOfRange, "device 9", kAlice,
        r + "create { dtype: DTYPE_INT32 shape: 4 device: 9 }", StatusCode::INVALID_ARGUMENT,
        "device 9 does not exist");
  Unary(from, kWrongType, "a buffer id as the region", kAlice,
        absl::StrCat("region_id: ", Quoted(a_), " ", into_a), StatusCode::NOT_FOUND,
        absl::StrCat("region ", a_, " not found"));
  Unary(from, kWrongType, "dtype 42", kAlice, r + "create { dtype: 42 shape: 4 }",
        StatusCode::INVALID_ARGUMENT, "unknown dtype 42");
  Unary(from, kWrongType, "a buffer id as the stream", kAlice,
        absl::StrCat(r, into_a, "stream_id: ", Quoted(a_)), StatusCode::NOT_FOUND,
        absl::StrCat("stream ", a_, " not found"));
  const std::string bobs = absl::StrCat("region_id: ", Quoted(bob_region_), " ");
  OtherTenantUnary(from, "alice's region", region_, kNoRegion,
                   "region_id: $0 create { dtype: DTYPE_INT32 shape: 4 }", "not found");
  OtherTenantUnary(from, "alice's buffer", a_, kNoBuffer, bobs + "buffer: $0 size_bytes: 16",
                   "not found");
  OtherTenantUnary(from, "alice's stream", stream_, kNoStream, bobs + "buffer: \"b\" stream_id: $0",
                   "not found");

  const std::string to = "SharedMemoryService.CopyToRegion";
  NamesNo(to, "no region", into_a, "region", "region_id");
  NamesNo(to, "no region, on a stream", absl::StrCat(into_a, "stream_id: ", Quoted(stream_)),
          "region", "region_id");
  Unary(to, kMalformed, "no buffer", kAlice, r, StatusCode::INVALID_ARGUMENT, "no buffer given");
  Unary(to, kWrongType, "a read-only region", kAlice,
        absl::StrCat("region_id: ", Quoted(read_only_region_), " ", into_a),
        StatusCode::INVALID_ARGUMENT, "was registered read-only; it can only be copied from");
  Unary(to, kWrongType, "a stream id as the region", kAlice,
        absl::StrCat("region_id: ", Quoted(stream_), " ", into_a), StatusCode::NOT_FOUND,
        absl::StrCat("region ", stream_, " not found"));
  Unary(to, kOversized, "1 TiB of a 16-byte buffer", kAlice,
        r + into_a + "size_bytes: 1099511627776", StatusCode::INVALID_ARGUMENT,
        "bytes [0, +1099511627776) are outside buffer");
  Unary(to, kOversized, "a buffer larger than the room in the region", kAlice,
        r + "buffer: \"m\" region_offset_bytes: 200", StatusCode::INVALID_ARGUMENT,
        absl::StrCat("bytes [200, +96) are outside region ", region_));
  Unary(to, kOutOfRange, "a buffer offset past its end", kAlice, r + into_a + "offset_bytes: 20",
        StatusCode::INVALID_ARGUMENT, "bytes [20, +0) are outside buffer");
  Unary(to, kOutOfRange, "a region offset past its end", kAlice,
        r + into_a + "region_offset_bytes: 257", StatusCode::INVALID_ARGUMENT,
        absl::StrCat("bytes [257, +16) are outside region ", region_));
  OtherTenantUnary(to, "alice's region", region_, kNoRegion, "region_id: $0 buffer: \"b\"",
                   "not found");
  OtherTenantUnary(to, "alice's buffer", a_, kNoBuffer, bobs + "buffer: $0", "not found");
  OtherTenantUnary(to, "alice's stream", stream_, kNoStream, bobs + "buffer: \"b\" stream_id: $0",
                   "not found");

  const std::string exp = "SharedMemoryService.ExportBuffer";
  Unary(exp, kMalformed, "no target", kAlice, "", StatusCode::INVALID_ARGUMENT,
        "the request names no buffer: set 'buffer' or 'create'");
  Unary(exp, kMalformed, "an empty buffer reference", kAlice, "buffer: \"\"",
        StatusCode::INVALID_ARGUMENT, "no buffer given");
  Unary(exp, kWrongType, "a buffer not created exportable", kAlice,
        absl::StrCat("buffer: ", Quoted(a_)), StatusCode::FAILED_PRECONDITION,
        "was not created exportable");
  Unary(exp, kWrongType, "dtype 42", kAlice, "create { dtype: 42 shape: 4 }",
        StatusCode::INVALID_ARGUMENT, "unknown dtype 42");
  Unary(exp, kOversized, "a new buffer over alice's quota", kAlice,
        "create { dtype: DTYPE_FLOAT64 shape: 262144 }", StatusCode::RESOURCE_EXHAUSTED,
        "tenant 'alice' is at its quota 'device_bytes'");
  Unary(exp, kOutOfRange, "device 9", kAlice, "create { dtype: DTYPE_INT32 shape: 4 device: 9 }",
        StatusCode::INVALID_ARGUMENT, "device 9 does not exist");
  OtherTenantUnary(exp, "alice's buffer", a_, kNoBuffer, "buffer: $0", "not found");
}

// ---------------------------------------------------------------------------
// SessionService: Session and RunChain.

void BadInputMatrixTest::AddSessionCases() {
  const std::string add =
      "op { elementwise { expression: \"x + 1\" inputs { key: \"x\" value { buffer: \"v\" } } } }";
  SessionCase(kMalformed, "an empty tag", kAlice, {add}, StatusCode::INVALID_ARGUMENT,
              "every operation needs a tag");
  SessionCase(kMalformed, "a tag used twice", kAlice, {"tag: \"t\" op {}", "tag: \"t\" " + add},
              StatusCode::INVALID_ARGUMENT, "tag 't' is already used in this session");
  SessionCase(kMalformed, "a reference to an unknown tag", kAlice,
              {"tag: \"t\" op { reduce { input: \"tag:nope\" kind: REDUCE_KIND_SUM } }"},
              StatusCode::INVALID_ARGUMENT,
              "tag 'nope' names no earlier operation of this session or chain");
  SessionCase(kMalformed, "no operation", kAlice, {"tag: \"t\""}, StatusCode::INVALID_ARGUMENT,
              "the request names no operation");
  SessionCase(kMalformed, "a reference to a rejected tag", kAlice,
              {"tag: \"bad\" op {}",
               "tag: \"t\" op { reduce { input: \"tag:bad\" kind: REDUCE_KIND_SUM } }"},
              StatusCode::FAILED_PRECONDITION, "depends on tag 'bad', which failed");
  SessionCase(kOversized, "a 300-byte tag", kAlice,
              {absl::StrCat("tag: ", Quoted(std::string(300, 't')), " ", add)},
              StatusCode::INVALID_ARGUMENT, "tag is 300 bytes; at most 256 are allowed");
  SessionCase(
      kOversized, "a 70000-byte expression", kAlice,
      {absl::StrCat("tag: \"t\" op { ", ElementwiseText(std::string(69999, ' ') + "x", "v"), " }")},
      StatusCode::INVALID_ARGUMENT,
      "expression is 70000 bytes; the server allows at most 65536 (--max-expression-bytes)");
  SessionCase(kOversized, "a new buffer over alice's quota", kAlice,
              {"tag: \"t\" op { random { output { dtype: DTYPE_FLOAT64 } "
               "distribution: DISTRIBUTION_UNIFORM shape: 262144 } }"},
              StatusCode::RESOURCE_EXHAUSTED, "tenant 'alice' is at its quota 'device_bytes'");
  SessionCase(kWrongType, "gemv of an int32 matrix", kAlice,
              {"tag: \"t\" op { gemv { a: \"im\" x: \"v\" } }"}, StatusCode::INVALID_ARGUMENT,
              "must be float32 or float64");
  SessionCase(kWrongType, "reduce kind 99", kAlice,
              {"tag: \"t\" op { reduce { input: \"v\" kind: 99 } }"}, StatusCode::INVALID_ARGUMENT,
              "unknown reduce kind 99");
  SessionCase(kOutOfRange, "axis 2 of a 2-D input", kAlice,
              {"tag: \"t\" op { reduce { input: \"m\" kind: REDUCE_KIND_MAX axis: 2 } }"},
              StatusCode::INVALID_ARGUMENT, "axis 2 is out of bounds for array of dimension 2");
  SessionCase(kOutOfRange, "random integers with low > high", kAlice,
              {"tag: \"t\" op { random { output { dtype: DTYPE_INT32 } "
               "distribution: DISTRIBUTION_INTEGERS shape: 4 low: 9 high: 1 } }"},
              StatusCode::INVALID_ARGUMENT, "random integers need low < high");
  const auto bob_session = [this](const std::string& what, const std::string& id,
                                  const std::string& unknown, const std::string& text) {
    OtherTenant(
        "SessionService.Session", what, id, unknown,
        [this, text](const std::string& x) {
          return SendSession(kBob, {absl::Substitute(text, Quoted(x))});
        },
        "not found");
  };
  bob_session("alice's buffer", a_, kNoBuffer,
              "tag: \"t\" op { reduce { input: $0 kind: REDUCE_KIND_SUM } }");
  bob_session("alice's buffer as the output", a_, kNoBuffer,
              "tag: \"t\" op { elementwise { expression: \"x\" "
              "inputs { key: \"x\" value { buffer: \"b\" } } output { buffer: $0 } } }");
  bob_session("alice's stream", stream_, kNoStream,
              "tag: \"t\" op { stream_id: $0 reduce { input: \"b\" kind: REDUCE_KIND_SUM } }");

  const std::string chain = "SessionService.RunChain";
  Stream(chain, kMalformed, "bytes that are no ChainRequest", kAlice, {"\xff\xff"},
         StatusCode::INVALID_ARGUMENT, "a malformed gpucompute.v1.ChainRequest message");
  Stream(chain, kMalformed, "more bytes than a kept chain's, that are no ChainRequest", kAlice,
         {std::string((1 << 20) + 2, '\xff')}, StatusCode::INVALID_ARGUMENT,
         "a malformed gpucompute.v1.ChainRequest message");
  Unary(chain, kMalformed, "no steps", kAlice, "", StatusCode::INVALID_ARGUMENT,
        "a chain needs at least one step");
  Unary(chain, kMalformed, "an empty tag", kAlice, absl::StrCat("steps { ", add, " }"),
        StatusCode::INVALID_ARGUMENT, "step 0 (''): every operation needs a tag");
  Unary(chain, kMalformed, "a tag used twice", kAlice,
        absl::StrCat("steps { tag: \"t\" ", add, " } steps { tag: \"t\" ", add, " }"),
        StatusCode::INVALID_ARGUMENT, "step 1 ('t'): its tag is already used by an earlier step");
  Unary(chain, kMalformed, "keep naming no step", kAlice,
        absl::StrCat("steps { tag: \"t\" ", add, " } keep: \"u\""), StatusCode::INVALID_ARGUMENT,
        "keep names tag 'u', which no step has");
  Unary(
      chain, kMalformed, "a reference to a later step", kAlice,
      absl::StrCat("steps { tag: \"t\" op { reduce { input: \"tag:u\" kind: REDUCE_KIND_SUM } } } "
                   "steps { tag: \"u\" ",
                   add, " }"),
      StatusCode::INVALID_ARGUMENT,
      "step 0 ('t'): tag 'u' names no earlier operation of this session or chain");
  Unary(chain, kMalformed, "a step with no operation", kAlice,
        absl::StrCat("steps { tag: \"t\" ", add, " } steps { tag: \"u\" }"),
        StatusCode::INVALID_ARGUMENT, "step 1 ('u'): the request names no operation");
  {
    std::string steps;
    for (int i = 0; i <= 4096; ++i)
      absl::StrAppend(&steps, "steps { tag: \"s", i, "\" ", add, " } ");
    Unary(chain, kOversized, "4097 steps", kAlice, steps, StatusCode::INVALID_ARGUMENT,
          "the chain has 4097 steps; at most 4096 are allowed");
  }
  Unary(chain, kOversized, "a 300-byte tag", kAlice,
        absl::StrCat("steps { tag: ", Quoted(std::string(300, 't')), " ", add, " }"),
        StatusCode::INVALID_ARGUMENT, "tag is 300 bytes; at most 256 are allowed");
  Unary(chain, kOversized, "a new buffer over alice's quota in the last step", kAlice,
        absl::StrCat("steps { tag: \"t\" ", add,
                     " } steps { tag: \"u\" op { random { "
                     "output { dtype: DTYPE_FLOAT64 } distribution: DISTRIBUTION_UNIFORM "
                     "shape: 262144 } } }"),
        StatusCode::RESOURCE_EXHAUSTED,
        "step 1 ('u'): tenant 'alice' is at its quota 'device_bytes'");
  Unary(chain, kWrongType, "random integers into float32", kAlice,
        "steps { tag: \"t\" op { random { output { dtype: DTYPE_FLOAT32 } "
        "distribution: DISTRIBUTION_INTEGERS shape: 4 low: 0 high: 2 } } }",
        StatusCode::INVALID_ARGUMENT,
        "step 0 ('t'): random integers need an int32 or int64 output");
  Unary(chain, kWrongType, "a float result into an int32 buffer", kAlice,
        absl::StrCat("steps { tag: \"t\" op { ", ElementwiseText("x / 3", "a", "a"), " } }"),
        StatusCode::INVALID_ARGUMENT, "cannot be written as int32");
  Unary(chain, kOutOfRange, "axis 2 of a 2-D input", kAlice,
        "steps { tag: \"t\" op { reduce { input: \"m\" kind: REDUCE_KIND_SUM axis: 2 } } }",
        StatusCode::INVALID_ARGUMENT,
        "step 0 ('t'): axis 2 is out of bounds for array of dimension 2");
  Unary(chain, kOutOfRange, "a NaN stddev", kAlice,
        "steps { tag: \"t\" op { random { output { dtype: DTYPE_FLOAT64 } "
        "distribution: DISTRIBUTION_NORMAL shape: 4 stddev: nan } } }",
        StatusCode::INVALID_ARGUMENT,
        "normal needs a finite mean and a finite, non-negative stddev");
  OtherTenantUnary(chain, "alice's buffer", a_, kNoBuffer,
                   "steps { tag: \"t\" op { reduce { input: $0 kind: REDUCE_KIND_SUM } } }",
                   "not found");
  OtherTenantUnary(chain, "alice's stream for the chain", stream_, kNoStream,
                   "stream_id: $0 steps { tag: \"t\" op { reduce { input: \"b\" "
                   "kind: REDUCE_KIND_SUM } } }",
                   "not found");
  OtherTenantUnary(chain, "alice's stream for a step", stream_, kNoStream,
                   "steps { tag: \"t\" op { stream_id: $0 reduce { input: \"b\" "
                   "kind: REDUCE_KIND_SUM } } }",
                   "not found");
}

// ---------------------------------------------------------------------------
// Every RPC without credentials, with a wrong token, and with an authorization header
// that is not a bearer token: each with a request that would be valid from alice.

void BadInputMatrixTest::AddAuthenticationCases() {
  const std::string a = Quoted(a_);
  const std::string add_into_a =
      absl::StrCat("elementwise { expression: \"x + 0\" inputs { key: \"x\" value { buffer: ", a,
                   " } } output { buffer: ", a, " } }");
  const std::map<std::string, std::vector<std::string>> valid = {
      {"BufferService.CreateBuffer",
       {Request("BufferService.CreateBuffer", "dtype: DTYPE_INT32 shape: 4")}},
      {"BufferService.Upload",
       {HeaderMessage("create { dtype: DTYPE_INT32 shape: 4 }"), ChunkMessage(16)}},
      {"BufferService.BeginUpload",
       {Request("BufferService.BeginUpload", "header { create { dtype: DTYPE_INT32 shape: 4 } }")}},
      {"BufferService.Download", {Request("BufferService.Download", "buffer: " + a)}},
      {"BufferService.GetBuffer", {Request("BufferService.GetBuffer", "buffer: " + a)}},
      {"BufferService.ListBuffers", {""}},
      {"BufferService.DeleteBuffer", {Request("BufferService.DeleteBuffer", "buffer: " + a)}},
      {"BufferService.RenewLease", {Request("BufferService.RenewLease", "buffer: " + a)}},
      {"StreamService.CreateStream", {""}},
      {"StreamService.DeleteStream",
       {Request("StreamService.DeleteStream", "stream_id: " + Quoted(stream_))}},
      {"StreamService.SynchronizeStream",
       {Request("StreamService.SynchronizeStream", "stream_id: " + Quoted(stream_))}},
      {"StreamService.ListStreams", {""}},
      {"OperationService.Submit", {Request("OperationService.Submit", add_into_a)}},
      {"OperationService.GetOperation",
       {Request("OperationService.GetOperation", "operation_id: " + Quoted(operation_))}},
      {"OperationService.WaitOperation",
       {Request("OperationService.WaitOperation", "operation_id: " + Quoted(operation_))}},
      {"ServerService.GetServerInfo", {""}},
      {"ServerService.GetStats", {""}},
      {"ServerService.TrimMemoryPool", {""}},
      {"ServerService.StartProfiler", {""}},
      {"ServerService.StopProfiler", {""}},
      {"SharedMemoryService.RegisterRegion",
       {Request("SharedMemoryService.RegisterRegion",
                absl::StrCat("system { name: ", Quoted(alice_shm_->name()), " size_bytes: 64 }"))}},
      {"SharedMemoryService.UnregisterRegion",
       {Request("SharedMemoryService.UnregisterRegion", "region_id: " + Quoted(region_))}},
      {"SharedMemoryService.ListRegions", {""}},
      {"SharedMemoryService.CopyFromRegion",
       {Request("SharedMemoryService.CopyFromRegion",
                absl::StrCat("region_id: ", Quoted(region_), " buffer: ", a))}},
      {"SharedMemoryService.CopyToRegion",
       {Request("SharedMemoryService.CopyToRegion",
                absl::StrCat("region_id: ", Quoted(region_), " buffer: ", a))}},
      {"SharedMemoryService.ExportBuffer",
       {Request("SharedMemoryService.ExportBuffer", "buffer: " + a)}},
      {"SessionService.Session",
       {Request("SessionService.Session",
                absl::StrCat("ops { tag: \"t\" op { ", add_into_a, " } }"))}},
      {"SessionService.RunChain",
       {Request("SessionService.RunChain",
                absl::StrCat("steps { tag: \"t\" op { ", add_into_a, " } }"))}},
  };
  // Requests that are bad besides: the missing credentials are what the caller hears of.
  // (The RPCs whose requests have no fields have none.)
  const std::map<std::string, std::vector<std::string>> bad = {
      {"BufferService.CreateBuffer", {Request("BufferService.CreateBuffer", "dtype: 99")}},
      {"BufferService.Upload", {ChunkMessage(16)}},
      {"BufferService.BeginUpload",
       {Request("BufferService.BeginUpload", "idle_timeout_seconds: -1")}},
      {"BufferService.Download", {"\xff\xff"}},
      {"BufferService.GetBuffer", {""}},
      {"BufferService.DeleteBuffer", {""}},
      {"BufferService.RenewLease", {Request("BufferService.RenewLease", "ttl_seconds: -1")}},
      {"StreamService.CreateStream", {Request("StreamService.CreateStream", "device: 9")}},
      {"StreamService.DeleteStream", {""}},
      {"StreamService.SynchronizeStream",
       {Request("StreamService.SynchronizeStream", "timeout_seconds: -1")}},
      {"OperationService.Submit", {Request("OperationService.Submit", "wait_timeout_seconds: -1")}},
      {"OperationService.GetOperation", {""}},
      {"OperationService.WaitOperation",
       {Request("OperationService.WaitOperation", "timeout_seconds: -1")}},
      {"ServerService.TrimMemoryPool", {Request("ServerService.TrimMemoryPool", "device: 5")}},
      {"SharedMemoryService.RegisterRegion", {""}},
      {"SharedMemoryService.UnregisterRegion", {""}},
      {"SharedMemoryService.CopyFromRegion", {""}},
      {"SharedMemoryService.CopyToRegion", {""}},
      {"SharedMemoryService.ExportBuffer", {""}},
      {"SessionService.Session", {Request("SessionService.Session", "ops { op {} }")}},
      {"SessionService.RunChain", {""}},
  };
  for (const auto& [rpc, messages] : bad) {
    Stream(rpc, kUnauthenticated, "no credentials and a bad request", "", messages,
           StatusCode::UNAUTHENTICATED,
           "this server requires authentication and the call carries none");
  }
  for (const std::string& rpc : AllRpcs()) {
    auto it = valid.find(rpc);
    if (it == valid.end()) {
      ADD_FAILURE() << "no valid request for " << rpc;
      continue;
    }
    const std::vector<std::string>& messages = it->second;
    Stream(rpc, kUnauthenticated, "no credentials", "", messages, StatusCode::UNAUTHENTICATED,
           "this server requires authentication and the call carries none");
    Stream(rpc, kUnauthenticated, "a wrong token", absl::StrCat("Bearer ", kWrongToken), messages,
           StatusCode::UNAUTHENTICATED, "the bearer token is not valid");
    Stream(rpc, kUnauthenticated, "alice's token, not as a bearer token",
           absl::StrCat("Basic ", kAliceToken), messages, StatusCode::UNAUTHENTICATED,
           "is not of the form 'Bearer TOKEN'");
  }
}

// Bytes that parse as no message: every unary RPC and a Session answer INVALID_ARGUMENT
// naming the type, as the RPCs served raw always did (not gRPC's UNIMPLEMENTED with no
// message, nor a session ended OK as if the client had closed it).
void BadInputMatrixTest::AddUnparsableCases() {
  const std::string garbage = "\xff\xff";
  for (const std::string& rpc : AllRpcs()) {
    const google::protobuf::MethodDescriptor* method = FindRpc(rpc);
    if (method->client_streaming() || method->server_streaming()) continue;
    Stream(rpc, kMalformed, "bytes that parse as no request", kAlice, {garbage},
           StatusCode::INVALID_ARGUMENT,
           absl::StrCat("a malformed ", method->input_type()->full_name(), " message"));
    cases_.back().exact = true;
  }
  const std::string session = "SessionService.Session";
  Stream(session, kMalformed, "bytes that parse as no SessionRequest", kAlice, {garbage},
         StatusCode::INVALID_ARGUMENT, "a malformed gpucompute.v1.SessionRequest message");
  cases_.back().exact = true;
  const std::string sum = "ops { tag: \"t\" op { reduce { input: \"a\" kind: REDUCE_KIND_SUM } } }";
  Stream(session, kMalformed, "a good request, then bytes that parse as no SessionRequest", kAlice,
         {Request(session, sum), garbage}, StatusCode::INVALID_ARGUMENT,
         "a malformed gpucompute.v1.SessionRequest message");
  cases_.back().exact = true;
}

// A tenant header that names another tenant than the credentials: PERMISSION_DENIED on
// every RPC before anything else, the request not even read (an empty message is a
// valid request of every type, and an Upload's first message must be a header).
void BadInputMatrixTest::AddTenantHeaderCases() {
  for (const std::string& rpc : AllRpcs()) {
    for (const char* claimed : {"bob", "ops", "nobody"}) {
      Add(
          rpc, kOtherTenant, absl::StrCat("alice's token naming tenant ", claimed),
          [this, rpc, claimed] { return RawCall(channel_, rpc, kAlice, {""}, claimed).status; },
          StatusCode::PERMISSION_DENIED,
          "metadata 'gpucompute-tenant' names another tenant than this call's credentials "
          "(alice); send 'gpucompute-tenant: alice' or none");
      cases_.back().exact = true;
    }
  }
}

// ---------------------------------------------------------------------------

TEST_F(BadInputMatrixTest, EveryRpcRejectsBadInputExactlyAndChangesNothing) {
  AddBufferCases();
  AddUploadCases();
  AddStreamCases();
  AddOperationCases();
  AddServerCases();
  AddSharedMemoryCases();
  AddSessionCases();
  AddAuthenticationCases();
  AddUnparsableCases();
  AddTenantHeaderCases();

  const WorldSnapshot initial = TakeWorldSnapshot();
  WorldSnapshot before = initial;
  std::map<std::string, std::array<int, kNumCategories>> passed;
  int failed = 0;
  for (const Case& c : cases_) {
    SCOPED_TRACE(absl::StrCat(c.rpc, " [", kCategoryNames[c.category], "] ", c.what));
    bool ok = FindRpc(c.rpc) != nullptr;
    EXPECT_TRUE(ok) << "the API has no RPC " << c.rpc;
    const grpc::Status got = c.send();
    const std::string& message = got.error_message();
    if (got.error_code() != c.code ||
        !(c.exact ? message == c.says : absl::StrContains(message, c.says))) {
      ok = false;
      ADD_FAILURE() << "got " << got.error_code() << " '" << message.substr(0, 400) << "', want "
                    << c.code << (c.exact ? " saying '" : " with '") << c.says << "'";
    }
    for (const char* token : {kAliceToken, kBobToken, kAdminToken, kWrongToken}) {
      if (absl::StrContains(message, token)) {
        ok = false;
        ADD_FAILURE() << "the message gives away a token: " << message;
      }
    }
    if (c.send_unknown) {
      const grpc::Status unknown = c.send_unknown();
      const std::string want = absl::StrReplaceAll(unknown.error_message(), {{c.unknown_id, c.id}});
      if (unknown.error_code() != StatusCode::NOT_FOUND || message != want) {
        ok = false;
        ADD_FAILURE() << "another tenant's id answers differently from an unknown one: '" << message
                      << "' vs " << unknown.error_code() << " '" << unknown.error_message() << "'";
      }
    }
    const WorldSnapshot after = TakeWorldSnapshot();
    if (!(after == before)) {
      ok = false;
      ADD_FAILURE() << "the request changed something:\n" << Diff(before, after);
      before = after;
    }
    if (ok) {
      ++passed[c.rpc][c.category];
    } else {
      ++failed;
    }
  }
  EXPECT_EQ(failed, 0);
  EXPECT_TRUE(TakeWorldSnapshot() == initial) << Diff(initial, TakeWorldSnapshot());

  // Every RPC is in the matrix, and unauthenticated callers get nowhere on any.
  for (const std::string& rpc : AllRpcs()) {
    EXPECT_GE(passed[rpc][kUnauthenticated], 3) << rpc;
  }
  EXPECT_EQ(AllRpcs().size(), 28u);
  std::cout << "\nBad-input cases passed, by RPC and category (" << cases_.size() - failed << " of "
            << cases_.size() << "):\n"
            << CountTable(passed) << std::flush;

  // What alice had still works: her upload in progress completes, her operation is still
  // hers, her stream still synchronizes.
  const std::vector<int32_t> pending = {-1, 0, 1, 2};
  ASSERT_OK(alice_->UploadRange(transfer_, 0, std::as_bytes(std::span<const int32_t>(pending))));
  absl::StatusOr<std::vector<int32_t>> uploaded = DownloadArray<int32_t>(*alice_, "pending");
  ASSERT_OK(uploaded);
  EXPECT_EQ(*uploaded, pending);
  absl::StatusOr<v1::Operation> op = alice_->GetOperation(operation_);
  ASSERT_OK(op);
  EXPECT_EQ(op->state(), v1::Operation::STATE_SUCCEEDED);
  EXPECT_OK(alice_->SynchronizeStream(stream_));
}

// The other side of the rule for empty ids: where the API lets a request name no stream
// (SynchronizeStream, Submit, the region copies, a chain), that still means the caller's
// default stream; no stream is made and nothing is refused.
TEST_F(BadInputMatrixTest, AnEmptyStreamIdStillMeansTheDefaultStreamWhereItMayBeEmpty) {
  ASSIGN_OR_FAIL(v1::ListStreamsResponse streams_before, alice_->ListStreams());
  ASSIGN_OR_FAIL(bool idle, alice_->SynchronizeStream(""));
  EXPECT_TRUE(idle);
  ASSIGN_OR_FAIL(
      v1::Operation op,
      alice_->Submit(Text<v1::SubmitRequest>("wait: true " + ElementwiseText("x + 0", "a", "a"))));
  EXPECT_EQ(op.state(), v1::Operation::STATE_SUCCEEDED) << op.error_message();
  EXPECT_EQ(op.stream_id(), default_stream_);

  const auto stream_of_copy = [&](const std::string& rpc, const std::string& text) {
    RawResult r = RawCall(channel_, rpc, kAlice, {Request(rpc, text)});
    EXPECT_OK(r.status) << rpc;
    v1::CopyRegionResponse response;
    if (r.responses.size() != 1 || !response.ParseFromString(r.responses[0])) return std::string();
    return response.timing().stream_id();
  };
  const std::string region_and_a =
      absl::StrCat("region_id: ", Quoted(region_), " buffer: ", Quoted(a_));
  EXPECT_EQ(stream_of_copy("SharedMemoryService.CopyToRegion", region_and_a), default_stream_);
  EXPECT_EQ(stream_of_copy("SharedMemoryService.CopyFromRegion", region_and_a), default_stream_);

  const std::string chain = "SessionService.RunChain";
  RawResult r = RawCall(channel_, chain, kAlice,
                        {Request(chain, absl::StrCat("steps { tag: \"t\" op { ",
                                                     ElementwiseText("x + 0", "a", "a"), " } }"))});
  ASSERT_OK(r.status);
  v1::ChainResponse ran;
  ASSERT_EQ(r.responses.size(), 1u);
  ASSERT_TRUE(ran.ParseFromString(r.responses[0]));
  ASSERT_EQ(ran.steps_size(), 1);
  EXPECT_EQ(ran.stream_id().empty() ? ran.steps(0).operation().stream_id() : ran.stream_id(),
            default_stream_);

  ASSIGN_OR_FAIL(v1::ListStreamsResponse streams_after, alice_->ListStreams());
  EXPECT_EQ(streams_after.DebugString(), streams_before.DebugString());
}

}  // namespace
}  // namespace gpucompute::testing
