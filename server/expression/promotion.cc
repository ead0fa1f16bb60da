#include "server/expression/promotion.h"

#include <algorithm>
#include <charconv>
#include <type_traits>
#include <utility>

#include "server/expression/scalar_ops.h"

namespace gpucompute::expr::internal {
namespace {

template <typename T>
T Get(const ConstantValue& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v.i != 0;
  } else if constexpr (ops::kIsFloat<T>) {
    return static_cast<T>(v.f);
  } else {
    return static_cast<T>(v.i);
  }
}

template <typename T>
ConstantValue Put(T x) {
  ConstantValue c;
  if constexpr (ops::kIsFloat<T>) {
    c.f = x;
  } else {
    c.i = static_cast<int64_t>(x);
  }
  return c;
}

}  // namespace

ConstantValue ConvertConstant(const ConstantValue& v, DType from, DType to) {
  return VisitDType(from, [&](auto f) {
    using F = decltype(f);
    const F x = Get<F>(v);
    return VisitDType(to, [&](auto t) {
      using T = decltype(t);
      return Put<T>(ops::Convert<T>(x));
    });
  });
}

ConstantValue FoldUnary(OpKind op, DType dtype, const ConstantValue& a) {
  ConstantValue r;
  ops::VisitUnaryOp(op, [&](auto o) {
    using Op = decltype(o);
    VisitDType(dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (Op::template kAccepts<T>) r = Put(Op::Apply(Get<T>(a)));
    });
  });
  return r;
}

ConstantValue FoldBinary(OpKind op, DType dtype, const ConstantValue& a, const ConstantValue& b) {
  ConstantValue r;
  ops::VisitBinaryOp(op, [&](auto o) {
    using Op = decltype(o);
    VisitDType(dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (Op::template kAccepts<T>) r = Put(Op::Apply(Get<T>(a), Get<T>(b)));
    });
  });
  return r;
}

std::string FormatConstant(DType dtype, const ConstantValue& v) {
  char buf[64];
  std::to_chars_result r;
  switch (dtype) {
    case DType::kBool:
      return v.i != 0 ? "true" : "false";
    case DType::kInt32:
    case DType::kInt64:
      r = std::to_chars(buf, buf + sizeof(buf), v.i);
      break;
    case DType::kFloat32:
      r = std::to_chars(buf, buf + sizeof(buf), static_cast<float>(v.f));
      break;
    case DType::kFloat64:
    default:
      r = std::to_chars(buf, buf + sizeof(buf), v.f);
      break;
  }
  return std::string(buf, r.ptr);
}

DType PromoteStrong(DType a, DType b) {
  if (a == b) return a;
  if (a > b) std::swap(a, b);
  if (a == DType::kBool) return b;
  // An integer with float32: NumPy picks float64, which holds every int32 exactly.
  if (IsInteger(a) && b == DType::kFloat32) return DType::kFloat64;
  return b;
}

Promoted Promote(const Value& a, const Value& b) {
  if (a.weak && b.weak) return {std::max(a.dtype, b.dtype), true};
  if (!a.weak && !b.weak) return {PromoteStrong(a.dtype, b.dtype), false};
  const Value& strong = a.weak ? b : a;
  const Value& weak = a.weak ? a : b;
  switch (weak.dtype) {
    case DType::kBool:
      return {strong.dtype, false};
    case DType::kInt64:  // a Python int
      return {strong.dtype == DType::kBool ? DType::kInt64 : strong.dtype, false};
    default:  // a Python float
      return {IsFloat(strong.dtype) ? strong.dtype : DType::kFloat64, false};
  }
}

}  // namespace gpucompute::expr::internal
