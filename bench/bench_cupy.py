#!/usr/bin/env python3
"""CuPy's speed on the operations of gpucompute-bench's kernel table, for comparison.

Run on a GPU machine with CuPy installed:  python3 bench/bench_cupy.py [log2n]
Prints device time (median of 10, CUDA events) and the ratio to CuPy's own
device-to-device copy in the same run, bytes counted as gpucompute-bench counts them.
Where PyTorch is installed, its random fills (Philox and Box-Muller) get rows too.
"""
import sys

import cupy as cp
import numpy as np

try:
    import torch  # only for its random rows, where installed
except ImportError:
    torch = None


def median_ms(f, repeat=10):
    f()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(repeat):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        f()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return sorted(times)[repeat // 2]


@cp.fuse()
def reference_expression(x):
    return cp.sqrt(cp.abs(cp.exp(-cp.sin(x * x)) / (cp.sqrt(cp.abs(x)) * cp.tanh(x))))


def main():
    n = 1 << (int(sys.argv[1]) if len(sys.argv) > 1 else 28)
    print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "cupy", cp.__version__, "n", n)
    for dtype in (np.float64, np.float32):
        item = np.dtype(dtype).itemsize
        x = cp.random.standard_normal(n, dtype=dtype)
        y = cp.random.uniform(size=n).astype(dtype)
        z = cp.empty_like(x)
        copy_ms = median_ms(lambda: cp.copyto(z, x))
        copy_gbs = 2 * n * item / copy_ms / 1e6
        print(f"\n{np.dtype(dtype).name}: copy {copy_ms:.3f} ms, {copy_gbs:.0f} GB/s")

        def row(name, f, nbytes):
            ms = median_ms(f)
            gbs = nbytes / ms / 1e6
            print(f"  {name:24s} {ms:8.3f} ms {gbs:7.0f} GB/s  {gbs / copy_gbs:.3f} of copy")

        row("x + y", lambda: cp.add(x, y, out=z), 3 * n * item)
        row("sum", lambda: cp.sum(x), n * item)
        row("max", lambda: cp.max(x), n * item)
        row("norm2 (cp.linalg.norm)", lambda: cp.linalg.norm(x), n * item)
        row("expr (cp.fuse)", lambda: reference_expression(x), 2 * n * item)
        legacy = cp.random.RandomState(3)
        generator = cp.random.default_rng(3)
        row("uniform (RandomState)", lambda: legacy.uniform(size=n, dtype=dtype), n * item)
        row("normal (RandomState)", lambda: legacy.standard_normal(size=n, dtype=dtype), n * item)
        row("normal (default_rng)", lambda: generator.standard_normal(size=n, dtype=dtype), n * item)
        if torch is not None:
            # PyTorch's CUDA generator: Philox4x32-10 and Box-Muller, as gpucompute's.
            out = torch.as_tensor(z, device="cuda")
            row("normal (torch.randn)", lambda: torch.randn(n, dtype=out.dtype, device="cuda", out=out),
                n * item)
            row("uniform (torch.rand)", lambda: torch.rand(n, dtype=out.dtype, device="cuda", out=out),
                n * item)
            del out
        del x, y, z
        for m in (16384, 32768):
            a = cp.random.uniform(size=(m, m)).astype(dtype)
            v = cp.random.uniform(size=m).astype(dtype)
            row(f"gemv {m} A @ x", lambda: a @ v, m * m * item)
            row(f"gemv {m} A.T @ x", lambda: a.T @ v, m * m * item)
            del a

    arrays_matmul()


def arrays_matmul(n=8192):
    """cupy.matmul's GFLOP/s for gpucompute-bench's matmul rows (arrays section): n x n
    float64, float32, and float32 with TF32, CuPy's float32 compute type that CUPY_TF32=1
    selects (set here through the same setting, so that one process runs all three)."""
    from cupy._core import _routines_linalg as linalg

    print(f"\nmatmul {n}x{n}, cupy.matmul")
    flops = 2.0 * n**3
    for name, dtype, tf32 in (("float64", np.float64, False), ("float32", np.float32, False),
                              ("float32 TF32", np.float32, True)):
        linalg.set_compute_type(
            np.float32, linalg.COMPUTE_TYPE_TF32 if tf32 else linalg.COMPUTE_TYPE_DEFAULT)
        a = cp.random.uniform(-1, 1, size=(n, n)).astype(dtype)
        b = cp.random.uniform(-1, 1, size=(n, n)).astype(dtype)
        c = cp.empty_like(a)
        ms = median_ms(lambda: cp.matmul(a, b, out=c))
        print(f"  {name:14s} {ms:9.3f} ms {flops / ms / 1e6:9.0f} GFLOP/s")
        del a, b, c
    linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_DEFAULT)


def arrays_elementwise(log2n=28):
    """The arrays section's elementwise rows: x - m with m broadcast against float32 x of
    (2^(log2n-15), 32768), against CuPy's copy; an operation on x.T and on x[:, ::2]
    against the same on contiguous data."""
    rows, cols = 1 << max(0, log2n - 15), 32768
    x = cp.ones((rows, cols), dtype=cp.float32)
    z = cp.empty_like(x)
    copy_ms = median_ms(lambda: cp.copyto(z, x))
    copy_gbs = 2 * x.nbytes / copy_ms / 1e6
    print(f"\narrays elementwise, float32 ({rows}, {cols}): copy {copy_ms:.3f} ms, "
          f"{copy_gbs:.0f} GB/s")
    for what, m in (("x - m, m (n,1)", cp.full((rows, 1), 0.5, cp.float32)),
                    ("x - m, m (1,m)", cp.full((1, cols), 0.5, cp.float32)),
                    ("x - m, m 0-d", cp.full((), 0.5, cp.float32))):
        ms = median_ms(lambda: cp.subtract(x, m, out=z))
        gbs = 2 * x.nbytes / ms / 1e6
        print(f"  {what:24s} {ms:8.3f} ms {gbs:7.0f} GB/s  {gbs / copy_gbs:.3f} of copy")

    @cp.fuse()
    def op(v):
        return v * 2 + 1

    contiguous_ms = median_ms(lambda: op(x))
    for what, view, same in (("x.T * 2 + 1", x.T, x),
                             ("x[:, ::2] * 2 + 1", x[:, ::2], x.reshape(-1)[: x.size // 2])):
        ms = median_ms(lambda: op(view))
        base_ms = contiguous_ms if same is x else median_ms(lambda: op(same))
        print(f"  {what:24s} {ms:8.3f} ms  {base_ms / ms:.3f} of contiguous ({base_ms:.3f} ms)")


def arrays_reduce(log2n=28):
    """The arrays section's reduction rows (bench/arrays_reduce.cc), as CuPy runs them."""
    n = 1 << log2n
    x = cp.random.uniform(size=n, dtype=np.float32)
    y = cp.random.uniform(size=n, dtype=np.float32)
    z = cp.empty_like(x)
    copy_ms = median_ms(lambda: cp.copyto(z, x))
    copy_gbs = 2 * n * 4 / copy_ms / 1e6
    print(f"\narrays reduce, float32: copy {copy_ms:.3f} ms, {copy_gbs:.0f} GB/s")

    def row(name, f, nbytes):
        ms = median_ms(f)
        gbs = nbytes / ms / 1e6
        print(f"  {name:34s} {ms:8.3f} ms {gbs:7.0f} GB/s  {gbs / copy_gbs:.3f} of copy")

    # cupy.sum(x*y) writes x*y to a temporary and reads it back: two passes.
    row(f"sum(x*y) 2^{log2n}", lambda: cp.sum(x * y), 2 * n * 4)
    del y, z
    cube = x.reshape(max(1, n >> 18), 1024, 256)
    for axis in (-1, 0, 1):
        row(f"sum axis {axis} {cube.shape}", lambda: cp.sum(cube, axis=axis), n * 4)
    row(f"var axis -1 {cube.shape}", lambda: cp.var(cube, axis=-1), n * 4)


if __name__ == "__main__":
    main()
    arrays_elementwise(int(sys.argv[1]) if len(sys.argv) > 1 else 28)
    arrays_reduce(int(sys.argv[1]) if len(sys.argv) > 1 else 28)
