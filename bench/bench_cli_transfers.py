#!/usr/bin/env python3
"""One-shot `gpucompute put` / `get` / put + eval + get, per transport and size.

Each row is what a user typing the commands sees: a fresh CLI process per command, which
connects, chooses its transport, makes its shared-memory segment if it uses one, moves a
.npy file of N float64 values, and exits. The wall time is the median of --repeat runs
after one warm-up; the file is written once per size beforehand, so it is read from the
page cache.

The script starts a gpucompute-server with --allow-shared-memory on a free loopback port
(or uses --server TARGET), and prints one table: seconds, GB/s (the array's bytes over
the seconds; the workflow moves them twice), the ratio to the server's pinned
host-to-device copy (ServerInfo.host_to_device_gbps) where the server measured one, and
the ratio of the gRPC row's seconds to the row's (above 1: faster than gRPC).

Usage, from the build's parent directory:
  bench/bench_cli_transfers.py [--sizes=64MiB,256MiB,1GiB,2GiB] [--repeat=5]
      [--transports=grpc,shm,auto] [--ops=put,get,workflow] [--backend=auto]
      [--shm-segment=SIZE] [--server=HOST:PORT]
On a CPU machine, smaller sizes: --sizes=16MiB,64MiB --repeat=3.
"""
import argparse
import array
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
         "gb": 10**9, "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30,
         "gib": 2**30}


def parse_size(text):
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).lower() not in UNITS:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size such as 64MiB")
    size = int(match.group(1)) * UNITS[match.group(2).lower()]
    if size == 0 or size % 8:
        raise argparse.ArgumentTypeError(f"{text} is not a positive multiple of 8 bytes")
    return size


def format_size(size):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def write_npy(path, size):
    """A .npy file of size // 8 float64 values: a block of random ones, repeated."""
    n = size // 8
    header = f"{{'descr': '<f8', 'fortran_order': False, 'shape': ({n},), }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    rng = random.Random(1)
    block = array.array("d", (rng.uniform(-3, 3) for _ in range(1 << 17))).tobytes()
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode())
        left = size
        while left:
            chunk = block[:min(left, len(block))]
            f.write(chunk)
            left -= len(chunk)


class Cli:
    def __init__(self, binary, target):
        self.binary = binary
        self.target = target

    def run(self, *args, check=True):
        done = subprocess.run([self.binary, "--server", self.target, "--json", *args],
                              capture_output=True, text=True)
        if check and done.returncode != 0:
            raise RuntimeError(f"gpucompute {' '.join(args)}: exit {done.returncode}: "
                               f"{done.stderr.strip()}")
        return done

    def timed(self, *args):
        start = time.perf_counter()
        done = self.run(*args)
        return time.perf_counter() - start, done


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(binary, backend, memory_limit, log):
    port = free_port()
    server = subprocess.Popen(
        [binary, f"--listen=127.0.0.1:{port}", f"--backend={backend}", "--allow-shared-memory",
         f"--memory-limit={memory_limit}"], stdout=log, stderr=log)
    return server, f"127.0.0.1:{port}"


def wait_for_server(cli, server):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server is not None and server.poll() is not None:
            raise RuntimeError(f"the server exited ({server.returncode}); see its log")
        if cli.run("info", check=False).returncode == 0:
            return json.loads(cli.run("info").stdout)
        time.sleep(0.2)
    raise RuntimeError("the server did not answer within 60 s")


def transport_used(done):
    return json.loads(done.stdout.splitlines()[-1]).get("transport", "?")


def measure(cli, op, transport, path, out, repeat, extra):
    """Median seconds of `op` through `transport`, and the transport the CLI reported."""
    flags = ["--transport", transport, *extra]
    times = []
    used = "?"
    for r in range(repeat + 1):
        seconds = 0.0
        if op == "get":
            cli.run("put", path, "--name", "bench_x", "--transport", "grpc")
        if op in ("put", "workflow"):
            t, done = cli.timed("put", path, "--name", "bench_x", *flags)
            seconds += t
            used = transport_used(done)
        if op == "workflow":
            t, _ = cli.timed("eval", "x * 2 + 1", "x=bench_x", "--name", "bench_y")
            seconds += t
        if op in ("get", "workflow"):
            t, done = cli.timed("get", "bench_y" if op == "workflow" else "bench_x", "-o", out,
                                *flags)
            seconds += t
            used = transport_used(done)
            os.remove(out)
        cli.run("rm", "bench_x", *(["bench_y"] if op == "workflow" else []))
        if r > 0:
            times.append(seconds)
    return statistics.median(times), used


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64MiB,256MiB,1GiB,2GiB",
                        type=lambda t: [parse_size(s) for s in t.split(",")])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--transports", default="grpc,shm,auto")
    parser.add_argument("--ops", default="put,get,workflow")
    parser.add_argument("--shm-segment", help="passed to put and get (default: the CLI's)")
    parser.add_argument("--cli", default="build/client/gpucompute")
    parser.add_argument("--server-bin", default="build/server/gpucompute-server")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--server", help="use this running server instead of starting one")
    parser.add_argument("--dir", help="where the .npy files go (default: a new temp dir)")
    args = parser.parse_args()
    transports = args.transports.split(",")
    ops = args.ops.split(",")
    extra = ["--shm-segment", args.shm_segment] if args.shm_segment else []

    work = tempfile.mkdtemp(prefix="gpucompute_cli_bench_", dir=args.dir)
    server = None
    log = open(os.path.join(work, "server.log"), "w")
    try:
        target = args.server
        if target is None:
            # Room for the workflow's two buffers of the largest size, and some.
            limit = 2 * max(args.sizes) + (256 << 20)
            server, target = start_server(args.server_bin, args.backend, limit, log)
        cli = Cli(args.cli, target)
        info = wait_for_server(cli, server)
        h2d = float(info.get("host_to_device_gbps", 0) or 0)
        rows = []
        for size in args.sizes:
            path = os.path.join(work, "x.npy")
            write_npy(path, size)
            out = os.path.join(work, "out.npy")
            for op in ops:
                grpc_seconds = None
                for transport in transports:
                    seconds, used = measure(cli, op, transport, path, out, args.repeat, extra)
                    if transport == "grpc":
                        grpc_seconds = seconds
                    ways = 2 if op == "workflow" else 1
                    gbps = ways * size / seconds / 1e9
                    rows.append([op, format_size(size), transport, used, f"{seconds:.3f}",
                                 f"{gbps:.2f}", f"{gbps / h2d:.3f}" if h2d > 0 else "-",
                                 f"{grpc_seconds / seconds:.2f}" if grpc_seconds else "-"])
                    print(" ".join(rows[-1]), file=sys.stderr, flush=True)
            os.remove(path)
        print(f"server {target}, {info.get('backend', '?')} backend; pinned host-to-device "
              f"copy: {f'{h2d:.1f} GB/s' if h2d > 0 else 'not measured'}; one CLI process "
              f"per command, median of {args.repeat} after one warm-up"
              + (f"; --shm-segment={args.shm_segment}" if extra else ""))
        header = ["op", "size", "transport", "used", "seconds", "GB/s", "vs h2d", "vs grpc"]
        widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
        for row in [header] + rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        log.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
