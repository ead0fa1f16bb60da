#!/usr/bin/env python3
"""Small operations from one Python thread: `x = x + 1` on 1024 float32 values.

    python3 client/python/bench_ops.py --target 127.0.0.1:50051 [--ops 20000]

Five ways, each --ops operations and each checked against NumPy at the end:
  submit       Client.eval(wait=True): one Submit round trip per operation
  futures      Client.eval(wait=False): futures, one Submit call in flight at a time
  session      Session.eval, one operation per line, each reading the previous one's
               output by its tag (new temporaries, deleted when the session ends)
  chain        a 100-step Chain (x+1 through temporaries, the last step into x) run
               again and again: prepared from its second run on
  aio-session  the session way through the asyncio client
  numpy        `x = x + 1` on a RemoteArray: the client fuses up to 32 steps into one
               kernel (gpucompute._lazy.MAX_DEPTH) and sends it through its session
  numpy-eager  the same, each line forced with .compute(): one kernel per operation,
               through the session
  program      `y = step(y)` with step = gpucompute.program(lambda v: v + 1): one
               RunChain call a run, in place in the program's output, prepared from the
               third run on (the first reads x)
The first two write x in place (a new buffer per operation would pile up on the
server). "ops/s" counts operations over the loop and the wait for the last answer.

--backend-independent adds what does not depend on the server's backend: the client's
own CPU time per operation (this process, all its threads: building, serializing,
sending, reading and matching answers).
"""

import argparse
import asyncio
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucompute  # noqa: E402
import gpucompute.aio  # noqa: E402

N = 1024
CHAIN_STEPS = 100


def by_submit(client, x, ops):
    for _ in range(ops):
        client.eval("x + 1", x=x, out=x)
    return x.get()


def by_futures(client, x, ops):
    futures = [client.eval("x + 1", x=x, out=x, wait=False) for _ in range(ops)]
    futures[-1].result()
    return x.get()


def by_session(client, x, ops):
    with client.session() as session:
        h = x
        for _ in range(ops):
            h = session.eval("x + 1", x=h)
        return h.array().get()


def by_chain(client, x, ops):
    chain = client.chain()
    h = x
    for step in range(CHAIN_STEPS):
        h = chain.eval("x + 1", x=h, out=x if step == CHAIN_STEPS - 1 else None)
    for _ in range(ops // CHAIN_STEPS):
        chain.run()
    return x.get()


def by_aio_session(client, x, ops):
    async def run():
        async with gpucompute.aio.connect(client.options.target, client_name="bench-ops",
                                          progress=False) as aio_client:
            async with aio_client.session() as session:
                h = x.id
                for _ in range(ops):
                    h = await session.eval("x + 1", x=h)
                return await (await h.array()).get()

    return asyncio.run(run())


def by_numpy(client, x, ops):
    y = x
    for _ in range(ops):
        y = y + 1
    return y.get()


def by_numpy_eager(client, x, ops):
    y = x
    for _ in range(ops):
        y = (y + 1).compute()
    return y.get()


def by_program(client, x, ops):
    step = gpucompute.program(lambda v: v + 1)
    y = x
    for _ in range(ops):
        y = step(y)
    return y.get()


WAYS = {"submit": by_submit, "futures": by_futures, "session": by_session, "chain": by_chain,
        "aio-session": by_aio_session, "numpy": by_numpy, "numpy-eager": by_numpy_eager,
        "program": by_program}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=os.environ.get("GPUCOMPUTE_SERVER", "127.0.0.1:50051"),
                        help="the server, host:port")
    parser.add_argument("--ops", type=int, default=20000, help="operations per way")
    parser.add_argument("--ways", default=",".join(WAYS), help="a comma-separated subset")
    parser.add_argument("--backend-independent", action="store_true",
                        help="add the client's CPU time per operation")
    args = parser.parse_args()
    ways = args.ways.split(",")
    unknown = sorted(set(ways) - set(WAYS))
    if unknown:
        parser.error(f"unknown ways {', '.join(unknown)}; the ways are {', '.join(WAYS)}")

    start = np.arange(N, dtype=np.float32)
    client = gpucompute.connect(args.target, client_name="bench-ops", progress=False)
    info = client.info()
    print(f"server {args.target}: backend {info.backend}, {args.ops} operations a way")
    header = f"{'way':<11} {'ops/s':>10} {'µs/op':>8}"
    if args.backend_independent:
        header += f" {'client CPU µs/op':>17}"
    print(header)
    failed = False
    for way in ways:
        ops = args.ops - args.ops % CHAIN_STEPS if way == "chain" else args.ops
        x = client.put(start)
        by_submit(client, x, 10)  # warm: the connection, the server's first plans
        wall, cpu = time.perf_counter(), time.process_time()
        result = WAYS[way](client, x, ops)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        x.delete()
        expected = start + np.float32(10 + ops)
        line = f"{way:<11} {ops / wall:>10,.0f} {wall / ops * 1e6:>8.1f}"
        if args.backend_independent:
            line += f" {cpu / ops * 1e6:>17.1f}"
        if not np.array_equal(result, expected):
            line += "  WRONG: differs from NumPy"
            failed = True
        print(line, flush=True)
    client.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
