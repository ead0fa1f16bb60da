// Compiles CUDA C++ source to a CUBIN with NVRTC, with an optional on-disk cache that
// survives restarts. Needs no GPU and does not link the CUDA driver.
#ifndef GPUCOMPUTE_SERVER_CUDA_NVRTC_COMPILER_H_
#define GPUCOMPUTE_SERVER_CUDA_NVRTC_COMPILER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace gpucompute::cuda {

// SHA-256 of `data` (FIPS 180-4). The disk cache names and validates its files with it:
// unlike absl::Hash it is the same in every run, and unlike FNV it resists crafted
// collisions (the hashed source derives from expressions sent over the network).
std::array<uint8_t, 32> Sha256(std::string_view data);
std::string Sha256Hex(std::string_view data);

// Thread-safe: any number of threads may call Compile at once.
class NvrtcCompiler {
 public:
  // `cache_dir` is created (with its parents) on the first write; empty disables the disk
  // cache. A directory that cannot be created or written never fails a compilation: the
  // first failure is reported once on stderr and compilation goes on without the cache.
  explicit NvrtcCompiler(std::string cache_dir);

  NvrtcCompiler(const NvrtcCompiler&) = delete;
  NvrtcCompiler& operator=(const NvrtcCompiler&) = delete;

  // The CUBIN of `source` for compute capability `arch` (major * 10 + minor, e.g. 90 for
  // sm_90). The cache key covers the source, the options, NVRTC's version and the
  // architecture; a cache file that is truncated, corrupt or for another key is ignored
  // and replaced. *from_cache (if given) tells whether the CUBIN came from disk.
  // Errors: FAILED_PRECONDITION when this NVRTC cannot target `arch`; INTERNAL when the
  // source does not compile (generated source is ours, so that is our bug), with the log.
  absl::StatusOr<std::string> Compile(std::string_view source, int arch,
                                      bool* from_cache = nullptr);

  // The NVRTC options used for `arch`: -std=c++17 and otherwise NVRTC's defaults (full
  // optimisation, IEEE division and square root, denormals, --fmad=true; see
  // nvrtc_compiler.cc).
  static std::vector<std::string> Options(int arch);

  // How many times this instance ran NVRTC (disk hits excluded).
  int64_t nvrtc_compilations() const { return nvrtc_compilations_.load(); }

  // The path the CUBIN of (source, arch) is cached at; empty without a disk cache.
  std::string CachePath(std::string_view source, int arch) const;

  const std::string& cache_dir() const { return cache_dir_; }

 private:
  // The cache key's digest: SHA-256 over the key's fields, each length-prefixed.
  static absl::StatusOr<std::array<uint8_t, 32>> Key(std::string_view source, int arch);
  std::string PathFor(const std::array<uint8_t, 32>& key) const;
  bool ReadCache(const std::string& path, const std::array<uint8_t, 32>& key,
                 std::string* cubin) const;
  void WriteCache(const std::string& path, const std::array<uint8_t, 32>& key,
                  const std::string& cubin);
  void WarnOnce(const std::string& message);

  const std::string cache_dir_;
  std::atomic<int64_t> nvrtc_compilations_{0};
  std::atomic<bool> warned_{false};
  std::atomic<uint64_t> temp_counter_{0};
};

}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_SERVER_CUDA_NVRTC_COMPILER_H_
