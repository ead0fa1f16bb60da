"""NumPy's ufuncs as the server's expression language has them (docs/expressions.md), and
the result dtypes the server gives (NEP 50), so that an expression's dtype, shape and
type errors are known at the line that builds it, before anything is sent.

A type is a NumPy dtype (a strong value: an array, a NumPy scalar, a 0-d array) or one of
"bool", "int", "float" (a weak Python scalar, which takes an array's dtype of its kind).
"""

import functools

import numpy as np

_WEAK = ("bool", "int", "float")
_FLOAT64 = np.dtype(np.float64)
_INT64 = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)
# What a weak result becomes as an array.
WEAK_DTYPES = {"bool": BOOL, "int": _INT64, "float": _FLOAT64}

# How each function's result dtype follows from its arguments' promoted type:
#   arith: the promoted type; bools refused;    div: as arith, integers give float64;
#   float: integers give float64 (bools refused); same: the promoted type (any dtype);
#   bool: bool;                                  bits: integers and bools only;
#   shift: integers only.
# ufunc name -> (the expression's function, number of arguments, rule).
UFUNCS = {name: (name, 1, "float") for name in (
    "sin", "cos", "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "arcsinh",
    "arccosh", "arctanh", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt",
    "cbrt", "floor", "ceil", "rint", "trunc", "degrees", "radians", "rad2deg", "deg2rad")}
UFUNCS.update({name: (name, 1, "arith") for name in (
    "negative", "positive", "absolute", "sign", "square", "reciprocal")})
UFUNCS.update({name: (name, 1, "bool") for name in (
    "isnan", "isinf", "isfinite", "signbit", "logical_not")})
UFUNCS.update({name: (name, 2, "arith") for name in (
    "add", "subtract", "multiply", "floor_divide", "remainder", "fmod", "power")})
UFUNCS.update({name: (name, 2, "div") for name in ("true_divide", "divide")})
UFUNCS.update({name: (name, 2, "float") for name in ("arctan2", "hypot", "copysign")})
UFUNCS.update({name: (name, 2, "same") for name in ("maximum", "minimum", "fmax", "fmin")})
UFUNCS.update({name: (name, 2, "bool") for name in (
    "less", "less_equal", "greater", "greater_equal", "equal", "not_equal", "logical_and",
    "logical_or", "logical_xor")})
UFUNCS.update({name: (name, 2, "bits") for name in ("bitwise_and", "bitwise_or",
                                                     "bitwise_xor")})
UFUNCS.update({name: (name, 2, "shift") for name in ("left_shift", "right_shift")})
UFUNCS["invert"] = ("invert", 1, "bits")
UFUNCS["mod"] = ("remainder", 2, "arith")
UFUNCS["abs"] = ("absolute", 1, "arith")
# Functions that are not ufuncs in NumPy (np.clip, np.round): for their dtypes only.
UFUNCS["clip"] = ("clip", 3, "same")
UFUNCS["round"] = ("round", 1, "arith")

# Python's operators, written as operators in the expression.
OPERATORS = {"add": "+", "subtract": "-", "multiply": "*", "true_divide": "/",
             "divide": "/", "floor_divide": "//", "remainder": "%", "power": "**",
             "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^", "left_shift": "<<",
             "right_shift": ">>", "less": "<", "less_equal": "<=", "greater": ">",
             "greater_equal": ">=", "equal": "==", "not_equal": "!="}


def is_weak(kind):
    return isinstance(kind, str)


def promote(*types):
    """NEP 50 promotion over bool < int32 < int64 < float32 < float64 and weak scalars."""
    strong = [t for t in types if not is_weak(t)]
    weak = [t for t in types if is_weak(t)]
    widest_weak = max(weak, key=_WEAK.index) if weak else None
    if not strong:
        return widest_weak
    result = strong[0]
    for dtype in strong[1:]:
        result = np.promote_types(result, dtype)
    if widest_weak == "float" and result.kind in "biu":
        return _FLOAT64
    if widest_weak == "int" and result.kind == "b":
        return _INT64
    return result


def _kind(t):
    if is_weak(t):
        return {"bool": "b", "int": "i", "float": "f"}[t]
    return t.kind


def _unsupported(name, types):
    names = ", ".join(str(t) if not is_weak(t) else f"Python {t}" for t in types)
    return TypeError(f"ufunc '{name}' not supported for the input types ({names})")


def result_type(name, types):
    """The dtype (or weak kind) of ufunc `name` of arguments of `types`, as the server
    gives it; TypeError where the server refuses the types."""
    return _result_type(name, tuple(types))


# Every operator of the array layer asks this; a loop asks the same few questions.
@functools.lru_cache(maxsize=4096)
def _result_type(name, types):
    _, _, rule = UFUNCS[name]
    promoted = promote(*types)
    kind = _kind(promoted)
    if rule == "bool":
        return BOOL
    if rule == "same":
        return promoted
    if rule in ("bits", "shift"):
        if kind == "f" or (rule == "shift" and kind == "b"):
            raise _unsupported(name, types)
        return promoted
    if kind == "b" or any(not is_weak(t) and t.kind == "b" for t in types):
        # NumPy computes these in int8 or float16, dtypes the server does not have.
        raise TypeError(f"ufunc '{name}' of a bool array: the server has no arithmetic on "
                        "bools; convert first (x.astype('int64') or where(x, 1, 0))")
    if rule == "arith" or kind == "f":
        return promoted
    return "float" if is_weak(promoted) else _FLOAT64


def weak_kind(value):
    """The weak kind of a Python scalar, else None (NumPy's float64 is a Python float,
    but strong)."""
    if isinstance(value, np.generic):
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return None


def scalar_dtype(value):
    """The strong dtype of a NumPy scalar the server has, else None."""
    if isinstance(value, np.generic):
        dtype = value.dtype
        if dtype in (BOOL, np.dtype(np.int32), _INT64, np.dtype(np.float32), _FLOAT64):
            return dtype
        raise TypeError(f"gpucompute has no {dtype} values; it has float32, float64, int32, "
                        "int64 and bool")
    return None
