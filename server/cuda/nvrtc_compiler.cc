#include "server/cuda/nvrtc_compiler.h"

#include <fcntl.h>
#include <nvrtc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/cuda/cuda_check.h"
#include "server/util/log.h"
#include "server/util/status_macros.h"

namespace gpucompute::cuda {
namespace {

// ---- SHA-256 (FIPS 180-4) ----

constexpr std::array<uint32_t, 64> kSha256K = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

class Sha256State {
 public:
  void Update(std::string_view data) {
    for (char c : data) {
      block_[fill_++] = static_cast<uint8_t>(c);
      if (fill_ == 64) {
        Transform();
        fill_ = 0;
      }
    }
    bits_ += static_cast<uint64_t>(data.size()) * 8;
  }

  std::array<uint8_t, 32> Finish() {
    const uint64_t bits = bits_;
    block_[fill_++] = 0x80;
    if (fill_ > 56) {
      while (fill_ < 64) block_[fill_++] = 0;
      Transform();
      fill_ = 0;
    }
    while (fill_ < 56) block_[fill_++] = 0;
    for (int i = 7; i >= 0; --i) block_[fill_++] = static_cast<uint8_t>(bits >> (8 * i));
    Transform();
    std::array<uint8_t, 32> digest;
    for (int i = 0; i < 8; ++i) {
      for (int b = 0; b < 4; ++b) digest[4 * i + b] = static_cast<uint8_t>(h_[i] >> (24 - 8 * b));
    }
    return digest;
  }

 private:
  static uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void Transform() {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = (uint32_t{block_[4 * i]} << 24) | (uint32_t{block_[4 * i + 1]} << 16) |
             (uint32_t{block_[4 * i + 2]} << 8) | uint32_t{block_[4 * i + 3]};
    }
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t s1 = Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25);
      const uint32_t ch = (e & f) ^ (~e & g);
      const uint32_t t1 = h + s1 + ch + kSha256K[i] + w[i];
      const uint32_t s0 = Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22);
      const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
      const uint32_t t2 = s0 + maj;
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  std::array<uint32_t, 8> h_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<uint8_t, 64> block_{};
  int fill_ = 0;
  uint64_t bits_ = 0;
};

std::string Hex(const uint8_t* data, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * size);
  for (size_t i = 0; i < size; ++i) {
    out += kDigits[data[i] >> 4];
    out += kDigits[data[i] & 15];
  }
  return out;
}

// ---- the cache file ----
//
//   offset  0: kMagic (8 bytes)
//           8: the key's SHA-256 (32 bytes)
//          40: the CUBIN's length, uint64 little-endian
//          48: the CUBIN's SHA-256 (32 bytes)
//          80: the CUBIN
// A reader trusts a file only if all of it checks out: a crash mid-write, a truncated or
// damaged file, or a file of another key (renamed, or a hash prefix clash) is recompiled.
constexpr char kMagic[8] = {'G', 'P', 'U', 'C', 'K', 'C', '0', '1'};
constexpr size_t kHeaderSize = 80;
// No CUBIN of an elementwise kernel comes near this; a larger file is not read at all.
constexpr uint64_t kMaxCubinBytes = uint64_t{256} << 20;

void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out += static_cast<char>(v >> (8 * i));
}

uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

// Appends a field so that no two different field lists hash alike.
void AddField(Sha256State& sha, std::string_view field) {
  std::string length;
  PutU64(length, field.size());
  sha.Update(length);
  sha.Update(field);
}

// Deletes an nvrtcProgram however Compile returns.
struct ProgramDeleter {
  void operator()(nvrtcProgram* p) const {
    if (*p != nullptr) nvrtcDestroyProgram(p);
    delete p;
  }
};

absl::Status CheckArchSupported(int arch) {
  int count = 0;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(nvrtcGetNumSupportedArchs(&count));
  std::vector<int> archs(count);
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(nvrtcGetSupportedArchs(archs.data()));
  if (std::find(archs.begin(), archs.end(), arch) == archs.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("this NVRTC cannot compile for compute capability ", arch / 10, ".", arch % 10,
                     " (sm_", arch, "); it supports sm_", absl::StrJoin(archs, ", sm_"),
                     ". Install a CUDA toolkit that supports this GPU."));
  }
  return absl::OkStatus();
}

}  // namespace

std::array<uint8_t, 32> Sha256(std::string_view data) {
  Sha256State sha;
  sha.Update(data);
  return sha.Finish();
}

std::string Sha256Hex(std::string_view data) {
  const std::array<uint8_t, 32> digest = Sha256(data);
  return Hex(digest.data(), digest.size());
}

NvrtcCompiler::NvrtcCompiler(std::string cache_dir) : cache_dir_(std::move(cache_dir)) {}

std::vector<std::string> NvrtcCompiler::Options(int arch) {
  // No fast-math flags: NVRTC's defaults keep IEEE division and square root and
  // denormals. The default --fmad=true stays: the CUDA math library (sin, exp, tanh, the
  // division and square root routines), inlined into every kernel, is written to be
  // contracted into fused multiply-adds, and --fmad=false would make it several percent
  // slower than the same code under nvcc. Contraction must not touch the expression's own
  // arithmetic, whose a*b + c the CPU backend and NumPy round twice; the generated source
  // spells that arithmetic with the explicitly rounded intrinsics (__fmul_rn, __dadd_rn,
  // ...), which are never contracted (elementwise_codegen.h).
  return {absl::StrCat("--gpu-architecture=sm_", arch), "-std=c++17"};
}

absl::StatusOr<std::array<uint8_t, 32>> NvrtcCompiler::Key(std::string_view source, int arch) {
  int major = 0;
  int minor = 0;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(nvrtcVersion(&major, &minor));
  Sha256State sha;
  // v2: --fmad=false dropped, the expression's arithmetic now in rounded intrinsics.
  AddField(sha, "gpucompute NVRTC cubin cache v2");
  AddField(sha, absl::StrCat("nvrtc ", major, ".", minor));
  AddField(sha, absl::StrCat("arch ", arch));
  for (const std::string& option : Options(arch)) AddField(sha, option);
  AddField(sha, source);
  return sha.Finish();
}

std::string NvrtcCompiler::PathFor(const std::array<uint8_t, 32>& key) const {
  return (std::filesystem::path(cache_dir_) / (Hex(key.data(), key.size()) + ".cubin")).string();
}

std::string NvrtcCompiler::CachePath(std::string_view source, int arch) const {
  if (cache_dir_.empty()) return "";
  absl::StatusOr<std::array<uint8_t, 32>> key = Key(source, arch);
  return key.ok() ? PathFor(*key) : "";
}

bool NvrtcCompiler::ReadCache(const std::string& path, const std::array<uint8_t, 32>& key,
                              std::string* cubin) const {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // absent (the usual miss) or unreadable: compile
  std::string data;
  struct stat st;
  bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= 0 &&
            static_cast<uint64_t>(st.st_size) <= kHeaderSize + kMaxCubinBytes;
  if (ok) {
    data.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t got = read(fd, data.data() + done, data.size() - done);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      done += static_cast<size_t>(got);
    }
    ok = done == data.size();
  }
  close(fd);
  if (!ok || data.size() < kHeaderSize) return false;
  if (std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) return false;
  if (std::memcmp(data.data() + 8, key.data(), key.size()) != 0) return false;
  const uint64_t length = GetU64(data.data() + 40);
  if (length != data.size() - kHeaderSize) return false;
  const std::string_view payload(data.data() + kHeaderSize, length);
  const std::array<uint8_t, 32> digest = Sha256(payload);
  if (std::memcmp(data.data() + 48, digest.data(), digest.size()) != 0) return false;
  cubin->assign(payload);
  return true;
}

void NvrtcCompiler::WarnOnce(const std::string& message) {
  if (!warned_.exchange(true)) {
    Log(LogLevel::kWarning,
        "the kernel cache directory is not usable; compiled kernels will not be kept across "
        "restarts",
        {{"directory", cache_dir_}, {"error", message}});
  }
}

void NvrtcCompiler::WriteCache(const std::string& path, const std::array<uint8_t, 32>& key,
                               const std::string& cubin) {
  std::error_code ec;
  std::filesystem::create_directories(cache_dir_, ec);
  if (ec) {
    WarnOnce(absl::StrCat("creating it: ", ec.message()));
    return;
  }
  std::string data(kMagic, sizeof(kMagic));
  data.append(reinterpret_cast<const char*>(key.data()), key.size());
  PutU64(data, cubin.size());
  const std::array<uint8_t, 32> digest = Sha256(cubin);
  data.append(reinterpret_cast<const char*>(digest.data()), digest.size());
  data += cubin;

  // Written under a name no other writer uses, in the same directory, then renamed over
  // the final name: a reader sees the old file, no file, or the whole new one, and two
  // processes compiling the same kernel at once both succeed.
  const std::string temp = absl::StrCat(path, ".tmp.", getpid(), ".", temp_counter_.fetch_add(1));
  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    WarnOnce(absl::StrCat("writing ", temp, ": ", std::strerror(errno)));
    return;
  }
  size_t done = 0;
  int error = 0;
  while (done < data.size()) {
    const ssize_t put = write(fd, data.data() + done, data.size() - done);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      error = put < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(put);
  }
  if (close(fd) != 0 && error == 0) error = errno;
  if (error == 0 && rename(temp.c_str(), path.c_str()) != 0) error = errno;
  if (error != 0) {
    unlink(temp.c_str());
    WarnOnce(absl::StrCat("writing ", path, ": ", std::strerror(error)));
  }
}

absl::StatusOr<std::string> NvrtcCompiler::Compile(std::string_view source, int arch,
                                                   bool* from_cache) {
  if (from_cache != nullptr) *from_cache = false;
  ASSIGN_OR_RETURN(const auto key, Key(source, arch));
  std::string path;
  if (!cache_dir_.empty()) {
    path = PathFor(key);
    std::string cubin;
    if (ReadCache(path, key, &cubin)) {
      if (from_cache != nullptr) *from_cache = true;
      return cubin;
    }
  }
  RETURN_IF_ERROR(CheckArchSupported(arch));

  const std::string text(source);  // NVRTC wants it NUL-terminated
  std::unique_ptr<nvrtcProgram, ProgramDeleter> program(new nvrtcProgram(nullptr));
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(nvrtcCreateProgram(
      program.get(), text.c_str(), "gpucompute_elementwise.cu", 0, nullptr, nullptr));
  const std::vector<std::string> options = Options(arch);
  std::vector<const char*> option_ptrs;
  for (const std::string& o : options) option_ptrs.push_back(o.c_str());
  nvrtc_compilations_.fetch_add(1);
  const nvrtcResult compiled =
      nvrtcCompileProgram(*program, static_cast<int>(option_ptrs.size()), option_ptrs.data());
  if (compiled != NVRTC_SUCCESS) {
    std::string log;
    size_t log_size = 0;
    if (nvrtcGetProgramLogSize(*program, &log_size) == NVRTC_SUCCESS && log_size > 1) {
      log.resize(log_size);
      if (nvrtcGetProgramLog(*program, log.data()) != NVRTC_SUCCESS) log.clear();
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    }
    return absl::InternalError(absl::StrCat("NVRTC could not compile a generated kernel (",
                                            nvrtcGetErrorString(compiled), ", options ",
                                            absl::StrJoin(options, " "), "):\n", log));
  }
  size_t size = 0;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(nvrtcGetCUBINSize(*program, &size));
  std::string cubin(size, '\0');
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(nvrtcGetCUBIN(*program, cubin.data()));
  if (!path.empty()) WriteCache(path, key, cubin);
  return cubin;
}

}  // namespace gpucompute::cuda
