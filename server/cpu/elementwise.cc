#include "server/cpu/elementwise.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
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
// Rows of a transposed operand gathered together (see EvaluateElementwiseStrided).
constexpr int64_t kTileRows = 32;

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

// Registers per block and their size: the block shrinks for programs with more live
// registers (plus `extra_slots` blocks of the caller's) than the scratch budget holds.
struct BlockGeometry {
  int64_t block = kBlock;
  size_t register_bytes = kBlock * 8;  // a multiple of kAlign
  size_t slots = 1;
};

BlockGeometry Geometry(const Plan& plan, size_t extra_slots) {
  BlockGeometry g;
  g.slots = static_cast<size_t>(std::max(plan.num_registers, 1)) + extra_slots;
  if (g.slots * kBlock * 8 > kMaxScratchBytes) {
    g.block = std::max<int64_t>(16,
                                static_cast<int64_t>(kMaxScratchBytes / (g.slots * 8)) & ~int64_t{15});
  }
  g.register_bytes = static_cast<size_t>(g.block) * 8;
  return g;
}

int64_t Grain(const BlockGeometry& g) {
  return std::max(g.block * kBlocksPerChunk, (kMinGrain / g.block) * g.block);
}

// Runs the program over `len` elements: in[k] points at input k's first element of the
// block (contiguous), `out` at the output's.
void RunBlock(const Plan& plan, const void* const* in, void* out, int64_t len, std::byte* scratch,
              size_t register_bytes) {
  const bool full = len == kBlock;
  auto resolve = [&](const Operand& o) -> void* {
    switch (o.kind) {
      case Operand::Kind::kInput:
        return const_cast<void*>(in[o.index]);
      case Operand::Kind::kRegister:
        return scratch + static_cast<size_t>(o.index) * register_bytes;
      case Operand::Kind::kConstant:
        return const_cast<unsigned char*>(plan.constants[o.index].bytes);
      case Operand::Kind::kOutput:
        break;
    }
    return out;
  };
  const void* src[3];
  for (const Instruction& ins : plan.code) {
    for (int k = 0; k < ins.num_src; ++k) src[k] = resolve(ins.src[k]);
    (full ? ins.kernel.full : ins.kernel.tail)(src, resolve(ins.dst), len);
  }
}

// Bytes per element of each input (0 for scalars, which the plan reads as constants).
std::vector<size_t> InputSizes(const expr::Program& program) {
  std::vector<size_t> sizes;
  for (const expr::InputType& type : program.input_types()) {
    const auto* array = std::get_if<expr::ArrayInput>(&type);
    sizes.push_back(array == nullptr ? 0 : DTypeSize(array->dtype));
  }
  return sizes;
}

void Run(const Plan& plan, std::span<const void* const> inputs, std::span<const size_t> sizes,
         void* out, size_t out_size, int64_t n, ThreadPool& pool) {
  const BlockGeometry g = Geometry(plan, 0);
  pool.ParallelFor(n, Grain(g), [&](int64_t begin, int64_t end) {
    std::unique_ptr<std::byte[]> oversized;
    std::byte* scratch = ThreadScratch(g.slots * g.register_bytes, oversized);
    std::vector<const void*> in(inputs.size());
    for (int64_t b = begin; b < end; b += g.block) {
      for (size_t k = 0; k < inputs.size(); ++k) {
        in[k] = inputs[k] == nullptr ? nullptr : static_cast<const char*>(inputs[k]) + b * sizes[k];
      }
      RunBlock(plan, in.data(), static_cast<char*>(out) + b * out_size, std::min(g.block, end - b),
               scratch, g.register_bytes);
    }
  });
}

// --- strided evaluation ---

// Copies `n` elements of `size` bytes, `stride` elements apart (0: one value repeated),
// into a contiguous block, and back.
template <typename T>
void GatherTyped(const T* src, int64_t stride, T* dst, int64_t n) {
  if (stride == 0) {
    std::fill(dst, dst + n, *src);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i * stride];
  }
}

void Gather(const char* src, int64_t stride, size_t size, void* dst, int64_t n) {
  switch (size) {
    case 1:
      return GatherTyped(reinterpret_cast<const uint8_t*>(src), stride, static_cast<uint8_t*>(dst), n);
    case 4:
      return GatherTyped(reinterpret_cast<const uint32_t*>(src), stride, static_cast<uint32_t*>(dst),
                         n);
    default:
      return GatherTyped(reinterpret_cast<const uint64_t*>(src), stride, static_cast<uint64_t*>(dst),
                         n);
  }
}

template <typename T>
void ScatterTyped(const T* src, T* dst, int64_t stride, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i * stride] = src[i];
}

void Scatter(const void* src, size_t size, char* dst, int64_t stride, int64_t n) {
  switch (size) {
    case 1:
      return ScatterTyped(static_cast<const uint8_t*>(src), reinterpret_cast<uint8_t*>(dst), stride, n);
    case 4:
      return ScatterTyped(static_cast<const uint32_t*>(src), reinterpret_cast<uint32_t*>(dst), stride,
                          n);
    default:
      return ScatterTyped(static_cast<const uint64_t*>(src), reinterpret_cast<uint64_t*>(dst), stride,
                          n);
  }
}

// A tile of `rows` rows of `n` elements each, from a layout whose rows are `row_stride`
// elements apart and whose elements are `stride` apart: read along the rows' axis, which
// is the contiguous one where this is used (a transposed operand), and written row by
// row into `dst`, `pitch` bytes apart.
template <typename T>
void GatherTileTyped(const T* src, int64_t row_stride, int64_t stride, std::byte* dst,
                     size_t pitch, int64_t rows, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      reinterpret_cast<T*>(dst + static_cast<size_t>(r) * pitch)[i] =
          src[r * row_stride + i * stride];
    }
  }
}

void GatherTile(const char* src, int64_t row_stride, int64_t stride, size_t size, std::byte* dst,
                size_t pitch, int64_t rows, int64_t n) {
  switch (size) {
    case 1:
      return GatherTileTyped(reinterpret_cast<const uint8_t*>(src), row_stride, stride, dst,
                             pitch, rows, n);
    case 4:
      return GatherTileTyped(reinterpret_cast<const uint32_t*>(src), row_stride, stride, dst,
                             pitch, rows, n);
    default:
      return GatherTileTyped(reinterpret_cast<const uint64_t*>(src), row_stride, stride, dst,
                             pitch, rows, n);
  }
}

// The element offset of the first element of row `row` (the C-order index over every
// axis but the last) of `layout`.
int64_t RowOffset(const StridedLayout& layout, int64_t row) {
  int64_t offset = layout.offset;
  for (int d = layout.ndim() - 2; d >= 0; --d) {
    const int64_t extent = layout.shape[d];
    offset += (row % extent) * layout.strides[d];
    row /= extent;
  }
  return offset;
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
  if (!expr::IndexAxes(program.ir()).empty()) {
    // index() needs coordinates, which the strided evaluator makes: over one axis here.
    const StridedLayout line{.shape = {n}, .strides = {1}, .offset = 0};
    std::vector<StridedArray> arrays;
    for (const void* in : inputs) arrays.push_back({in, line});
    EvaluateElementwiseStrided(program, arrays, out, line, out_dtype, pool);
    return;
  }
  const size_t out_size = DTypeSize(out_dtype);
  const size_t out_bytes = static_cast<size_t>(n) * out_size;
  const std::vector<size_t> sizes = InputSizes(program);

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
    Run(plan, inputs, sizes, temp.get(), out_size, n, pool);
    std::memmove(out, temp.get(), out_bytes);
    return;
  }
  const Plan plan = PlanBuilder(program.ir(), out_dtype, !exact_alias).Build();
  Run(plan, inputs, sizes, out, out_size, n, pool);
}

namespace {

// EvaluateElementwiseStrided over `ir`, whose kInput nodes read `inputs` (elements of
// `sizes` bytes, 0 for scalars).
void EvaluateIrStrided(const Ir& ir, std::span<const size_t> sizes,
                       std::span<const StridedArray> inputs, void* out,
                       const StridedLayout& out_layout, DType out_dtype, ThreadPool& pool) {
  const int64_t n = out_layout.num_elements();
  if (n <= 0) return;
  const int ndim = out_layout.ndim();
  const int64_t row_length = ndim == 0 ? 1 : out_layout.shape[ndim - 1];
  const auto inner_stride = [&](const StridedLayout& l) {
    return ndim == 0 ? int64_t{1} : l.strides[ndim - 1];
  };
  const size_t out_size = DTypeSize(out_dtype);

  // The caller lets the output share memory with an input only where both are the same
  // elements in the same order: every element is then read before it is written, in the
  // same block, and no block reaches another's elements. The last conversion must still
  // not read and write one buffer in one loop.
  bool aliased = false;
  for (const StridedArray& in : inputs) aliased = aliased || (in.data != nullptr && in.data == out);
  const Plan plan = PlanBuilder(ir, out_dtype, !aliased).Build();
  // One block of the caller's per array input (its gathered elements) and one for the
  // output's, beside the registers.
  const size_t gather_slots = inputs.size() + 1;
  const BlockGeometry g = Geometry(plan, gather_slots);

  // An input whose rows are far apart in memory along the last axis but next to each
  // other along the axis before it (a transposed operand) is read a tile of rows at a
  // time, along that axis, rather than a cache line per element.
  std::vector<bool> tiled(inputs.size(), false);
  std::vector<int64_t> tile_slot(inputs.size(), 0);
  int64_t tiled_count = 0;
  for (size_t k = 0; k < inputs.size() && ndim >= 2; ++k) {
    const StridedLayout& l = inputs[k].layout;
    if (inputs[k].data == nullptr) continue;
    const int64_t inner = l.strides[ndim - 1];
    if ((inner > 1 || inner < -1) && (l.strides[ndim - 2] == 1 || l.strides[ndim - 2] == -1)) {
      tiled[k] = true;
      tile_slot[k] = tiled_count++;
    }
  }

  // Split over the C-order positions, not over rows: the chunks depend on the shape
  // alone, and a long single row is still spread over the pool.
  // A cache line beyond a block, so that the rows of a tile, written together, do not
  // all fall into the same cache sets.
  const size_t tile_pitch = g.register_bytes + kAlign;
  // Chunks of whole tiles where there are tiles to gather (still a function of the
  // shape alone).
  const int64_t grain =
      tiled_count > 0 && row_length <= (int64_t{1} << 20) / kTileRows
          ? std::max(Grain(g), kTileRows * row_length)
          : Grain(g);
  pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
    const size_t tile_bytes = static_cast<size_t>(tiled_count * kTileRows) * tile_pitch;
    const std::unique_ptr<std::byte[]> tiles =
        tile_bytes == 0 ? nullptr : std::make_unique_for_overwrite<std::byte[]>(tile_bytes);
    std::unique_ptr<std::byte[]> oversized;
    std::byte* scratch = ThreadScratch(g.slots * g.register_bytes, oversized);
    std::byte* gathered = scratch + (g.slots - gather_slots) * g.register_bytes;
    std::vector<const void*> in(inputs.size());
    // A broadcast value (stride 0 along rows) is spread over its block once, and again
    // only when a row reads another one.
    std::vector<const char*> filled_from(inputs.size(), nullptr);
    std::vector<int64_t> filled_length(inputs.size(), 0);
    std::byte* out_block = gathered + inputs.size() * g.register_bytes;
    // Runs the block of `len` elements from column `col` of row `row`; an input gathered
    // into a tile reads its row `tile_row` there instead.
    const auto run = [&](int64_t row, int64_t col, int64_t len, int64_t tile_row) {
      for (size_t k = 0; k < inputs.size(); ++k) {
        if (inputs[k].data == nullptr) {
          in[k] = nullptr;
          continue;
        }
        if (tile_row >= 0 && tiled[k]) {
          in[k] = tiles.get() + (tile_slot[k] * kTileRows + tile_row) * tile_pitch;
          continue;
        }
        const StridedLayout& l = inputs[k].layout;
        const int64_t stride = inner_stride(l);
        const char* first = static_cast<const char*>(inputs[k].data) +
                            (RowOffset(l, row) + col * stride) * static_cast<int64_t>(sizes[k]);
        if (stride == 1) {
          in[k] = first;
          continue;
        }
        std::byte* block = gathered + k * g.register_bytes;
        if (stride != 0 || filled_from[k] != first || filled_length[k] < len) {
          Gather(first, stride, sizes[k], block, len);
          filled_from[k] = stride == 0 ? first : nullptr;
          filled_length[k] = len;
        }
        in[k] = block;
      }
      const int64_t out_stride = inner_stride(out_layout);
      char* out_first = static_cast<char*>(out) + (RowOffset(out_layout, row) + col * out_stride) *
                                                      static_cast<int64_t>(out_size);
      if (out_stride == 1) {
        RunBlock(plan, in.data(), out_first, len, scratch, g.register_bytes);
      } else {
        RunBlock(plan, in.data(), out_block, len, scratch, g.register_bytes);
        Scatter(out_block, out_size, out_first, out_stride, len);
      }
    };
    for (int64_t p = begin; p < end;) {
      const int64_t row = p / row_length;
      const int64_t column = p % row_length;
      // Whole rows of one outer index, all in this chunk: tiled when an input needs it.
      const int64_t rows_here =
          column != 0 || tiles == nullptr
              ? 0
              : std::min({kTileRows, (end - p) / row_length,
                          out_layout.shape[ndim - 2] - row % out_layout.shape[ndim - 2]});
      if (rows_here >= 2) {
        for (int64_t col = 0; col < row_length; col += g.block) {
          const int64_t len = std::min(g.block, row_length - col);
          for (size_t k = 0; k < inputs.size(); ++k) {
            if (!tiled[k]) continue;
            const StridedLayout& l = inputs[k].layout;
            const char* first =
                static_cast<const char*>(inputs[k].data) +
                (RowOffset(l, row) + col * inner_stride(l)) * static_cast<int64_t>(sizes[k]);
            // Row r of input k's tile lies in a register-sized slot of its own.
            GatherTile(first, l.strides[ndim - 2], inner_stride(l), sizes[k],
                       tiles.get() + tile_slot[k] * kTileRows * tile_pitch, tile_pitch,
                       rows_here, len);
          }
          for (int64_t r = 0; r < rows_here; ++r) run(row + r, col, len, r);
        }
        p += rows_here * row_length;
        continue;
      }
      const int64_t row_end = std::min(end, p - column + row_length);
      for (int64_t b = p; b < row_end; b += g.block) {
        run(row, column + (b - p), std::min(g.block, row_end - b), -1);
      }
      p = row_end;
    }
  });
}

}  // namespace

void EvaluateElementwiseStrided(const expr::Program& program,
                                std::span<const StridedArray> inputs, void* out,
                                const StridedLayout& out_layout, DType out_dtype,
                                ThreadPool& pool) {
  assert(inputs.size() == program.inputs().size());
  if (expr::IndexAxes(program.ir()).empty()) {
    EvaluateIrStrided(program.ir(), InputSizes(program), inputs, out, out_layout, out_dtype,
                      pool);
    return;
  }
  // index(k) reads one more int64 input: the coordinates along axis k.
  const expr::Program indexed = expr::IndexAsInputs(program);
  std::vector<StridedArray> all(inputs.begin(), inputs.end());
  std::vector<std::vector<int64_t>> coordinates;
  for (int64_t k : expr::IndexAxes(program.ir())) {
    const int axis = expr::ResolveIndexAxis(k, out_layout.ndim());
    assert(axis >= 0 && axis < out_layout.ndim());
    std::vector<int64_t>& axis_coordinates = coordinates.emplace_back(out_layout.shape[axis]);
    std::iota(axis_coordinates.begin(), axis_coordinates.end(), int64_t{0});
    all.push_back({axis_coordinates.data(), CoordinatesLayout(out_layout.shape, axis)});
  }
  EvaluateIrStrided(indexed.ir(), InputSizes(indexed), all, out, out_layout, out_dtype, pool);
}

}  // namespace gpucompute::cpu
