#!/usr/bin/env python3
"""The workflow of gpucompute-bench's `workflow` rows, in-process with CuPy and Numba.

An array of N float64 values goes to the device, x * 2 + 1 runs on it, and the result
comes back; the time is the wall time of the three (median of --repeat, after a
warm-up), the number a user in one process would see. gpucompute-bench times the same
through the service (shared memory and gRPC), so run both on one host to compare.

Usage: bench_workflow.py [--log2n=26] [--repeat=5]. Prints one row per library it finds.
"""
import argparse
import time

import numpy as np


def median_seconds(f, repeat):
    f()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2n", type=int, default=26)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n = 1 << args.log2n
    x = np.random.default_rng(1).random(n)
    expected = x * 2 + 1
    rows = []
    try:
        import cupy

        def with_cupy():
            out = cupy.asnumpy(cupy.asarray(x) * 2 + 1)
            assert np.array_equal(out, expected)

        rows.append(("cupy", median_seconds(with_cupy, args.repeat)))
    except Exception as e:  # noqa: BLE001 - any failure leaves the other libraries' rows
        print(f"cupy: not timed ({type(e).__name__}: {e})")
    try:
        from numba import cuda

        @cuda.jit
        def kernel(a, out):
            i = cuda.grid(1)
            if i < a.size:
                out[i] = a[i] * 2 + 1

        def with_numba():
            d = cuda.to_device(x)
            out = cuda.device_array_like(d)
            kernel[(n + 255) // 256, 256](d, out)
            result = out.copy_to_host()
            assert np.array_equal(result, expected)

        rows.append(("numba", median_seconds(with_numba, args.repeat)))
    except Exception as e:  # noqa: BLE001
        print(f"numba: not timed ({type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''})")
    print(f"workflow in-process: {n} float64 up, x * 2 + 1, down; median of {args.repeat}")
    print(f"{'library':<10}{'ms':>12}{'GB/s one way':>16}")
    for name, seconds in rows:
        print(f"{name:<10}{seconds * 1e3:>12.3f}{n * 8 / seconds / 1e9:>16.3f}")


if __name__ == "__main__":
    main()
