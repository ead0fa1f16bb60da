#!/usr/bin/env python3
"""Times gpucompute-server from exec to its "listening on port N" line on stderr.

    tests/server/startup_time.py [--runs 20] [--server build/server/gpucompute-server] [-- FLAGS...]

Each run starts the server on a free loopback port (CPU backend unless FLAGS say
otherwise), reads its stderr until the listening line, stops it with SIGTERM and checks
that it exits 0. Prints the median, minimum and maximum in milliseconds.
"""
import argparse
import signal
import statistics
import subprocess
import sys
import time


def one_run(server, flags):
    start = time.perf_counter()
    proc = subprocess.Popen([server, "--listen=127.0.0.1:0", *flags], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "listening on port " in line:
            elapsed = time.perf_counter() - start
            break
    else:
        proc.wait()
        sys.exit(f"the server exited ({proc.returncode}) without listening:\n{''.join(seen)}")
    proc.send_signal(signal.SIGTERM)
    proc.stderr.read()
    if proc.wait(timeout=30) != 0:
        sys.exit(f"the server exited with {proc.returncode} after SIGTERM")
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--server", default="build/server/gpucompute-server")
    parser.add_argument("flags", nargs="*", help="server flags (default --backend=cpu)")
    args = parser.parse_args()
    flags = args.flags or ["--backend=cpu"]
    times = [one_run(args.server, flags) * 1e3 for _ in range(args.runs)]
    print(f"exec to listening, {args.runs} runs, {' '.join(flags)}: median {statistics.median(times):.1f} ms, "
          f"min {min(times):.1f} ms, max {max(times):.1f} ms")


if __name__ == "__main__":
    main()
