// Fuzzes the expression compiler, and the CPU evaluator on what compiles.
//
// Input: one byte choosing how x, y and z are bound (2 bits each: an int32, float32 or
// float64 array, or a float64 scalar), then the expression text. Anything compiled is
// evaluated on 7 elements (values that include 0, negatives and large magnitudes, where
// division, shifts and conversions misbehave) into each output dtype.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "server/cpu/elementwise.h"
#include "server/cpu/thread_pool.h"
#include "server/expression/expression.h"

namespace gpucompute {
namespace {

constexpr int64_t kN = 7;

expr::InputType Binding(int code) {
  switch (code & 3) {
    case 0:
      return expr::ArrayInput{DType::kInt32};
    case 1:
      return expr::ArrayInput{DType::kFloat32};
    case 2:
      return expr::ArrayInput{DType::kFloat64};
    default:
      return expr::ScalarInput{DType::kFloat64, -2.5, 0};
  }
}

// kN elements of `dtype`, 8-byte aligned, in a buffer large enough for any dtype.
std::vector<double> Values(DType dtype) {
  std::vector<double> storage(kN);
  const double values[kN] = {0, 1, -1, 3, -7, 1e9, -2147483648.0};
  for (int64_t i = 0; i < kN; ++i) {
    switch (dtype) {
      case DType::kInt32:
        reinterpret_cast<int32_t*>(storage.data())[i] = static_cast<int32_t>(values[i]);
        break;
      case DType::kFloat32:
        reinterpret_cast<float*>(storage.data())[i] = static_cast<float>(values[i]);
        break;
      default:
        storage[i] = values[i];
    }
  }
  return storage;
}

}  // namespace
}  // namespace gpucompute

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gpucompute;
  if (size < 1) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  expr::InputMap inputs = {
      {"x", Binding(data[0])}, {"y", Binding(data[0] >> 2)}, {"z", Binding(data[0] >> 4)}};
  absl::StatusOr<expr::Program> program = expr::Compile(text, inputs);
  if (!program.ok()) {
    // Inputs bound but unused are an error: try again with only those named in the text.
    for (auto it = inputs.begin(); it != inputs.end();) {
      it = text.find(it->first) == std::string_view::npos ? inputs.erase(it) : std::next(it);
    }
    program = expr::Compile(text, inputs);
    if (!program.ok()) return 0;
  }
  (void)program->canonical();
  // The range evaluated here is one axis: index() may name only that one.
  for (int64_t k : expr::IndexAxes(program->ir())) {
    if (k != 0 && k != -1) return 0;
  }
  static cpu::ThreadPool pool(1);
  std::vector<std::vector<double>> arrays;
  std::vector<const void*> pointers;
  for (size_t k = 0; k < program->inputs().size(); ++k) {
    const expr::InputType& binding = program->input_types()[k];
    if (const auto* array = std::get_if<expr::ArrayInput>(&binding)) {
      arrays.push_back(Values(array->dtype));
      pointers.push_back(arrays.back().data());
    } else {
      pointers.push_back(nullptr);
    }
  }
  for (DType out : {DType::kFloat64, DType::kFloat32, DType::kInt64, DType::kInt32, DType::kBool}) {
    std::vector<double> result(kN);
    cpu::EvaluateElementwise(*program, pointers, result.data(), out, kN, pool);
  }
  return 0;
}
