// Compiled expressions kept for reuse. A session or a chain submits the same few
// expressions over and over (`s + 1` a hundred times in a row), and parsing and
// type-checking one again costs more than planning the rest of its operation.
#ifndef GPUCOMPUTE_SERVER_EXPRESSION_PROGRAM_CACHE_H_
#define GPUCOMPUTE_SERVER_EXPRESSION_PROGRAM_CACHE_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/expression/expression.h"

namespace gpucompute::expr {

class ProgramCache {
 public:
  // Expressions longer than this are compiled every time: few are, and they would hold
  // the most memory.
  static constexpr size_t kMaxCachedTextBytes = 1024;

  // Keeps at most `capacity` programs; once full, it starts over empty.
  explicit ProgramCache(size_t capacity = 1024) : capacity_(capacity) {}
  ProgramCache(const ProgramCache&) = delete;
  ProgramCache& operator=(const ProgramCache&) = delete;

  // Compile(text, inputs, max_depth), taken from the cache when the same text compiled
  // before with the same bindings (names, array or scalar, dtypes, and scalar values,
  // which a Program bakes in) and depth. Errors are not kept: a bad expression is
  // compiled again to say what is wrong with it. Thread-safe.
  absl::StatusOr<Program> Compile(std::string_view text, const InputMap& inputs, int max_depth);

  size_t size() const;

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Program> programs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpucompute::expr

#endif  // GPUCOMPUTE_SERVER_EXPRESSION_PROGRAM_CACHE_H_
