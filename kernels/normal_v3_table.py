#!/usr/bin/env python3
"""Writes kernels/normal_v3_table.h: the coefficients of normal transform v3 (float32).

Transform v3 maps one 32-bit Philox word w to a standard normal by inverting the normal
CDF (kernels/philox.h has the definition). The word's top bit is the sign; the other 31
give the odd number B = ~(2w) mod 2^32 and the tail probability t = B 2^-33 in (0, 1/2),
whose magnitude is Q(t) = -Phi^-1(t). B's float32 rounded toward zero names one of 512
segments (its binary exponent and the next four bits); within a segment, Q is a cubic in
X = float32(((2w + 1) mod 2^32) << (clz(B) + 5)), the offset from the segment's edge
nearest the centre, scaled to [0, 2^32). The segment around t = 1/2 has no constant term,
so values near zero keep their relative accuracy.

Each cubic interpolates Q at four Chebyshev nodes of the segment's X range (at its members
themselves where it has four or fewer), with Q computed in 100-digit decimal arithmetic
(the Python standard library only), and each coefficient is that exact value rounded once
to float32. The header is checked in: its numbers define the transform's bits, so
regenerating it must give the same file (the test normal_v3_table_current checks that).

Usage: kernels/normal_v3_table.py > kernels/normal_v3_table.h
"""
from decimal import ROUND_HALF_EVEN, Decimal, getcontext
from fractions import Fraction
import statistics
import struct

getcontext().prec = 100
SEGMENT_BITS = 4
DEGREE = 3


def pi():
    """pi to the context's precision: Gauss-Legendre."""
    getcontext().prec += 10
    a, b, t, p = Decimal(1), Decimal(1) / Decimal(2).sqrt(), Decimal(1) / 4, Decimal(1)
    for _ in range(9):
        a, b, t, p = (a + b) / 2, (a * b).sqrt(), t - p * ((a - b) / 2) ** 2, 2 * p
    getcontext().prec -= 10
    return +((a + b) ** 2 / (4 * t))


PI = pi()
SQRT_2PI = (2 * PI).sqrt()


def density(x):
    return (-(x * x) / 2).exp() / SQRT_2PI


def upper_tail(x):
    """1 - Phi(x) for x >= 0: 1/2 - phi(x) (x + x^3/3 + x^5/(3 5) + ...), a series of
    positive terms; 100 digits leave over 85 after the cancellation for every x used here
    (t >= 2^-33)."""
    term, total, k = x, x, 1
    while True:
        k += 2
        term = term * x * x / k
        total += term
        if term < total * Decimal("1e-105"):
            break
    return Decimal(1) / 2 - density(x) * total


def magnitude(t):
    """Q(t) = -Phi^-1(t) for t in (0, 1/2): Newton's method from the float64 value."""
    x = Decimal(-statistics.NormalDist().inv_cdf(float(t)))
    for _ in range(60):
        step = (upper_tail(x) - t) / density(x)
        x += step
        if abs(step) < Decimal("1e-80"):
            return x
    raise RuntimeError("Newton's method did not converge for t = %s" % t)


def to_float32(value):
    """value rounded once, to nearest even, to a float32 (normal range only); as a float."""
    if value == 0:
        return 0.0
    sign = -1 if value < 0 else 1
    mag = abs(value)
    exponent = mag.adjusted() * 3322 // 1000 - 2  # a power of two at or below the value
    while Decimal(2) ** (exponent + 1) <= mag:
        exponent += 1
    while Decimal(2) ** exponent > mag:
        exponent -= 1
    if exponent < -126:
        raise ValueError("coefficient %s is below float32's normal range" % value)
    mantissa = (mag / Decimal(2) ** (exponent - 23)).quantize(Decimal(1), rounding=ROUND_HALF_EVEN)
    result = sign * float(int(mantissa)) * 2.0 ** (exponent - 23)
    assert struct.unpack("f", struct.pack("f", result))[0] == result
    return result


def interpolate(xs, ys):
    """The coefficients, low degree first, of the polynomial through (xs[i], ys[i])."""
    n = len(xs)
    rows = [[x ** j for j in range(n)] + [y] for x, y in zip(xs, ys)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(n):
            if r != col:
                f = rows[r][col] / rows[col][col]
                rows[r] = [a - f * b for a, b in zip(rows[r], rows[col])]
    return [rows[i][n] / rows[i][i] for i in range(n)]


def chebyshev_nodes(lo, hi, count):
    """count Chebyshev points of the first kind in [lo, hi] (cosines from the series)."""
    nodes = []
    for i in range(count):
        angle = PI * (2 * i + 1) / (2 * count)
        getcontext().prec += 10
        cos, term, k = Decimal(1), Decimal(1), 0
        while abs(term) > Decimal("1e-110"):
            k += 2
            term = -term * angle * angle / (k * (k - 1))
            cos += term
        getcontext().prec -= 10
        nodes.append((lo + hi) / 2 + (hi - lo) / 2 * +cos)
    return sorted(nodes)


def segment(octave, top):
    """[c0, c1, c2, c3] for B with floor(log2 B) = octave and next four bits `top`."""
    width_bits = max(octave - SEGMENT_BITS, 0)   # s: the bits below the segment's name
    if octave >= SEGMENT_BITS:
        lo = (1 << octave) + (top << width_bits)
    else:
        if top & ((1 << (SEGMENT_BITS - octave)) - 1):
            return [0.0] * (DEGREE + 1)           # not a float32 of a B this small
        lo = (1 << octave) + (top >> (SEGMENT_BITS - octave))
    members = list(range(lo | 1, lo + (1 << width_bits), 2)[: DEGREE + 2])
    if not members:
        return [0.0] * (DEGREE + 1)               # B is odd: no member
    shift = 36 - octave                           # clz(B) + 5
    if shift >= 32 or len(members) == 1:
        return [to_float32(magnitude(Decimal(members[0]) / Decimal(2) ** 33))] + [0.0] * DEGREE

    # X = (lo + 2^s - B) 2^shift; scale it to u = X 2^-32 in (0, 1) for the solve.
    def t_of(u):
        return (lo + (1 << width_bits) - u * Decimal(2) ** width_bits) / Decimal(2) ** 33

    # At the centre Q vanishes at u = 0: there the cubic interpolates Q / u, and c0 = 0.
    centre = lo + (1 << width_bits) == 1 << 32
    if len(members) <= DEGREE + 1:                # through the members themselves
        us = [Decimal(lo + (1 << width_bits) - b) / Decimal(2) ** width_bits for b in members]
    else:
        step = Decimal(1) / Decimal(2) ** (width_bits - 1)   # members' spacing in u
        us = chebyshev_nodes(step / 2, 1 - step / 2, DEGREE if centre else DEGREE + 1)
    if centre:
        coefficients = [Decimal(0)] + interpolate(us, [magnitude(t_of(u)) / u for u in us])
    else:
        coefficients = interpolate(us, [magnitude(t_of(u)) for u in us])
    coefficients += [Decimal(0)] * (DEGREE + 1 - len(coefficients))
    return [to_float32(c / Decimal(2) ** (32 * i)) for i, c in enumerate(coefficients)]


def literal(value):
    """A C++ float literal that reads back exactly: hexadecimal, trailing zeros dropped."""
    if value == 0:
        return "0.0f"
    mantissa, exponent = float.hex(value).split("p")
    return "%sp%sf" % (mantissa.rstrip("0").rstrip("."), exponent)


def main():
    lines = [
        "// Generated by kernels/normal_v3_table.py; do not edit. The coefficients of normal",
        "// transform v3 in float32 (kernels/philox.h defines the transform): row",
        "// (e << 4) | m for B's binary exponent e and the four bits m below its leading one;",
        "// c0 + X (c1 + X (c2 + X c3)).",
        "#ifndef GPUCOMPUTE_KERNELS_NORMAL_V3_TABLE_H_",
        "#define GPUCOMPUTE_KERNELS_NORMAL_V3_TABLE_H_",
        "",
        "namespace gpucompute {",
        "",
        "inline constexpr int kNormalV3Segments = 512;",
        "",
        "// alignas(16): a row is one 16-byte load.",
        "struct alignas(16) NormalV3Row {",
        "  float c[4];",
        "};",
        "",
        "// The rows, each commented with its exponent e - 127 and m.",
        "#define GPUCOMPUTE_NORMAL_V3_ROWS \\",
    ]
    for octave in range(32):
        for top in range(16):
            row = segment(octave, top)
            lines.append("  {{%s}}, /* %d.%d */ \\" % (", ".join(literal(c) for c in row), octave, top))
    lines[-1] = lines[-1][: -len(" \\")]
    lines += ["", "}  // namespace gpucompute", "", "#endif  // GPUCOMPUTE_KERNELS_NORMAL_V3_TABLE_H_"]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
