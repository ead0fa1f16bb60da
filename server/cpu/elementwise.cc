#include "server/cpu/elementwise.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <variant>
#include <vector>

#include "server/expression/ir.h"
#include "server/expression/scalar_ops.h"

namespace gpucompute::cpu {
namespace {

using expr::Ir;
using expr::Node;
using expr::OpKind;
namespace ops = expr::ops;

// The IR runs as a register program: for each block of elements, each instruction is one
// tight typed loop over the block, reading inputs in place and writing a scratch
// register. A register holds one block of the widest dtype (8 KiB), so the live registers
// of ordinary expressions stay in L1/L2 between instructions.
constexpr int64_t kBlock = 1024;
// Chunks handed to the pool: large enough to amortise scheduling, small enough to balance
// 1<<20 elements across many threads.
constexpr int64_t kBlocksPerChunk = 8;
constexpr int64_t kMinGrain = 8192;
// Per-thread scratch budget. A program with more live registers than fit (only pathological
// ones: ~128 at once) runs with shorter blocks instead.
constexpr size_t kMaxScratchBytes = size_t{1} << 20;
constexpr size_t kAlign = 64;

// Bool is one byte holding 0 or 1 in registers; arrays from users may hold any byte, so
// every read of a bool goes through Load (x != 0).
template <typename T>
using Storage = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;

template <typename T>
inline T Load(Storage<T> x) {
  if constexpr (std::is_same_v<T, bool>) {
    return x != 0;
  } else {
    return x;
  }
}

template <typename Op, typename T>
using UnaryResult = decltype(Op::Apply(T{}));
template <typename Op, typename T>
using BinaryResult = decltype(Op::Apply(T{}, T{}));

// src: operand pointers, already offset to the block; dst likewise; n: elements.
using Kernel = void (*)(const void* const* src, void* dst, int64_t n);

// Every operation has two instances: one for exactly kBlock elements, whose constant trip
// count lets GCC vectorise even at -O2 (its "very cheap" cost model will not vectorise a
// loop that needs a scalar epilogue), and one for any count (the last block).
struct KernelPair {
  Kernel full = nullptr;
  Kernel tail = nullptr;
};

// The loops take __restrict__ pointers: the plan never lets a destination overlap a source.

template <typename Op, typename T>
[[gnu::always_inline]] inline void UnaryLoop(const Storage<T>* __restrict__ a,
                                             Storage<UnaryResult<Op, T>>* __restrict__ o,
                                             int64_t n) {
  using R = Storage<UnaryResult<Op, T>>;
  for (int64_t i = 0; i < n; ++i) o[i] = static_cast<R>(Op::Apply(Load<T>(a[i])));
}

template <typename Op, typename T, int64_t kN>
void UnaryKernel(const void* const* src, void* dst, int64_t n) {
  UnaryLoop<Op, T>(static_cast<const Storage<T>*>(src[0]),
                   static_cast<Storage<UnaryResult<Op, T>>*>(dst), kN > 0 ? kN : n);
}

template <typename Op, typename T, bool kScalarA, bool kScalarB>
[[gnu::always_inline]] inline void BinaryLoop(const Storage<T>* __restrict__ a,
                                              const Storage<T>* __restrict__ b,
                                              Storage<BinaryResult<Op, T>>* __restrict__ o,
                                              int64_t n) {
  using R = Storage<BinaryResult<Op, T>>;
  if constexpr (kScalarA) {
    const T x = Load<T>(a[0]);
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<R>(Op::Apply(x, Load<T>(b[i])));
  } else if constexpr (kScalarB) {
    const T y = Load<T>(b[0]);
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<R>(Op::Apply(Load<T>(a[i]), y));
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<R>(Op::Apply(Load<T>(a[i]), Load<T>(b[i])));
  }
}

template <typename Op, typename T, bool kScalarA, bool kScalarB, int64_t kN>
void BinaryKernel(const void* const* src, void* dst, int64_t n) {
  BinaryLoop<Op, T, kScalarA, kScalarB>(
      static_cast<const Storage<T>*>(src[0]), static_cast<const Storage<T>*>(src[1]),
      static_cast<Storage<BinaryResult<Op, T>>*>(dst), kN > 0 ? kN : n);
}

template <typename T, bool kScalarA, bool kScalarB>
[[gnu::always_inline]] inline void WhereLoop(const uint8_t* __restrict__ c,
                                             const Storage<T>* __restrict__ a,
                                             const Storage<T>* __restrict__ b,
                                             Storage<T>* __restrict__ o, int64_t n) {
  using S = Storage<T>;
  // Both sides are loaded unconditionally, which lets the loop become a vector blend.
  for (int64_t i = 0; i < n; ++i) {
    const S x = static_cast<S>(Load<T>(a[kScalarA ? 0 : i]));
    const S y = static_cast<S>(Load<T>(b[kScalarB ? 0 : i]));
    o[i] = c[i] != 0 ? x : y;
  }
}

template <typename T, bool kScalarA, bool kScalarB, int64_t kN>
void WhereKernel(const void* const* src, void* dst, int64_t n) {
  WhereLoop<T, kScalarA, kScalarB>(
      static_cast<const uint8_t*>(src[0]), static_cast<const Storage<T>*>(src[1]),
      static_cast<const Storage<T>*>(src[2]), static_cast<Storage<T>*>(dst), kN > 0 ? kN : n);
}

// Conversion; with kScalar, a broadcast of one value.
template <typename From, typename To, bool kScalar>
[[gnu::always_inline]] inline void CastLoop(const Storage<From>* __restrict__ a,
                                            Storage<To>* __restrict__ o, int64_t n) {
  using S = Storage<To>;
  if constexpr (kScalar) {
    const S v = static_cast<S>(ops::Convert<To>(Load<From>(a[0])));
    for (int64_t i = 0; i < n; ++i) o[i] = v;
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<S>(ops::Convert<To>(Load<From>(a[i])));
  }
}

template <typename From, typename To, bool kScalar, int64_t kN>
void CastKernel(const void* const* src, void* dst, int64_t n) {
  CastLoop<From, To, kScalar>(static_cast<const Storage<From>*>(src[0]),
                              static_cast<Storage<To>*>(dst), kN > 0 ? kN : n);
}

// ---- kernel selection (once per evaluation, never per element) ----

KernelPair SelectUnary(OpKind op, DType dtype) {
  KernelPair r;
  ops::VisitUnaryOp(op, [&](auto o) {
    using Op = decltype(o);
    VisitDType(dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (Op::template kAccepts<T>) {
        r = {&UnaryKernel<Op, T, kBlock>, &UnaryKernel<Op, T, 0>};
      }
    });
  });
  return r;
}

// At most one of the operands may be a scalar.
KernelPair SelectBinary(OpKind op, DType dtype, bool scalar_a, bool scalar_b) {
  KernelPair r;
  ops::VisitBinaryOp(op, [&](auto o) {
    using Op = decltype(o);
    VisitDType(dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (Op::template kAccepts<T>) {
        if (scalar_a) {
          r = {&BinaryKernel<Op, T, true, false, kBlock>, &BinaryKernel<Op, T, true, false, 0>};
        } else if (scalar_b) {
          r = {&BinaryKernel<Op, T, false, true, kBlock>, &BinaryKernel<Op, T, false, true, 0>};
        } else {
          r = {&BinaryKernel<Op, T, false, false, kBlock>, &BinaryKernel<Op, T, false, false, 0>};
        }
      }
    });
  });
  return r;
}

KernelPair SelectWhere(DType dtype, bool scalar_a, bool scalar_b) {
  return VisitDType(dtype, [&](auto tag) -> KernelPair {
    using T = decltype(tag);
    if (scalar_a && scalar_b)
      return {&WhereKernel<T, true, true, kBlock>, &WhereKernel<T, true, true, 0>};
    if (scalar_a) return {&WhereKernel<T, true, false, kBlock>, &WhereKernel<T, true, false, 0>};
    if (scalar_b) return {&WhereKernel<T, false, true, kBlock>, &WhereKernel<T, false, true, 0>};
    return {&WhereKernel<T, false, false, kBlock>, &WhereKernel<T, false, false, 0>};
  });
}

KernelPair SelectCast(DType from, DType to, bool scalar) {
  return VisitDType(from, [&](auto f) -> KernelPair {
    using From = decltype(f);
    return VisitDType(to, [&](auto t) -> KernelPair {
      using To = decltype(t);
      if (scalar) return {&CastKernel<From, To, true, kBlock>, &CastKernel<From, To, true, 0>};
      return {&CastKernel<From, To, false, kBlock>, &CastKernel<From, To, false, 0>};
    });
  });
}

// ---- the register program ----

struct Operand {
  enum class Kind : uint8_t { kInput, kRegister, kConstant, kOutput };
  Kind kind = Kind::kRegister;
  int32_t index = 0;       // input number, register number or constant slot
  uint32_t elem_size = 0;  // bytes per element, to offset inputs and the output by block
};

struct Instruction {
  KernelPair kernel;
  int num_src = 0;
  std::array<Operand, 3> src;
  Operand dst;
};

struct ConstantSlot {
  alignas(8) unsigned char bytes[8] = {};
};

struct Plan {
  std::vector<Instruction> code;
  std::vector<ConstantSlot> constants;
  int32_t num_registers = 0;
};

template <typename T>
void StoreConstant(ConstantSlot& slot, const expr::ConstantValue& v) {
  Storage<T> x;
  if constexpr (std::is_same_v<T, bool>) {
    x = v.i != 0;
  } else if constexpr (ops::kIsFloat<T>) {
    x = static_cast<T>(v.f);
  } else {
    x = static_cast<T>(v.i);
  }
  std::memcpy(slot.bytes, &x, sizeof(x));
}

class PlanBuilder {
 public:
  PlanBuilder(const Ir& ir, DType out_dtype, bool write_output_directly)
      : ir_(ir), out_dtype_(out_dtype), direct_(write_output_directly) {}

  Plan Build() {
    const size_t count = ir_.nodes.size();
    // A register is released after the last instruction that reads it.
    std::vector<int32_t> last_use(count, -1);
    for (size_t j = 0; j < count; ++j) {
      const Node& node = ir_.nodes[j];
      for (int a = 0; a < node.num_args; ++a) last_use[node.args[a]] = static_cast<int32_t>(j);
    }
    value_.resize(count);
    for (size_t i = 0; i < count; ++i) {
      const Node& node = ir_.nodes[i];
      const uint32_t size = static_cast<uint32_t>(DTypeSize(node.dtype));
      if (node.op == OpKind::kInput) {
        value_[i] = {Operand::Kind::kInput, node.input, size};
        continue;
      }
      if (node.op == OpKind::kConstant) {
        ConstantSlot& slot = plan_.constants.emplace_back();
        VisitDType(node.dtype, [&](auto tag) { StoreConstant<decltype(tag)>(slot, node.value); });
        value_[i] = {Operand::Kind::kConstant, static_cast<int32_t>(plan_.constants.size() - 1),
                     size};
        continue;
      }
      EmitOperation(static_cast<int32_t>(i));
      for (int a = 0; a < node.num_args; ++a) {
        const int32_t arg = node.args[a];
        const bool repeated =
            std::find(node.args.begin(), node.args.begin() + a, arg) != node.args.begin() + a;
        if (!repeated && last_use[arg] == static_cast<int32_t>(i)) Release(value_[arg]);
      }
    }
    const Node& root = ir_.nodes[ir_.root];
    Operand result = value_[ir_.root];
    if (result.kind != Operand::Kind::kOutput) {
      if (!direct_ && result.kind == Operand::Kind::kInput) {
        // The output may be this very input: copy through a register so the final
        // conversion never reads and writes the same memory.
        result = Emit(SelectCast(root.dtype, root.dtype, false), {result}, 1, NewRegister());
      }
      Emit(SelectCast(root.dtype, out_dtype_, result.kind == Operand::Kind::kConstant), {result}, 1,
           OutputOperand());
    }
    return std::move(plan_);
  }

 private:
  Operand OutputOperand() const {
    return {Operand::Kind::kOutput, 0, static_cast<uint32_t>(DTypeSize(out_dtype_))};
  }

  Operand NewRegister() {
    int32_t r;
    if (free_.empty()) {
      r = plan_.num_registers++;
    } else {
      r = free_.back();
      free_.pop_back();
    }
    return {Operand::Kind::kRegister, r, 8};
  }

  void Release(const Operand& o) {
    if (o.kind == Operand::Kind::kRegister) free_.push_back(o.index);
  }

  Operand Emit(KernelPair kernel, std::array<Operand, 3> src, int num_src, Operand dst) {
    assert(kernel.full != nullptr && "IR violates its typing invariants");
    Instruction ins;
    ins.kernel = kernel;
    ins.src = src;
    ins.num_src = num_src;
    ins.dst = dst;
    plan_.code.push_back(ins);
    return dst;
  }

  // Fills a temporary register with a constant, for kernels that want an array there.
  Operand Broadcast(const Operand& constant, DType dtype) {
    return Emit(SelectCast(dtype, dtype, true), {constant}, 1, NewRegister());
  }

  void EmitOperation(int32_t i) {
    const Node& node = ir_.nodes[i];
    std::array<Operand, 3> src;
    std::array<bool, 3> scalar = {false, false, false};
    for (int a = 0; a < node.num_args; ++a) {
      src[a] = value_[node.args[a]];
      scalar[a] = src[a].kind == Operand::Kind::kConstant;
    }
    auto arg_dtype = [&](int a) { return ir_.nodes[node.args[a]].dtype; };
    // The compiler folds constant-only operations, so these broadcasts only happen for
    // IR it did not produce; they keep every valid IR evaluable.
    std::vector<Operand> temps;
    auto broadcast = [&](int a) {
      src[a] = Broadcast(src[a], arg_dtype(a));
      scalar[a] = false;
      temps.push_back(src[a]);
    };
    KernelPair kernel;
    if (node.op == OpKind::kCast) {
      kernel = SelectCast(arg_dtype(0), node.dtype, scalar[0]);
    } else if (node.op == OpKind::kWhere) {
      if (scalar[0]) broadcast(0);
      kernel = SelectWhere(node.dtype, scalar[1], scalar[2]);
    } else if (node.num_args == 2) {
      if (scalar[0] && scalar[1]) broadcast(0);
      kernel = SelectBinary(node.op, arg_dtype(0), scalar[0], scalar[1]);
    } else {
      if (scalar[0]) broadcast(0);
      kernel = SelectUnary(node.op, arg_dtype(0));
    }
    const bool to_output = i == ir_.root && direct_ && node.dtype == out_dtype_;
    value_[i] = Emit(kernel, src, node.num_args, to_output ? OutputOperand() : NewRegister());
    for (const Operand& t : temps) Release(t);
  }

  const Ir& ir_;
  DType out_dtype_;
  bool direct_;
  Plan plan_;
  std::vector<Operand> value_;  // where each node's value lives
  std::vector<int32_t> free_;   // released registers
};

// Scratch registers, kept per thread between calls so that evaluation does not allocate.
std::byte* ThreadScratch(size_t bytes, std::unique_ptr<std::byte[]>& oversized) {
  struct Cache {
    std::unique_ptr<std::byte[]> data;
    size_t size = 0;
  };
  thread_local Cache cache;
  std::unique_ptr<std::byte[]>* holder = &oversized;
  if (bytes <= kMaxScratchBytes) {
    if (cache.size < bytes) {  // grows to the largest program this thread has run
      cache.data = std::make_unique_for_overwrite<std::byte[]>(bytes + kAlign);
      cache.size = bytes;
    }
    holder = &cache.data;
  } else {
    oversized = std::make_unique_for_overwrite<std::byte[]>(bytes + kAlign);
  }
  const auto address = reinterpret_cast<uintptr_t>(holder->get());
  return holder->get() + ((kAlign - address % kAlign) % kAlign);
}

void Run(const Plan& plan, std::span<const void* const> inputs, void* out, int64_t n,
         ThreadPool& pool) {
  int64_t block = kBlock;
  const size_t registers = static_cast<size_t>(std::max(plan.num_registers, 1));
  if (registers * kBlock * 8 > kMaxScratchBytes) {
    block = std::max<int64_t>(
        16, static_cast<int64_t>(kMaxScratchBytes / (registers * 8)) & ~int64_t{15});
  }
  const size_t register_bytes = static_cast<size_t>(block) * 8;  // a multiple of kAlign
  const int64_t grain = std::max(block * kBlocksPerChunk, (kMinGrain / block) * block);

  pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
    std::unique_ptr<std::byte[]> oversized;
    std::byte* scratch = ThreadScratch(registers * register_bytes, oversized);
    const void* src[3];
    for (int64_t b = begin; b < end; b += block) {
      const int64_t len = std::min(block, end - b);
      const bool full = len == kBlock;
      auto resolve = [&](const Operand& o) -> void* {
        switch (o.kind) {
          case Operand::Kind::kInput:
            return const_cast<char*>(static_cast<const char*>(inputs[o.index])) + b * o.elem_size;
          case Operand::Kind::kRegister:
            return scratch + static_cast<size_t>(o.index) * register_bytes;
          case Operand::Kind::kConstant:
            return const_cast<unsigned char*>(plan.constants[o.index].bytes);
          case Operand::Kind::kOutput:
            break;
        }
        return static_cast<char*>(out) + b * o.elem_size;
      };
      for (const Instruction& ins : plan.code) {
        for (int k = 0; k < ins.num_src; ++k) src[k] = resolve(ins.src[k]);
        (full ? ins.kernel.full : ins.kernel.tail)(src, resolve(ins.dst), len);
      }
    }
  });
}

bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

}  // namespace

void EvaluateElementwise(const expr::Program& program, std::span<const void* const> inputs,
                         void* out, DType out_dtype, int64_t n, ThreadPool& pool) {
  assert(inputs.size() == program.inputs().size());
  if (n <= 0) return;
  const size_t out_size = DTypeSize(out_dtype);
  const size_t out_bytes = static_cast<size_t>(n) * out_size;

  // Blocks are independent, so an output that is exactly an input of the same element size
  // is safe as long as no instruction reads and writes it at once. Any other overlap would
  // let one block clobber another's input: evaluate into a temporary instead.
  bool exact_alias = false;
  bool other_overlap = false;
  const auto& types = program.input_types();
  for (size_t k = 0; k < types.size(); ++k) {
    const auto* array = std::get_if<expr::ArrayInput>(&types[k]);
    if (array == nullptr || inputs[k] == nullptr) continue;
    const size_t in_size = DTypeSize(array->dtype);
    if (!Overlaps(inputs[k], static_cast<size_t>(n) * in_size, out, out_bytes)) continue;
    if (inputs[k] == out && in_size == out_size) {
      exact_alias = true;
    } else {
      other_overlap = true;
    }
  }

  if (other_overlap) {
    auto temp = std::make_unique_for_overwrite<std::byte[]>(out_bytes);
    const Plan plan = PlanBuilder(program.ir(), out_dtype, /*write_output_directly=*/true).Build();
    Run(plan, inputs, temp.get(), n, pool);
    std::memmove(out, temp.get(), out_bytes);
    return;
  }
  const Plan plan = PlanBuilder(program.ir(), out_dtype, !exact_alias).Build();
  Run(plan, inputs, out, n, pool);
}

}  // namespace gpucompute::cpu
