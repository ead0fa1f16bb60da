#include "server/expression/program_cache.h"

#include <cstdint>
#include <cstring>
#include <variant>

namespace gpucompute::expr {
namespace {

template <typename T>
void Append(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

// Everything Compile's result depends on, unambiguously: lengths before variable parts.
std::string KeyOf(std::string_view text, const InputMap& inputs, int max_depth) {
  std::string key;
  Append(key, max_depth);
  Append(key, text.size());
  key.append(text);
  for (const auto& [name, type] : inputs) {
    Append(key, name.size());
    key.append(name);
    if (const auto* array = std::get_if<ArrayInput>(&type)) {
      key.push_back('a');
      Append(key, array->dtype);
    } else {
      const auto& scalar = std::get<ScalarInput>(type);
      key.push_back('s');
      Append(key, scalar.dtype);
      uint64_t f_bits;
      std::memcpy(&f_bits, &scalar.f, sizeof(f_bits));  // -0.0 and NaNs stay distinct
      Append(key, f_bits);
      Append(key, scalar.i);
    }
  }
  return key;
}

}  // namespace

absl::StatusOr<Program> ProgramCache::Compile(std::string_view text, const InputMap& inputs,
                                              int max_depth) {
  if (text.size() > kMaxCachedTextBytes) return expr::Compile(text, inputs, max_depth);
  std::string key = KeyOf(text, inputs, max_depth);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = programs_.find(key); it != programs_.end()) return it->second;
  }
  absl::StatusOr<Program> program = expr::Compile(text, inputs, max_depth);
  if (!program.ok()) return program;
  absl::MutexLock lock(&mu_);
  if (programs_.size() >= capacity_) programs_.clear();
  programs_.emplace(std::move(key), *program);
  return program;
}

size_t ProgramCache::size() const {
  absl::MutexLock lock(&mu_);
  return programs_.size();
}

}  // namespace gpucompute::expr
