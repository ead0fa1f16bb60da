#!/usr/bin/env python3
"""What HAProxy in front of the replicas costs: the same measurements directly and through
the proxy, in one run, for each of its two routes.

Two replicas (gpucompute-0 and gpucompute-1), each on its own device when --gpus names
them (CUDA_VISIBLE_DEVICES), each holding one tenant, placed by deploy/placement.py,
with HAProxy in front on the configuration placement.py writes; all on loopback. For
each replica, `gpucompute bench` runs directly against it and then through the proxy
(as its tenant, so that the proxy routes to it): upload and download GB/s per transport
and size (median of --repeat after one warm-up), and the p50 of --latency Submit(wait)
calls of the smallest operation. The table puts the two side by side: throughput as
proxy/direct (target: at least 0.90) and latency as proxy minus direct (target: at most
50 us).

The routes (--route, default both, one after the other on replicas of their own):
  h2   plaintext replicas; HAProxy terminates HTTP/2 and routes each call on its
       gpucompute-tenant header.
  sni  TLS replicas (a test CA and a certificate for *.gpu.test made by openssl); the
       client connects with TLS under the server name TENANT.gpu.test, directly and
       through HAProxy, which passes the connection through to the replica untouched.
--haproxy-global LINE (repeatable) adds LINE to the global section of the generated
configuration, after placement.py's own lines (a later tune line wins), and
--haproxy-defaults LINE to its defaults section, for tuning experiments, e.g.
--haproxy-global 'tune.bufsize 262144' --haproxy-defaults 'http-reuse never'.

Cores of their own (--cpus PLAN): each process runs on its own CPUs (taskset, from
util-linux), so that HAProxy's threads do not take turns with the servers' and the
client's on the same cores; the direct measurements run with the same pinning, so
direct and proxy stay comparable. HAProxy gets `nbthread N` (placement.py's --threads)
and `cpu-map auto:1/1-N CPUS` (one thread on each of its N CPUs) before the
--haproxy-global lines. PLAN is
  auto  the CPUs this process may run on (os.sched_getaffinity), split into four
        disjoint sets in this order: replica0 (gpucompute-0), replica1 (gpucompute-1),
        haproxy and client (the `gpucompute bench` CLI), whole physical cores each
        (hyperthreads of one core stay together). With fewer than four cores the sets
        share them, with a warning: the figures then say nothing about exclusive cores.
        It knows nothing of NUMA: on a host of several nodes, name each replica CPUs of
        its GPU's node (`nvidia-smi topo -m`) in an explicit plan.
  replica0=0-7,replica1=8-15,haproxy=16-19,client=20-27
        each set as a taskset list (commas within a set too: replica0=0-3,16-19,...).
        Sets may overlap (with a warning); HAProxy takes at most 64 CPUs.
In Kubernetes the same comes from the Guaranteed QoS class under the static CPU manager
policy (docs/operations.md). --busy-poll adds `busy-polling` (placement.py's
--busy-poll): HAProxy's threads then spin instead of sleeping, which only makes sense on
cores of their own, so it needs --cpus, as placement.py needs --threads; unpinned
(`--haproxy-global busy-polling`, as an experiment), it slowed every call
(docs/performance.md).
The pinning used heads each route's table.

Usage, from the source directory with the build in build/:
  On a 2-GPU machine:
    bench/proxy_bench.py --backend cuda --gpus 0,1
  The same with cores of their own, and HAProxy busy-polling on its cores:
    bench/proxy_bench.py --backend cuda --gpus 0,1 --cpus auto
    bench/proxy_bench.py --backend cuda --gpus 0,1 --cpus auto --busy-poll
  Anywhere, a dry run on CPU servers (the figures say little about a GPU's):
    bench/proxy_bench.py --backend cpu --sizes 16MiB,64MiB --repeat 3 --latency 500
Exit status 1 when a target is missed. Needs haproxy (deploy/install-deps.sh), and
taskset for --cpus.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "deploy"))
import cluster  # noqa: E402  (tests/deploy/cluster.py: replicas and HAProxy on loopback)

REPLICAS = ("gpucompute-0", "gpucompute-1")
ROUTES = ("h2", "sni")
SNI_SUFFIX = "gpu.test"
THROUGHPUT_TARGET = 0.90
LATENCY_TARGET_US = 50.0
# The processes --cpus places, in the order `auto` gives them CPUs.
CPU_ROLES = ("replica0", "replica1", "haproxy", "client")
# HAProxy 2.6 runs at most this many threads (MAX_THREADS in `haproxy -vv`).
HAPROXY_MAX_THREADS = 64


def parse_cpu_list(text):
    """The CPU numbers of a taskset list such as "0-3,8", sorted."""
    cpus = set()
    for item in text.split(","):
        first, sep, last = item.strip().partition("-")
        if not first.isdigit() or (sep and not last.isdigit()) or \
                (sep and int(last) < int(first)):
            raise ValueError(f"'{item}' is not a CPU number or a range N-M")
        cpus.update(range(int(first), int(last if sep else first) + 1))
    return sorted(cpus)


def cpu_ranges(cpus):
    """The ranges of sorted CPU numbers: [0, 1, 2, 3, 8] -> ["0-3", "8"]."""
    ranges = []
    for cpu in cpus:
        if ranges and ranges[-1][1] == cpu - 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return [f"{a}-{b}" if a != b else f"{a}" for a, b in ranges]


def cpu_list(cpus):
    """A taskset list of sorted CPU numbers: [0, 1, 2, 3, 8] -> "0-3,8"."""
    return ",".join(cpu_ranges(cpus))


def physical_cores(cpus, sysfs_cpu="/sys/devices/system/cpu"):
    """`cpus` grouped by physical core (a core's hyperthreads together), in the order of
    each core's lowest CPU; one CPU a core where the kernel does not say."""
    cores = {}
    for cpu in cpus:
        try:
            with open(os.path.join(sysfs_cpu, f"cpu{cpu}", "topology", "thread_siblings_list")) as f:
                siblings = tuple(c for c in parse_cpu_list(f.read()) if c in cpus)
        except (OSError, ValueError):
            siblings = (cpu,)
        cores.setdefault(siblings or (cpu,), None)
    return sorted(cores, key=min)


def split(items, parts):
    """`items` in `parts` consecutive runs, the first ones longer by one where they do
    not divide evenly."""
    base, extra = divmod(len(items), parts)
    runs, start = [], 0
    for i in range(parts):
        runs.append(items[start:start + base + (i < extra)])
        start += base + (i < extra)
    return runs


def auto_cpu_plan(online, sysfs_cpu="/sys/devices/system/cpu"):
    """{role: CPUs} splitting the CPUs `online` into one disjoint set a role, by whole
    physical cores where there are enough; and a warning where the sets must share."""
    online = sorted(online)
    cores = physical_cores(online, sysfs_cpu)
    if len(cores) >= len(CPU_ROLES):
        sets = [sorted(c for core in run for c in core) for run in split(cores, len(CPU_ROLES))]
        warning = None
    elif len(online) >= len(CPU_ROLES):
        sets = split(online, len(CPU_ROLES))
        warning = (f"only {len(cores)} physical cores (CPUs {cpu_list(online)}) for "
                   f"{len(CPU_ROLES)} sets: they share cores, a hyperthread each")
    else:
        sets = [[online[i % len(online)]] for i in range(len(CPU_ROLES))]
        warning = (f"only {len(online)} CPUs ({cpu_list(online)}) for {len(CPU_ROLES)} sets: "
                   "they share CPUs, so HAProxy, the servers and the client still compete")
    plan = dict(zip(CPU_ROLES, sets))
    plan["haproxy"] = plan["haproxy"][:HAPROXY_MAX_THREADS]
    return plan, warning


def parse_cpu_plan(value, online):
    """{role: sorted CPUs} of --cpus (auto, or ROLE=LIST,... for every role), and a
    warning or None; ValueError says what is wrong."""
    if value == "auto":
        return auto_cpu_plan(online)
    plan, role = {}, None
    for item in value.split(","):
        name, sep, cpus = item.partition("=")
        if sep:
            role = name.strip()
            if role not in CPU_ROLES:
                raise ValueError(f"'{role}' is not one of {', '.join(CPU_ROLES)}")
            if role in plan:
                raise ValueError(f"{role} is given twice")
            plan[role] = []
        elif role is None:
            raise ValueError(f"'{item}' follows no ROLE= (e.g. replica0=0-7)")
        else:
            cpus = item
        plan[role] = sorted(set(plan[role]) | set(parse_cpu_list(cpus)))
    missing = [r for r in CPU_ROLES if r not in plan]
    if missing:
        raise ValueError(f"no CPUs for {', '.join(missing)} (every one of "
                         f"{', '.join(CPU_ROLES)} needs a set)")
    for role, cpus in plan.items():
        outside = [c for c in cpus if c not in online]
        if outside:
            raise ValueError(f"{role}: CPUs {cpu_list(outside)} are not among the CPUs this "
                             f"process may use ({cpu_list(online)})")
    if len(plan["haproxy"]) > HAPROXY_MAX_THREADS:
        raise ValueError(f"haproxy: {len(plan['haproxy'])} CPUs, more than HAProxy's "
                         f"{HAPROXY_MAX_THREADS} threads")
    shared = sorted({c for a in CPU_ROLES for b in CPU_ROLES if a < b
                     for c in set(plan[a]) & set(plan[b])})
    warning = (f"the sets share CPUs {cpu_list(shared)}: the processes on them compete"
               if shared else None)
    return plan, warning


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-bin", default=os.path.join(SOURCE_DIR, "build", "server",
                                                             "gpucompute-server"))
    parser.add_argument("--cli-bin", default=os.path.join(SOURCE_DIR, "build", "client",
                                                          "gpucompute"))
    parser.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--gpus", default="",
                        help="devices of the two replicas, e.g. 0,1 (default: not set)")
    parser.add_argument("--sizes", default="64MiB,256MiB,1GiB")
    parser.add_argument("--repeat", default="5")
    parser.add_argument("--latency", default="2000", help="Submit(wait) calls timed")
    parser.add_argument("--transport", default="grpc,grpc-parallel")
    parser.add_argument("--memory-limit", default="",
                        help="each server's --memory-limit (default: the server's)")
    parser.add_argument("--route", default="both", choices=ROUTES + ("both",),
                        help="the proxy's route measured (default: both, one after the other)")
    parser.add_argument("--haproxy-global", action="append", default=[], metavar="LINE",
                        help="a line added to the generated configuration's global section "
                             "(repeatable), e.g. 'tune.bufsize 262144'")
    parser.add_argument("--haproxy-defaults", action="append", default=[], metavar="LINE",
                        help="a line added to the generated configuration's defaults section "
                             "(repeatable), e.g. 'http-reuse never'")
    parser.add_argument("--cpus", metavar="PLAN",
                        help="pin each process to its own CPUs with taskset: 'auto' (the "
                             "online CPUs split into four sets) or "
                             "'replica0=0-7,replica1=8-15,haproxy=16-19,client=20-27'; "
                             "HAProxy gets nbthread and cpu-map for its set (default: not "
                             "pinned)")
    parser.add_argument("--busy-poll", action="store_true",
                        help="HAProxy's threads spin on their CPUs (busy-polling); needs "
                             "--cpus, which gives them CPUs of their own")
    args = parser.parse_args()
    args.gpus = args.gpus.split(",") if args.gpus else []
    if args.gpus and len(args.gpus) != len(REPLICAS):
        parser.error(f"--gpus needs {len(REPLICAS)} devices, one a replica")
    for flag in ("global", "defaults"):
        if any("\n" in line or not line.strip() for line in getattr(args, "haproxy_" + flag)):
            parser.error(f"--haproxy-{flag} takes one non-empty configuration line")
    args.routes = ROUTES if args.route == "both" else (args.route,)
    args.online = sorted(os.sched_getaffinity(0))
    args.plan, args.plan_warning = {}, None
    if args.busy_poll and args.cpus is None:
        parser.error("--busy-poll needs --cpus: HAProxy's threads spin on their CPUs at all "
                     "times, and without CPUs of their own they take turns with the servers "
                     "and the client")
    if args.cpus is not None:
        if shutil.which("taskset") is None:
            parser.error("--cpus needs taskset (util-linux), which is not installed")
        try:
            args.plan, args.plan_warning = parse_cpu_plan(args.cpus, args.online)
        except ValueError as e:
            parser.error(f"--cpus: {e}")
    return args


def placement_flags(args):
    """The flags of `placement.py haproxy` for --cpus and --busy-poll: one thread for each
    of HAProxy's CPUs, spinning with --busy-poll."""
    if not args.plan:
        return []
    return ["--threads", str(len(args.plan["haproxy"]))] + (["--busy-poll"] if args.busy_poll else [])


def haproxy_global_lines(args):
    """The line --cpus adds to HAProxy's global section beside placement.py's: cpu-map's
    auto: binds thread i to the i-th CPU of the set (HAProxy requires the two sets to be
    of one size)."""
    if not args.plan:
        return []
    cpus = args.plan["haproxy"]
    return [f"cpu-map auto:1/1-{len(cpus)} {' '.join(cpu_ranges(cpus))}"]


def pinning(args):
    """The pinning used, in words, for the head of each route's table."""
    if not args.plan:
        pinned = f"not pinned: every process may run on CPUs {cpu_list(args.online)}"
    else:
        plan = args.plan
        pinned = (f"pinned with taskset: {REPLICAS[0]} on CPUs {cpu_list(plan['replica0'])}, "
                  f"{REPLICAS[1]} on {cpu_list(plan['replica1'])}, HAProxy on "
                  f"{cpu_list(plan['haproxy'])} (nbthread {len(plan['haproxy'])}; "
                  f"{haproxy_global_lines(args)[0]}), "
                  f"the bench client on {cpu_list(plan['client'])}")
        if args.plan_warning:
            pinned += f" (warning: {args.plan_warning})"
    return pinned + ("; HAProxy busy-polling" if args.busy_poll else "")


def with_section_lines(config, section, lines):
    """`config` with `lines` added at the end of its `section` ("global" or "defaults",
    each followed by another section)."""
    follows = {"global": "\ndefaults\n", "defaults": "\nfrontend "}[section]
    head, sep, tail = config.partition(follows)
    if not sep:
        raise RuntimeError(f"the generated configuration has no section after {section}")
    return head.rstrip("\n") + "".join(f"\n    {line.strip()}" for line in lines) + "\n\n" + \
        sep.lstrip("\n") + tail


def plan_cpus(args, role):
    """The taskset list of `role`'s CPUs, or None when --cpus is not given."""
    return cpu_list(args.plan[role]) if args.plan else None


def start(args, workdir, route):
    """The replicas and HAProxy for `route`, started; (replicas, proxy, the route's
    address on the proxy, tenant of each replica, the client's TLS arguments of each
    tenant)."""
    tokens = os.path.join(workdir, "tokens")
    tenants = {name: f"tenant{i}" for i, name in enumerate(REPLICAS)}
    with open(tokens, "w") as f:
        for tenant in tenants.values():
            f.write(f"bench-token-of-{tenant} {tenant}\n")
    placement = cluster.Placement(os.path.join(SOURCE_DIR, "deploy"),
                                  os.path.join(workdir, "placement.map"))
    placement.generate(tokens, list(REPLICAS))
    # generate gives the first tenant the first replica; the bench needs one a replica.
    for tenant, replica in zip(tenants.values(), REPLICAS):
        placement.move(tenant, replica)
    ports = {name: cluster.free_port() for name in REPLICAS}
    flags = [f"--backend={args.backend}", f"--tokens-file={tokens}",
             f"--placement-file={placement.table}",
             "--replica-addresses=" + ",".join(f"{n}=127.0.0.1:{p}" for n, p in ports.items())]
    if args.memory_limit:
        flags.append(f"--memory-limit={args.memory_limit}")
    proxy_port = cluster.free_port()
    proxy_address = f"127.0.0.1:{proxy_port}"
    extra, tls = [], {tenant: [] for tenant in tenants.values()}
    route_address = proxy_address
    if route == "sni":
        certs = cluster.Certificates(workdir, SNI_SUFFIX)
        flags += [f"--tls-cert={certs.cert}", f"--tls-key={certs.key}"]
        route_address = f"127.0.0.1:{cluster.free_port()}"
        extra = ["--tls-cert", certs.cert, "--tls-ca", certs.ca, "--sni-listen", route_address,
                 "--sni-suffix", SNI_SUFFIX]
        tls = {t: ["--tls-ca", certs.ca, "--tls-server-name", f"{t}.{SNI_SUFFIX}"] for t in tls}
    replicas = []
    for i, name in enumerate(REPLICAS):
        env = dict(os.environ)
        if args.gpus:
            env["CUDA_VISIBLE_DEVICES"] = args.gpus[i]
        replica = cluster.Replica(args.server_bin, name, ports[name], workdir, flags, env=env,
                                  persist=False, cpus=plan_cpus(args, f"replica{i}"))
        replicas.append(replica)
        replica.start(timeout=120)
    config = os.path.join(workdir, "haproxy.cfg")
    with open(config, "w") as f:
        generated = placement.haproxy_config(
            {r.name: r.address for r in replicas}, proxy_address, *extra, *placement_flags(args))
        global_lines = haproxy_global_lines(args) + args.haproxy_global
        f.write(with_section_lines(with_section_lines(generated, "global", global_lines),
                                   "defaults", args.haproxy_defaults))
    proxy = cluster.HAProxy(config, proxy_port, os.path.join(workdir, "haproxy.log"),
                            cpus=plan_cpus(args, "haproxy"))
    proxy.start()
    return replicas, proxy, route_address, tenants, tls


def bench(args, target, tenant, tls):
    """`gpucompute --json bench` at `target` as `tenant`, with the CLI's TLS arguments
    `tls`: its JSON document."""
    env = dict(os.environ, GPUCOMPUTE_TOKEN=f"bench-token-of-{tenant}",
               GPUCOMPUTE_TENANT=tenant)
    result = subprocess.run(
        cluster.pinned([args.cli_bin, "--server", target, *tls, "--json", "bench", "--sizes",
                        args.sizes, "--repeat", args.repeat, "--transport", args.transport,
                        "--latency", args.latency], plan_cpus(args, "client")),
        capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"bench at {target} as {tenant}: exit {result.returncode}: "
                           f"{result.stderr.strip()}")
    return json.loads(result.stdout)


def table(rows):
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                     for row in rows)


def verdict(ok):
    return "ok" if ok else "MISSED"


def report(results):
    """The table of every replica's direct and proxied figures, and whether each meets
    its target; True when all do."""
    met = True
    rows = [["replica", "transport", "size", "way", "direct GB/s", "proxy GB/s",
             "proxy/direct", f">= {THROUGHPUT_TARGET:.2f}"]]
    latency_rows = [["replica", "direct p50 us", "proxy p50 us", "proxy - direct us",
                     f"<= {LATENCY_TARGET_US:.0f}", "direct p99 us", "proxy p99 us"]]
    for replica, (direct, proxied) in results.items():
        for d, p in zip(direct["results"], proxied["results"]):
            for way in ("upload", "download"):
                ratio = p[f"{way}_gbps"] / d[f"{way}_gbps"]
                met &= ratio >= THROUGHPUT_TARGET
                rows.append([replica, d["transport"], f"{d['size_bytes'] / 2**20:g} MiB", way,
                             f"{d[f'{way}_gbps']:.3g}", f"{p[f'{way}_gbps']:.3g}",
                             f"{ratio:.3f}", verdict(ratio >= THROUGHPUT_TARGET)])
        dl, pl = direct["latency"], proxied["latency"]
        added = pl["p50_us"] - dl["p50_us"]
        met &= added <= LATENCY_TARGET_US
        latency_rows.append([replica, f"{dl['p50_us']:.1f}", f"{pl['p50_us']:.1f}",
                             f"{added:.1f}", verdict(added <= LATENCY_TARGET_US),
                             f"{dl['p99_us']:.1f}", f"{pl['p99_us']:.1f}"])
    print(table(rows))
    print()
    print(table(latency_rows))
    return met


ROUTE_TITLES = {
    "h2": "h2 route (HTTP/2 terminated, routed on the gpucompute-tenant header; plaintext)",
    "sni": "sni route (TLS passed through, routed on the server name TENANT.gpu.test; TLS "
           "directly too)",
}


def measure(args, route):
    """Every replica's figures directly and through `route`, printed; whether every
    target is met."""
    workdir = tempfile.mkdtemp(prefix="gpucompute_proxy_bench_")
    replicas, proxy = [], None
    try:
        replicas, proxy, address, tenants, tls = start(args, workdir, route)
        results = {}
        for replica in replicas:
            tenant = tenants[replica.name]
            results[replica.name] = (bench(args, replica.address, tenant, tls[tenant]),
                                     bench(args, address, tenant, tls[tenant]))
        backend = next(iter(results.values()))[0]["backend"]
        print(f"== {ROUTE_TITLES[route]}\n"
              f"{backend} backend, {len(replicas)} replicas"
              + (f" on devices {','.join(args.gpus)}" if args.gpus else "")
              + f"; median of {args.repeat} after one warm-up; Submit(wait) of x + 1 on one "
              f"element, {args.latency} calls; HAProxy at {address}"
              + "".join(f"; global {line}" for line in args.haproxy_global)
              + "".join(f"; defaults {line}" for line in args.haproxy_defaults) + "\n"
              + pinning(args) + "\n")
        met = report(results)
        print()
        return met
    finally:
        if proxy is not None:
            proxy.stop()
        for replica in replicas:
            replica.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    args = parse_args()
    if cluster.find_haproxy() is None:
        sys.exit("haproxy is not installed (deploy/install-deps.sh installs it)")
    if args.plan_warning:
        print(f"warning: --cpus {args.cpus}: {args.plan_warning}", file=sys.stderr)
    missed = [route for route in args.routes if not measure(args, route)]
    print(f"some target MISSED on the {' and '.join(missed)} route{'s' * (len(missed) > 1)}"
          if missed else "every target met")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
