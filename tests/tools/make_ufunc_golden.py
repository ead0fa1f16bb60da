#!/usr/bin/env python3
"""Writes tests/testdata/ufunc_special_values.txt: NumPy's results of the expression
language's math functions over special values, for tests/backend/ufunc_special_values_test.cc.

Usage: python3 tests/tools/make_ufunc_golden.py [output path]   (needs numpy)

The file is text. A case starts with a line
    case <expression> <argument dtypes, comma-separated> -> <result dtype>
whose expression names its arguments x, y and z, followed by one line per element:
the arguments' bits and then the result's bits, in hexadecimal (bools as 0 or 1).
Lines starting with '#' are comments.

Unary functions run over every special value of their dtype (NaN, +-inf, +-0, the
smallest subnormals, the largest finite values, +-1, +-0.5, +-2.5, pi, large arguments;
for integers 0, +-1, +-2, the extremes and the shift amounts around the width); binary
functions over the cross product of a smaller set. Float to integer casts leave out NaN,
infinities and values out of the integer's range, whose results NumPy leaves to the CPU.
"""

import itertools
import math
import sys
import warnings

import numpy as np

DTYPES = {
    "bool": np.bool_,
    "int32": np.int32,
    "int64": np.int64,
    "float32": np.float32,
    "float64": np.float64,
}
INTS = ["int32", "int64"]
FLOATS = ["float32", "float64"]
NUMBERS = INTS + FLOATS
ALL = ["bool"] + NUMBERS
INTS_AND_BOOL = ["bool"] + INTS


def float_values(name, small):
    t = np.dtype(name).type
    info = np.finfo(name)
    tiny_sub = np.nextafter(t(0), t(1))
    values = [np.nan, np.inf, -np.inf, 0.0, -0.0, tiny_sub, -tiny_sub, 1.0, -1.0, 2.5, -2.5,
              info.max, math.pi]
    if not small:
        values += [2 * tiny_sub, info.tiny, -info.tiny, info.tiny - tiny_sub, -info.max, 0.5,
                   -0.5, 1.5, -1.5, 3.5, -math.pi, 1e10, -1e10, 1e30, 0.1, 100.0, 1e-5,
                   float(info.max) / 4]
    return np.array(values, dtype=name)


def int_values(name, small):
    info = np.iinfo(name)
    width = info.bits
    values = [0, 1, -1, 2, -2, 7, -7, info.min, info.max, width - 1, width, width + 1]
    if not small:
        values += [3, -3, 10, -15, 15, 25, -25, 1234567, info.min + 1, info.max - 1]
    return np.array(values, dtype=name)


def values(name, small=False):
    if name == "bool":
        return np.array([False, True])
    if name in FLOATS:
        return float_values(name, small)
    return int_values(name, small)


def bits(array):
    if array.dtype == np.bool_:
        return ["1" if v else "0" for v in array]
    width = array.dtype.itemsize
    unsigned = {4: np.uint32, 8: np.uint64}[width]
    return ["%x" % v for v in array.view(unsigned)]


def write_case(out, expression, arg_dtypes, args, result):
    result = np.asarray(result)
    out.write("case %s %s -> %s\n" % (expression, ",".join(arg_dtypes), result.dtype.name))
    columns = [bits(a) for a in args] + [bits(result)]
    for row in zip(*columns):
        out.write(" ".join(row) + "\n")


def unary(out, expression, fn, dtypes, in_range=False):
    for name in dtypes:
        x = values(name)
        result = fn(x)
        if in_range and name in INTS:
            # Integer round() with decimals < 0 goes through float64 and back; where the
            # rounded value leaves the integer's range, NumPy's cast is the CPU's.
            info = np.iinfo(name)
            rounded = np.round(x.astype(np.float64), int(expression.split(",")[1][:-1]))
            keep = (rounded >= float(info.min)) & (rounded < -float(info.min))
            x, result = x[keep], result[keep]
        write_case(out, expression, [name], [x], result)


def binary(out, expression, fn, dtypes):
    for name in dtypes:
        small = values(name, small=True)
        pairs = list(itertools.product(small, small))
        x = np.array([p[0] for p in pairs], dtype=name)
        y = np.array([p[1] for p in pairs], dtype=name)
        write_case(out, expression, [name, name], [x, y], fn(x, y))


def clip(out):
    for name in NUMBERS:
        x = values(name, small=True)
        bounds = [(-1, 1), (0, 2), (1, -1)]
        if name in FLOATS:
            bounds += [(np.nan, 1), (-1, np.nan), (-np.inf, np.inf)]
        xs, los, his = [], [], []
        for lo, hi in bounds:
            xs += list(x)
            los += [lo] * len(x)
            his += [hi] * len(x)
        xs, los, his = (np.array(v, dtype=name) for v in (xs, los, his))
        write_case(out, "clip(x, y, z)", [name] * 3, [xs, los, his], np.clip(xs, los, his))


def casts(out):
    for source in ALL:
        x = values(source)
        for target in ALL:
            keep = np.ones(len(x), dtype=bool)
            if source in FLOATS and target in INTS:
                info = np.iinfo(target)
                with np.errstate(invalid="ignore"):
                    # Exactly representable bounds: -2^(bits-1) <= x < 2^(bits-1).
                    keep = np.isfinite(x) & (x >= float(info.min)) & (x < -float(info.min))
            kept = x[keep]
            write_case(out, "%s(x)" % target, [source], [kept], kept.astype(target))


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/testdata/ufunc_special_values.txt"
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    with open(path, "w") as out:
        out.write("# NumPy %s's results; made by tests/tools/make_ufunc_golden.py.\n"
                  % np.__version__)
        for name in ["rint", "trunc", "exp2", "log2", "log10", "cbrt", "degrees", "radians",
                     "arcsinh", "arccosh", "arctanh"]:
            unary(out, name + "(x)", getattr(np, name), NUMBERS)
        unary(out, "round(x)", np.round, NUMBERS)
        for d in [-2, -1, 1, 2, 5]:
            unary(out, "round(x, %d)" % d, lambda x, d=d: np.round(x, d), NUMBERS, d < 0)
        for name in ["sign", "square", "reciprocal"]:
            unary(out, name + "(x)", getattr(np, name), NUMBERS)
        for name in ["isnan", "isinf", "isfinite", "signbit", "logical_not"]:
            unary(out, name + "(x)", getattr(np, name), ALL)
        unary(out, "invert(x)", np.invert, INTS_AND_BOOL)
        for name in ["floor_divide", "remainder", "fmod"]:
            binary(out, name + "(x, y)", getattr(np, name), NUMBERS)
        for name in ["hypot", "copysign"]:
            binary(out, name + "(x, y)", getattr(np, name), NUMBERS)
        for name in ["maximum", "minimum", "fmax", "fmin", "logical_and", "logical_or",
                     "logical_xor"]:
            binary(out, name + "(x, y)", getattr(np, name), ALL)
        for name in ["bitwise_and", "bitwise_or", "bitwise_xor"]:
            binary(out, name + "(x, y)", getattr(np, name), INTS_AND_BOOL)
        for name in ["left_shift", "right_shift"]:
            binary(out, name + "(x, y)", getattr(np, name), INTS)
        clip(out)
        casts(out)


if __name__ == "__main__":
    main()
