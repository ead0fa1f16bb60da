#!/usr/bin/env python3
"""Tenants placed on replicas behind HAProxy, on one machine (issue 32's steps 1-7).

Three CPU-backend servers, each with its own persist directory and periodic snapshots,
tokens for four tenants and the placement table from deploy/placement.py, HAProxy in
front with the configuration placement.py writes. Then, through the proxy unless said
otherwise:
  1. every tenant creates, uploads, submits, runs a session (the CLI's `run`) and
     downloads; one tenant uploads and downloads an array over 2 GiB; every result is
     checked with NumPy, and lands on the tenant's owner (its ListBuffers, asked
     directly);
  2. a direct call to another replica is answered FAILED_PRECONDITION with the owner's
     address, and the clients follow it;
  3. a tenant header that is not the token's tenant is refused and changes nothing;
  4. kill -9 of a replica: UNAVAILABLE for its tenants only; restarted, it has their
     named buffers back byte for byte;
  5. a fourth replica and a fifth tenant, the table regenerated and everything
     reloaded: every existing id still works, the new tenant lands on the new replica;
  6. a tenant moved to the new replica as docs/operations.md says keeps its named
     buffers, and the CLI's memory stays below the moved bytes (the export streams).
Then the SNI route (TLS passed through to the replicas, routed on the ClientHello's
server name TENANT.SUFFIX), on two TLS replicas of their own behind a second HAProxy,
with certificates made by openssl for *.SUFFIX:
  7. each tenant's upload, submit and download by the Python client and the CLI, each
     with its TLS server name set to TENANT.SUFFIX, land on its owner, checked with
     NumPy: the proxy routes on the server name, so each client sends it as SNI;
  8. a server name the table does not route (an unknown tenant, another suffix, none)
     is refused with UNAVAILABLE and changes nothing; an upload a replica refuses while
     it is being sent reaches the client with the server's code and message;
  9. a tenant reaching another tenant's replica through the route is redirected, and
     the clients follow to its owner;
 10. kill -9 of a replica: UNAVAILABLE for its tenants only, through the SNI route too.

Usage: sharded_test.py SERVER_BIN CLI_BIN SOURCE_DIR [--sni-only]
(--sni-only runs steps 7-10 alone.)
With GPUCOMPUTE_TEST_BACKEND=cuda the servers run the CUDA backend, replica i on device
i modulo the devices $GPUCOMPUTE_TEST_GPUS lists (default 0,1; CUDA_VISIBLE_DEVICES).
Exit 0 when every check passes, 1 when one fails, 77 (skipped, with the reason) where
HAProxy is not installed (deploy/install-deps.sh installs it).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import grpc
import numpy as np

import cluster as loopback  # tests/deploy/cluster.py, beside this file

SKIP = 77
# The whole test, bounded: it stops itself before CTest's timeout would.
TIME_LIMIT_SECONDS = 280
# The large upload: int32 values i % 1009 - 504, just over 2 GiB. The servers' memory
# limit is over twice that: one tenant may reserve half of it for uploads under way.
BIG_ELEMENTS = (2 << 30) // 4 + 1024 * 1024
# A buffer of the moved tenant, large beside the CLI's own memory.
MOVED_BYTES = 96 << 20
SNAPSHOT_INTERVAL = "2s"
TENANTS = ("alpha", "bravo", "charlie", "delta")


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(SKIP)


class Checks:
    """Each check prints ok or FAIL and its description; failures are kept for the end."""

    def __init__(self):
        self.results = []

    def check(self, ok, what):
        self.results.append((bool(ok), what))
        print(f"{'ok  ' if ok else 'FAIL'}  {what}", flush=True)
        return ok

    def failed(self):
        return [what for ok, what in self.results if not ok]


def token_of(tenant):
    return f"token-of-{tenant}-0123456789"


def big_chunk(start, stop):
    """Elements [start, stop) of the large array, by tiling one period."""
    period = np.arange(-504, 505, dtype=np.int32)
    offset = start % len(period)
    return np.tile(period, (offset + stop - start) // len(period) + 1)[offset:offset + stop - start]


def write_big_npy(path):
    """The large array as an .npy file, written a chunk at a time."""
    header = np.lib.format.header_data_from_array_1_0(np.zeros(0, np.int32))
    header["shape"] = (BIG_ELEMENTS,)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        for start in range(0, BIG_ELEMENTS, 1 << 26):
            f.write(big_chunk(start, min(BIG_ELEMENTS, start + (1 << 26))).tobytes())


def big_matches(path):
    array = np.load(path, mmap_mode="r")
    if array.shape != (BIG_ELEMENTS,) or array.dtype != np.int32:
        return False
    for start in range(0, BIG_ELEMENTS, 1 << 26):
        stop = min(BIG_ELEMENTS, start + (1 << 26))
        if not np.array_equal(array[start:stop], big_chunk(start, stop)):
            return False
    return True


class Cluster:
    """The replicas, the table, HAProxy and the clients' ways in."""

    def __init__(self, server_bin, cli_bin, source_dir, workdir):
        self.begin(cli_bin, source_dir, workdir, TENANTS)
        names = [f"gpucompute-{i}" for i in range(4)]
        ports = {name: loopback.free_port() for name in names}
        # Every replica knows the fourth's address from the start: adding it needs no
        # restart of the others.
        self.make_replicas(server_bin, ports, ["--memory-limit=5GiB",
                                                f"--snapshot-interval={SNAPSHOT_INTERVAL}"])

    def make_replicas(self, server_bin, ports, flags, persist=True):
        """The replicas ({name: port}), on $GPUCOMPUTE_TEST_BACKEND (default cpu), with
        `flags` beside those every replica has, and the proxy in front of them."""
        backend = os.environ.get("GPUCOMPUTE_TEST_BACKEND") or "cpu"
        gpus = (os.environ.get("GPUCOMPUTE_TEST_GPUS") or "0,1").split(",")
        flags = [f"--backend={backend}", "--cpu-threads=1", f"--tokens-file={self.tokens}",
                 f"--placement-file={self.placement.table}",
                 "--replica-addresses=" + ",".join(f"{n}=127.0.0.1:{p}" for n, p in ports.items()),
                 *flags]
        self.replicas = {}
        for i, (name, port) in enumerate(ports.items()):
            env = dict(os.environ)
            if backend == "cuda":
                env["CUDA_VISIBLE_DEVICES"] = gpus[i % len(gpus)]
            self.replicas[name] = loopback.Replica(server_bin, name, port, self.workdir, flags,
                                                   env=env, persist=persist)
        self.proxy_port = loopback.free_port()
        self.proxy_address = f"127.0.0.1:{self.proxy_port}"
        self.haproxy = loopback.HAProxy(os.path.join(self.workdir, "haproxy.cfg"),
                                       self.proxy_port, os.path.join(self.workdir, "haproxy.log"))

    def begin(self, cli_bin, source_dir, workdir, tenants):
        """The tokens file of `tenants` and the table's path, in `workdir`."""
        self.cli_bin = cli_bin
        self.workdir = workdir
        self.tokens = os.path.join(workdir, "tokens")
        self.tenants = list(tenants)
        self.write_tokens()
        self.placement = loopback.Placement(os.path.join(source_dir, "deploy"),
                                           os.path.join(workdir, "placement.map"))

    def write_tokens(self):
        with open(self.tokens, "w") as f:
            for tenant in self.tenants:
                f.write(f"{token_of(tenant)} {tenant}\n")

    def serving(self, count):
        return {name: replica for name, replica in list(self.replicas.items())[:count]}

    def write_haproxy_config(self, count):
        config = self.placement.haproxy_config(
            {name: r.address for name, r in self.serving(count).items()},
            self.proxy_address)
        with open(self.haproxy.config_path, "w") as f:
            f.write(config)

    def start(self):
        self.placement.generate(self.tokens, list(self.serving(3)))
        for replica in self.serving(3).values():
            replica.start()
        self.write_haproxy_config(3)
        self.haproxy.start()

    def stop(self):
        self.haproxy.stop()
        for replica in self.replicas.values():
            replica.stop()

    def owner(self, tenant):
        return self.replicas[self.placement.rows()[tenant]]

    def connect(self, tenant, address=None, *, token_tenant=None):
        """The Python client as `tenant` (its header), with the token of `token_tenant`
        (default: the same), through the proxy or to `address`."""
        import gpucompute
        return gpucompute.connect(address or self.proxy_address,
                                  token=token_of(token_tenant or tenant), tenant=tenant,
                                  transport="grpc", timeout=60)

    def cli(self, tenant, *args, address=None):
        """Runs the CLI as `tenant`: (exit code, stdout, stderr, peak memory in bytes)."""
        env = dict(os.environ, GPUCOMPUTE_TENANT=tenant, GPUCOMPUTE_TOKEN=token_of(tenant))
        paths = [os.path.join(self.workdir, f"cli.{what}") for what in ("out", "err", "peak")]
        with open(paths[0], "w") as out, open(paths[1], "w") as err:
            code = subprocess.call(
                [sys.executable, "-c", PEAK_MEMORY, paths[2], self.cli_bin, "--server",
                 address or self.proxy_address, *args], stdout=out, stderr=err, env=env)
        with open(paths[0]) as out, open(paths[1]) as err, open(paths[2]) as peak:
            return code, out.read(), err.read(), int(peak.read() or 0)


# Runs argv[2:] and writes its peak resident memory in bytes to argv[1]. A child's peak
# counts what it inherited at the fork, so the program is started from this small
# process rather than from the test, which has held gigabytes.
PEAK_MEMORY = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss * 1024))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def raw_list(address, tenant, *, token_tenant=None, ca=None):
    """ListBuffers over a bare channel, following nothing (with TLS verified by the PEM
    file `ca` when given): the response, or the RpcError."""
    from gpucompute._proto import v1
    if ca is None:
        channel = grpc.insecure_channel(address)
    else:
        with open(ca, "rb") as f:
            channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(f.read()))
    with channel:
        call = channel.unary_unary("/gpucompute.v1.BufferService/ListBuffers",
                                   request_serializer=v1.ListBuffersRequest.SerializeToString,
                                   response_deserializer=v1.ListBuffersResponse.FromString)
        metadata = [("authorization", f"Bearer {token_of(token_tenant or tenant)}"),
                    ("gpucompute-tenant", tenant)]
        try:
            return call(v1.ListBuffersRequest(), metadata=metadata, timeout=30)
        except grpc.RpcError as error:
            return error


def served_again(cluster, tenant, gpucompute, timeout=30):
    """Whether a call for `tenant` through the proxy succeeds within `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with cluster.connect(tenant) as client:
                client.buffers()
            return True
        except gpucompute.Error:
            time.sleep(0.5)
    return False


def named_ids(response):
    return {b.name: b.id for b in response.buffers if b.name}


def main():
    if len(sys.argv) not in (4, 5) or sys.argv[4:] not in ([], ["--sni-only"]):
        print(__doc__)
        return 2
    server_bin, cli_bin, source_dir = sys.argv[1:4]
    if loopback.find_haproxy() is None:
        skip("haproxy is not installed (deploy/install-deps.sh installs it)")
    sys.path.insert(0, os.path.join(source_dir, "client", "python"))
    import gpucompute
    signal.signal(signal.SIGALRM, lambda *_: sys.exit(
        f"FAIL  the test ran past its {TIME_LIMIT_SECONDS} s limit"))
    signal.alarm(TIME_LIMIT_SECONDS)

    f = Checks()
    clusters = [(Cluster, run_steps), (SniCluster, run_sni_steps)]
    for make, steps in clusters[1:] if sys.argv[4:] else clusters:
        workdir = tempfile.mkdtemp(prefix="gpucompute_sharded_")
        cluster = make(server_bin, cli_bin, source_dir, workdir)
        try:
            cluster.start()
            steps(cluster, f, gpucompute)
        except Exception as error:  # a step that cannot go on fails the test, with why
            f.check(False, f"the steps ran to the end ({type(error).__name__}: {error})")
            for name, replica in cluster.replicas.items():
                if replica.process is not None:
                    print(f"--- {name}'s log (last lines)\n" + replica.read_log()[-3000:])
            if os.path.exists(cluster.haproxy.log):
                print("--- HAProxy's log (last lines)\n" + cluster.haproxy.read_log()[-3000:])
        finally:
            cluster.stop()
            shutil.rmtree(workdir, ignore_errors=True)
    failed = f.failed()
    print(f"{len(f.results) - len(failed)} checks passed, {len(failed)} failed")
    for what in failed:
        print(f"  failed: {what}")
    return 1 if failed else 0


def run_steps(cluster, f, gpucompute):
    rows = cluster.placement.rows()
    f.check(sorted(rows) == sorted(TENANTS) and
            sorted(rows.values()).count("gpucompute-0") == 2 and
            set(rows.values()) == {"gpucompute-0", "gpucompute-1", "gpucompute-2"},
            f"placement.py spread four tenants over three replicas: {rows}")
    rng = np.random.default_rng(32)
    expected = {}  # tenant -> {name: array}
    ids = {}  # tenant -> {name: id}

    # 1. Each tenant's create, upload, submit, session and download, through the proxy.
    for index, tenant in enumerate(TENANTS):
        x = rng.uniform(-3, 3, 1000 + index)
        with cluster.connect(tenant) as client:
            client.put(x, name="x")
            client.create((3, 4), "int64", fill=5 + index, name="z")
            client.eval("x * 2 + 1", {"x": "x"}, name="y")
            top = client.reduce("max", "x").value
        run_file = os.path.join(cluster.workdir, f"{tenant}.run")
        with open(run_file, "w") as script:
            script.write("@m reduce max x\neval 'x - m' x=x m=tag:m --name centered\n")
        code, out, err, _ = cluster.cli(tenant, "run", run_file)
        f.check(code == 0, f"{tenant}: a session through the proxy ran ({err.strip()})")
        expected[tenant] = {"x": x, "z": np.full((3, 4), 5 + index, np.int64),
                            "y": x * 2 + 1, "centered": x - x.max()}
        with cluster.connect(tenant) as client:
            got = {name: client.download(name) for name in expected[tenant]}
            f.check(top == x.max(),
                    f"{tenant}: reduce max through the proxy is NumPy's")
        for name, want in expected[tenant].items():
            f.check(got[name].dtype == want.dtype and np.array_equal(got[name], want),
                    f"{tenant}: {name} downloaded through the proxy equals NumPy's")
        owner = cluster.owner(tenant)
        listed = raw_list(owner.address, tenant)
        ids[tenant] = named_ids(listed) if not isinstance(listed, grpc.RpcError) else {}
        f.check(sorted(ids[tenant]) == sorted(expected[tenant]),
                f"{tenant}: its buffers are on its owner {owner.name}: {sorted(ids[tenant])}")

    # The large upload and download, streamed by the CLI through the proxy.
    big = os.path.join(cluster.workdir, "big.npy")
    write_big_npy(big)
    code, out, err, _ = cluster.cli("alpha", "--json", "put", big)
    f.check(code == 0, f"alpha: a {os.path.getsize(big)}-byte upload went through the proxy "
                       f"({err.strip()})")
    if code != 0:
        raise RuntimeError("the large upload failed")
    big_id = json.loads(out)["buffer"]["id"]
    with cluster.connect("alpha") as client:
        total = int(client.reduce("sum", big_id).value)
    want_total = sum(int(big_chunk(s, min(BIG_ELEMENTS, s + (1 << 26))).sum(dtype=np.int64))
                     for s in range(0, BIG_ELEMENTS, 1 << 26))
    f.check(total == want_total, f"alpha: the sum of the large array is NumPy's ({total})")
    os.remove(big)
    code, _, err, _ = cluster.cli("alpha", "get", big_id, "-o", big)
    f.check(code == 0 and big_matches(big),
            f"alpha: the large array came back through the proxy byte for byte ({err.strip()})")
    os.remove(big)
    with cluster.connect("alpha") as client:
        client.delete(big_id)

    # 2. A direct call to another replica: redirected to the owner, and followed.
    for tenant in TENANTS:
        owner = cluster.owner(tenant)
        other = next(r for r in cluster.serving(3).values() if r is not owner)
        answer = raw_list(other.address, tenant)
        trailing = dict(answer.trailing_metadata() or ()) if isinstance(answer,
                                                                       grpc.RpcError) else {}
        f.check(isinstance(answer, grpc.RpcError) and
                answer.code() == grpc.StatusCode.FAILED_PRECONDITION and
                answer.details() ==
                f"tenant {tenant} is placed on replica {owner.name} at {owner.address}, not on "
                f"this replica ({other.name}); call it there, or through the proxy that routes "
                "on the table" and
                trailing.get("gpucompute-redirect-address") == owner.address and
                trailing.get("gpucompute-redirect-replica") == owner.name,
                f"{tenant}: {other.name} redirects it to {owner.name} "
                f"({getattr(answer, 'code', lambda: 'OK')()})")
        with cluster.connect(tenant, other.address) as client:
            try:
                got, error = client.download("x"), ""
            except gpucompute.Error as e:
                got, error = None, e
            f.check(got is not None and np.array_equal(got, expected[tenant]["x"]),
                    f"{tenant}: the Python client followed the redirect from {other.name} "
                    f"{error}")
        code, out, err, _ = cluster.cli(tenant, "ls", address=other.address)
        f.check(code == 0 and "centered" in out,
                f"{tenant}: the CLI followed the redirect from {other.name} ({err.strip()})")

    # 3. A spoofed tenant header: refused before anything happens, through the proxy and
    # directly.
    before = {t: raw_list(cluster.owner(t).address, t) for t in TENANTS}
    for address in (cluster.proxy_address, cluster.owner("bravo").address):
        with cluster.connect("bravo", address, token_tenant="alpha") as client:
            try:
                client.create((2,), "float64", name="spoofed")
                f.check(False, f"a spoofed header at {address} was refused")
            except gpucompute.Error as error:
                f.check(error.code == grpc.StatusCode.PERMISSION_DENIED and
                        error.details == "metadata 'gpucompute-tenant' names another tenant "
                        "than this call's credentials (alpha); send 'gpucompute-tenant: alpha' "
                        "or none", f"a spoofed header at {address} was refused: {error}")
    after = {t: raw_list(cluster.owner(t).address, t) for t in TENANTS}
    f.check(all(named_ids(before[t]) == named_ids(after[t]) for t in TENANTS),
            "the spoofed calls changed no tenant's buffers")

    # 4. kill -9 of the replica of a tenant it holds alone; a restart brings its named
    # buffers back.
    victim = next(cluster.replicas[name] for name in set(rows.values())
                  if list(rows.values()).count(name) == 1)
    victims = [t for t in TENANTS if rows[t] == victim.name]
    for tenant in victims:
        files = {f"{i}.gpcbuf" for i in ids[tenant].values()}
        deadline = time.monotonic() + 30
        while not files <= set(os.listdir(victim.persist_dir)) and time.monotonic() < deadline:
            time.sleep(0.2)
    time.sleep(0.5)
    victim.kill9()
    for tenant in TENANTS:
        with cluster.connect(tenant) as client:
            try:
                ok = np.array_equal(client.download("x"), expected[tenant]["x"])
                code = None
            except gpucompute.Error as error:
                ok, code = False, error.code
        if tenant in victims:
            f.check(code == grpc.StatusCode.UNAVAILABLE,
                    f"{tenant}: UNAVAILABLE while its replica {victim.name} is down ({code})")
        else:
            f.check(ok, f"{tenant}: unaffected while {victim.name} is down")
    victim.start()
    # HAProxy checks a replica every 2 s and takes it back after two good checks.
    f.check(served_again(cluster, victims[0], gpucompute),
            f"{victim.name} is back in the proxy within 30 s of its restart")
    for tenant in victims:
        listed = raw_list(victim.address, tenant)
        f.check(not isinstance(listed, grpc.RpcError) and named_ids(listed) == ids[tenant],
                f"{tenant}: the restarted {victim.name} restored its named buffers with their ids")
        with cluster.connect(tenant) as client:
            for name, want in expected[tenant].items():
                got = client.download(name)
                f.check(got.tobytes() == want.tobytes(),
                        f"{tenant}: {name} is back byte for byte after kill -9 and a restart")

    # 5. A fourth replica and a fifth tenant; the table regenerated, everything reloaded.
    cluster.tenants.append("echo")
    cluster.write_tokens()
    cluster.placement.generate(cluster.tokens, list(cluster.replicas))
    new_rows = cluster.placement.rows()
    f.check({t: new_rows[t] for t in TENANTS} == rows and new_rows["echo"] == "gpucompute-3",
            f"placement.py kept every row and put the new tenant on gpucompute-3: {new_rows}")
    fourth = cluster.replicas["gpucompute-3"]
    fourth.start()
    for replica in cluster.serving(3).values():
        replica.reload()
    cluster.write_haproxy_config(4)
    cluster.haproxy.reload()
    time.sleep(1)  # the servers' SIGHUP reload runs on their own thread
    for tenant in TENANTS:
        with cluster.connect(tenant) as client:
            for name, buffer_id in ids[tenant].items():
                got = client.download(buffer_id)
                f.check(got.tobytes() == expected[tenant][name].tobytes(),
                        f"{tenant}: {buffer_id} ({name}) still works after the fourth replica")
    with cluster.connect("echo") as client:
        client.put(np.arange(5.0), name="e")
    listed = raw_list(fourth.address, "echo")
    f.check(not isinstance(listed, grpc.RpcError) and "e" in named_ids(listed),
            "echo's buffer landed on gpucompute-3")

    # 6. Moving a tenant, as docs/operations.md says: export, move the row, reload the
    # new replica, import, reload HAProxy, delete the old copies, reload the old replica.
    moved = "bravo"
    old = cluster.owner(moved)
    with cluster.connect(moved) as client:
        client.put(rng.standard_normal(MOVED_BYTES // 8), name="large")
        expected[moved]["large"] = client.download("large")
    code, _, err, baseline = cluster.cli(moved, "ls", address=old.address)
    export_dir = os.path.join(cluster.workdir, "export-bravo")
    code, out, err, export_peak = cluster.cli(moved, "tenant", "export", export_dir,
                                              address=old.address)
    f.check(code == 0, f"{moved}: exported from {old.name}: {out.strip()} {err.strip()}")
    cluster.placement.move(moved, fourth.name)
    fourth.reload()
    time.sleep(1)
    code, out, err, import_peak = cluster.cli(moved, "tenant", "import", export_dir,
                                              address=fourth.address)
    f.check(code == 0, f"{moved}: imported into {fourth.name}: {out.strip()} {err.strip()}")
    f.check(max(export_peak, import_peak) < baseline + MOVED_BYTES // 2,
            f"export and import streamed: peak memory {export_peak >> 20} and "
            f"{import_peak >> 20} MiB beside {baseline >> 20} MiB for ls, moving "
            f"{MOVED_BYTES >> 20} MiB")
    cluster.write_haproxy_config(4)
    cluster.haproxy.reload()
    with cluster.connect(moved, old.address) as client:
        for info in client.buffers():
            client.delete(info.id)
    listed = raw_list(old.address, moved)
    f.check(not isinstance(listed, grpc.RpcError) and not listed.buffers,
            f"{moved}: the old copies on {old.name} are deleted")
    old.reload()
    time.sleep(1)
    listed = raw_list(fourth.address, moved)
    f.check(not isinstance(listed, grpc.RpcError) and
            sorted(named_ids(listed)) == sorted(expected[moved]),
            f"{moved}: its named buffers are on {fourth.name}")
    with cluster.connect(moved) as client:
        for name, want in expected[moved].items():
            f.check(client.download(name).tobytes() == want.tobytes(),
                    f"{moved}: {name} kept its bytes through the move")
    answer = raw_list(old.address, moved)
    f.check(isinstance(answer, grpc.RpcError) and
            answer.code() == grpc.StatusCode.FAILED_PRECONDITION,
            f"{moved}: {old.name} now redirects it to {fourth.name}")


SNI_SUFFIX = "gpu.test"
SNI_TENANTS = ("alpha", "bravo", "charlie")
# An upload of more than half of it is refused at its header (the default
# --max-reserved-fraction-per-tenant) while the client is still sending.
SNI_MEMORY_LIMIT = 64 << 20


class SniCluster(Cluster):
    """Two TLS replicas behind an HAProxy with both routes: the header route (TLS to the
    proxy and from it to the replicas) and the SNI route, passing TLS through."""

    def __init__(self, server_bin, cli_bin, source_dir, workdir):
        self.begin(cli_bin, source_dir, workdir, SNI_TENANTS)
        self.certs = loopback.Certificates(workdir, SNI_SUFFIX)
        ports = {f"gpucompute-{i}": loopback.free_port() for i in range(2)}
        self.make_replicas(server_bin, ports, [f"--tls-cert={self.certs.cert}",
                                               f"--tls-key={self.certs.key}",
                                               f"--memory-limit={SNI_MEMORY_LIMIT}"], persist=False)
        self.sni_address = f"127.0.0.1:{loopback.free_port()}"

    def start(self):
        self.placement.generate(self.tokens, list(self.replicas))
        self.placement.run("check", "--tokens", self.tokens, "--replicas", ",".join(self.replicas),
                           "--table", self.placement.table, "--sni-suffix", SNI_SUFFIX)
        for replica in self.replicas.values():
            replica.start()
        with open(self.haproxy.config_path, "w") as f:
            f.write(self.placement.haproxy_config(
                {name: r.address for name, r in self.replicas.items()}, self.proxy_address,
                "--tls-cert", self.certs.cert, "--tls-ca", self.certs.ca,
                "--sni-listen", self.sni_address, "--sni-suffix", SNI_SUFFIX))
        self.haproxy.start()
        # The SNI route follows the header route's checks: wait for their first.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
                not isinstance(raw_list(self.proxy_address, t, ca=self.certs.ca), grpc.RpcError)
                for t in self.tenants):
            time.sleep(0.2)

    def connect(self, tenant, address=None, *, server_name=None, token_tenant=None):
        """The Python client as `tenant`, by default through the SNI route as
        TENANT.SUFFIX; server_name="" sends the address's host (no SNI for an IP)."""
        import gpucompute
        name = f"{tenant}.{SNI_SUFFIX}" if server_name is None else server_name
        return gpucompute.connect(address or self.sni_address, token=token_of(token_tenant or tenant),
                                  tenant=tenant, transport="grpc", timeout=30, tls_ca=self.certs.ca,
                                  tls_server_name=name or None)

    def cli(self, tenant, *args, address=None, server_name=None):
        name = f"{tenant}.{SNI_SUFFIX}" if server_name is None else server_name
        return Cluster.cli(self, tenant, "--tls-ca", self.certs.ca, "--tls-server-name", name, *args,
                           address=address or self.sni_address)

    def listings(self):
        """{(replica, tenant): its buffers' {name: id}} of every replica, asked directly."""
        return {(name, t): named_ids(listed) if not isinstance(listed, grpc.RpcError) else listed.code()
                for name, r in self.replicas.items() for t in self.tenants
                for listed in [raw_list(r.address, t, ca=self.certs.ca)]}


def run_sni_steps(cluster, f, gpucompute):
    rows = cluster.placement.rows()
    rng = np.random.default_rng(7)
    expected = {}
    # 7. Upload, submit and download through the SNI route, by both clients.
    for index, tenant in enumerate(SNI_TENANTS):
        x = rng.uniform(-3, 3, 500 + index)
        with cluster.connect(tenant) as client:
            client.put(x, name="x")
            client.eval("x * 3 - 1", {"x": "x"}, name="y")
            top = client.reduce("max", "x").value
            got = {name: client.download(name) for name in ("x", "y")}
        f.check(top == x.max() and np.array_equal(got["x"], x) and np.array_equal(got["y"], x * 3 - 1),
                f"{tenant}: upload, submit and download by the Python client through the SNI route "
                "equal NumPy's")
        source = os.path.join(cluster.workdir, f"{tenant}-c.npy")
        c = np.arange(7 * (index + 1), dtype=np.int32).reshape(7, index + 1)
        np.save(source, c)
        code, _, err, _ = cluster.cli(tenant, "put", source, "--name", "c")
        code2, _, err2, _ = cluster.cli(tenant, "eval", "c * 2", "c=c", "--name", "d")
        code3, _, err3, _ = cluster.cli(tenant, "get", "d", "-o", source)
        f.check(code == code2 == code3 == 0 and np.array_equal(np.load(source), c * 2),
                f"{tenant}: upload, submit and download by the CLI through the SNI route equal NumPy's "
                f"({(err + err2 + err3).strip()})")
        expected[tenant] = {"c", "d", "x", "y"}
    listed = cluster.listings()
    for tenant in SNI_TENANTS:
        owner = rows[tenant]
        f.check(sorted(listed[(owner, tenant)]) == sorted(expected[tenant]),
                f"{tenant}: its buffers are on its owner {owner}: {listed[(owner, tenant)]}")

    # 8. Names the route does not know: the connection is closed, nothing changes.
    for name in (f"zulu.{SNI_SUFFIX}", "alpha.other.test", f"alpha.x.{SNI_SUFFIX}", ""):
        with cluster.connect("alpha", server_name=name) as client:
            try:
                client.create((2,), "float64", name="refused")
                error = None
            except gpucompute.Error as e:
                error = e
        f.check(error is not None and error.code == grpc.StatusCode.UNAVAILABLE and
                error.details.startswith("failed to connect to all addresses") and
                "Socket closed" in error.details,
                f"server name {name or '(none)'} is refused through the SNI route with UNAVAILABLE: {error}")
    f.check(cluster.listings() == listed, "the refused connections changed no replica's buffers")

    # An upload the server refuses while it is still being sent: through the SNI route
    # the client hears the server's own code and message, as directly (the header
    # route's HAProxy turns them into CANCELLED).
    answers = []
    for address in (cluster.sni_address, cluster.replicas[rows["alpha"]].address):
        with cluster.connect("alpha", address) as client:
            try:
                client.put(np.zeros(SNI_MEMORY_LIMIT // 8 * 3 // 4), name="too-large")
                answers.append(None)
            except gpucompute.Error as error:
                answers.append((error.code, error.details))
    f.check(answers[0] is not None and answers[0][0] == grpc.StatusCode.RESOURCE_EXHAUSTED and
            answers[0] == answers[1],
            f"an upload refused mid-stream has the server's code and message through the SNI route: "
            f"{answers}")
    f.check(cluster.listings() == listed, "the refused upload changed no replica's buffers")

    # 9. bravo under alpha's name reaches alpha's replica, which redirects it to bravo's.
    assert rows["alpha"] != rows["bravo"]
    with cluster.connect("bravo", server_name=f"alpha.{SNI_SUFFIX}") as client:
        try:
            got, error = client.download("x"), ""
        except gpucompute.Error as e:
            got, error = None, e
    f.check(got is not None and got.size == 501,
            f"bravo: the Python client followed the redirect from {rows['alpha']} reached through "
            f"the SNI route {error}")
    code, out, err, _ = cluster.cli("bravo", "ls", server_name=f"alpha.{SNI_SUFFIX}")
    f.check(code == 0 and " d " in f" {out} ".replace("\n", " "),
            f"bravo: the CLI followed the redirect from {rows['alpha']} ({err.strip()})")

    # 10. kill -9 of bravo's replica, which holds bravo alone.
    victim = cluster.replicas[rows["bravo"]]
    f.check(list(rows.values()).count(victim.name) == 1, f"{victim.name} holds bravo alone: {rows}")
    victim.kill9()
    for tenant in SNI_TENANTS:
        with cluster.connect(tenant) as client:
            try:
                ok, code = client.download("x").size == 500 + SNI_TENANTS.index(tenant), None
            except gpucompute.Error as error:
                ok, code = False, error.code
        if tenant == "bravo":
            f.check(code == grpc.StatusCode.UNAVAILABLE,
                    f"bravo: UNAVAILABLE through the SNI route while {victim.name} is down ({code})")
        else:
            f.check(ok, f"{tenant}: unaffected through the SNI route while {victim.name} is down")


if __name__ == "__main__":
    sys.exit(main())
