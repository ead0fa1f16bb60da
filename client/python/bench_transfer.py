#!/usr/bin/env python3
"""Upload and download speed: the C++ CLI (`gpucompute put/get`) against this package.

    python3 client/python/bench_transfer.py --server 127.0.0.1:50051 \
        --cli build/client/gpucompute [--gib 1] [--rounds 3]

The clients take turns, round after round, so all see the same machine load. Figures
are GB/s (1e9 bytes/s): "wall" is the client's whole command or call, "server" the
server's TransferStats (first byte to last). The CLI reads and writes a .npy file
(from and to the page cache); Python puts the array from memory, and gets it into a new
array. Both stream over gRPC; the "python shm" rows, there when the server allows shared
memory and runs on this host (--allow-shared-memory), move the same arrays through
Python's shared-memory segment (sized to them in the warm-up round).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucompute  # noqa: E402


def run_cli(cli, server, *args):
    start = time.perf_counter()
    out = subprocess.run([cli, "--server", server, "--client", "bench", "--json", *args],
                         check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - start, json.loads(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=os.environ.get("GPUCOMPUTE_SERVER", "127.0.0.1:50051"))
    parser.add_argument("--cli", default="build/client/gpucompute")
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first and not counted")
    parser.add_argument("--chunk-mib", type=int, default=4)
    args = parser.parse_args()

    n = int(args.gib * (1 << 30)) // 8
    array = np.random.default_rng(0).standard_normal(n)
    nbytes = array.nbytes
    client = gpucompute.connect(args.server, client_name="bench",
                                chunk_bytes=args.chunk_mib << 20, progress=False)
    # (row prefix, transport) of the Python rows.
    python_rows = [("python", "grpc")]
    try:
        client.put(np.zeros(1), transport="shm").delete()
        python_rows.append(("python shm", "shm"))
    except gpucompute.FailedPreconditionError as error:
        print(f"no python shm rows: {error.details}", file=sys.stderr)
    keys = ["cli put", "cli get"] + [f"{prefix} {way}" for prefix, _ in python_rows
                                     for way in ("put", "get")]
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "x.npy")
        target = os.path.join(tmp, "y.npy")
        np.save(source, array)
        for round_ in range(args.warmup + args.rounds):
            if round_ in (0, args.warmup):
                results = {key: [] for key in keys}
            wall, out = run_cli(args.cli, args.server, "put", source, "--name", "cli-x",
                                "--transport=grpc")
            results["cli put"].append((nbytes / wall, float(out["transfer"]["gbps"]) * 1e9))
            wall, out = run_cli(args.cli, args.server, "get", "cli-x", "-o", target,
                                "--transport=grpc")
            results["cli get"].append((nbytes / wall, float(out["transfer"]["gbps"]) * 1e9))
            os.remove(target)
            client.delete("cli-x")

            for prefix, transport in python_rows:
                start = time.perf_counter()
                handle = client.put(array, name="py-x", transport=transport)
                wall = time.perf_counter() - start
                results[f"{prefix} put"].append((nbytes / wall, handle.transfer.gbps * 1e9))
                start = time.perf_counter()
                copy = handle.get(transport=transport)
                wall = time.perf_counter() - start
                results[f"{prefix} get"].append((nbytes / wall, handle.transfer.gbps * 1e9))
                assert np.array_equal(copy, array)
                del copy
                handle.delete()

    print(f"{nbytes / 2**30:.2f} GiB float64, {args.rounds} rounds, median (min-max) GB/s")
    for key, values in results.items():
        walls = [v[0] / 1e9 for v in values]
        servers = [v[1] / 1e9 for v in values]
        print(f"{key:14s} wall {statistics.median(walls):5.2f} ({min(walls):.2f}-{max(walls):.2f})"
              f"   server {statistics.median(servers):5.2f} "
              f"({min(servers):.2f}-{max(servers):.2f})")


if __name__ == "__main__":
    main()
