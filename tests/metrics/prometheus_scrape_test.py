#!/usr/bin/env python3
"""A real Prometheus scrapes a real gpucompute-server under a small load, and the series
are checked through Prometheus's HTTP query API: what an operator's dashboards see.

Usage: prometheus_scrape_test.py SERVER_BIN CLI_BIN
Exit 0 when every check passes, 1 when one fails, 77 (skipped, with the reason) where
Prometheus cannot run (not installed, or it does not start here).
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

SKIP = 77
# The load: per client, one random fill, ELEMENTWISE evaluations, REDUCES reductions and
# one download of N float64 values.
CLIENTS = ("alice", "bob")
N = 50000
ELEMENTWISE = 6
REDUCES = 3


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(SKIP)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


class Failures:
    def __init__(self):
        self.passed = 0
        self.failed = []

    def check(self, ok, what):
        if ok:
            self.passed += 1
            print(f"ok    {what}")
        else:
            self.failed.append(what)
            print(f"FAIL  {what}")


def start_server(server_bin, work):
    log = open(os.path.join(work, "server.log"), "w+")
    proc = subprocess.Popen([server_bin, "--backend=cpu", "--cpu-threads=1", "--memory-limit=256MiB",
                             "--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0"],
                            stderr=log, stdout=log, text=True)
    deadline = time.time() + 20
    grpc_port = metrics_port = None
    while time.time() < deadline and (grpc_port is None or metrics_port is None):
        log.seek(0)
        text = log.read()
        m = re.search(r"listening on port (\d+)", text)
        grpc_port = int(m.group(1)) if m else None
        m = re.search(r"metrics on port (\d+)", text)
        metrics_port = int(m.group(1)) if m else None
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    if grpc_port is None or metrics_port is None:
        proc.kill()
        log.seek(0)
        raise RuntimeError(f"gpucompute-server did not start: {log.read()}")
    return proc, grpc_port, metrics_port


def start_prometheus(prometheus, work, metrics_port):
    config = os.path.join(work, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: gpucompute
    static_configs:
      - targets: ["127.0.0.1:{metrics_port}"]
""")
    for _ in range(3):
        port = free_port()
        log = open(os.path.join(work, "prometheus.log"), "w+")
        proc = subprocess.Popen([prometheus, f"--config.file={config}",
                                 f"--storage.tsdb.path={os.path.join(work, 'data')}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=log)
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return proc, port
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.2)
        proc.kill()
        proc.wait()
        log.seek(0)
        reason = log.read()[-2000:]
    skip(f"prometheus does not start here: {reason}")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    server_bin, cli_bin = sys.argv[1:]
    prometheus = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)
    if prometheus is None:
        skip("prometheus is not installed (Debian's prometheus package; deploy/install-deps.sh installs it)")
    version = subprocess.run([prometheus, "--version"], capture_output=True, text=True)
    if version.returncode != 0:
        skip(f"prometheus does not run here: {version.stderr.strip()}")

    work = tempfile.mkdtemp(prefix="prometheus_scrape_test.")
    procs = []
    try:
        server, grpc_port, metrics_port = start_server(server_bin, work)
        procs.append(server)
        prom, prom_port = start_prometheus(prometheus, work, metrics_port)
        procs.append(prom)
        print(f"server gRPC {grpc_port}, metrics {metrics_port}; prometheus {prom_port}")
        env = dict(os.environ, GPUCOMPUTE_SERVER=f"127.0.0.1:{grpc_port}")

        def cli(client, *args):
            r = subprocess.run([cli_bin, "--client", client, *args], capture_output=True, text=True, env=env)
            if r.returncode != 0:
                raise RuntimeError(f"gpucompute {' '.join(args)}: exit {r.returncode}: {r.stderr}")

        def query(expr):
            url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            body = http_json(url)
            if body.get("status") != "success":
                raise RuntimeError(f"query {expr}: {body}")
            return {json.dumps(r["metric"], sort_keys=True): float(r["value"][1]) for r in body["data"]["result"]}

        def scalar(expr):
            values = query(expr)
            return next(iter(values.values())) if len(values) == 1 else None

        def wait_for(expr, value, seconds):
            deadline = time.time() + seconds
            while time.time() < deadline and scalar(expr) != value:
                time.sleep(0.2)

        # A scrape of the idle server first, so that the counters' rise is seen.
        wait_for('gpucompute_operations_total{kind="elementwise",outcome="succeeded"}', 0, 30)
        # The load, spread over a few seconds so that several scrapes see it grow.
        for client in CLIENTS:
            cli(client, "rand", "uniform", "--shape", str(N), "--dtype", "float64", "--seed", "1", "--name", "x")
        for i in range(ELEMENTWISE):
            for client in CLIENTS:
                cli(client, "eval", "sin(x) * 2 + 1", "x=x", "--name", f"y{i}")
            time.sleep(0.3)
        for i in range(REDUCES):
            for client in CLIENTS:
                cli(client, "reduce", "sum", f"y{i}")
        for client in CLIENTS:
            cli(client, "get", "y0", "-o", os.path.join(work, f"{client}.npy"))

        # Wait until a scrape after the load has been ingested.
        expected_elementwise = ELEMENTWISE * len(CLIENTS)
        wait_for('gpucompute_downloaded_bytes_total', 8 * N * len(CLIENTS), 30)

        f = Failures()
        f.check(scalar('up{job="gpucompute"}') == 1, 'up{job="gpucompute"} is 1')
        targets = http_json(f"http://127.0.0.1:{prom_port}/api/v1/targets")["data"]["activeTargets"]
        f.check(len(targets) == 1 and targets[0]["health"] == "up" and targets[0]["lastError"] == "",
                f"the target scrapes cleanly ({[(t['health'], t['lastError']) for t in targets]})")
        by_kind = {json.loads(k).get("kind"): v for k, v in
                   query('sum by (kind) (gpucompute_operations_total{outcome="succeeded"})').items()}
        want = {"elementwise": expected_elementwise, "reduce": REDUCES * len(CLIENTS), "random": len(CLIENTS),
                "download": len(CLIENTS), "upload": 0, "gemv": 0}
        for kind, n in want.items():
            f.check(by_kind.get(kind) == n, f"operations_total{{kind={kind},outcome=succeeded}} = {n} "
                                            f"(got {by_kind.get(kind)})")
        f.check(scalar('sum(gpucompute_operations_total{outcome="failed"})') == 0, "no failed operations")
        f.check(scalar('gpucompute_operation_device_seconds_count{kind="elementwise"}') == expected_elementwise,
                "device-time histogram counts every elementwise operation")
        f.check(scalar('gpucompute_operation_latency_seconds_count{kind="reduce"}') == REDUCES * len(CLIENTS),
                "latency histogram counts every reduction")
        p50 = scalar('histogram_quantile(0.5, gpucompute_operation_latency_seconds_bucket{kind="elementwise"})')
        f.check(p50 is not None and 0 < p50 < 10, f"histogram_quantile(0.5) of elementwise latency is {p50} s")
        f.check(scalar('gpucompute_operation_read_bytes_total{kind="elementwise"}') == 8 * N * expected_elementwise,
                "bytes read by elementwise operations")
        f.check(scalar('gpucompute_downloaded_bytes_total') == 8 * N * len(CLIENTS), "bytes downloaded")
        buffers = {json.loads(k)["client"]: v for k, v in query('gpucompute_buffers{device="0"}').items()}
        # x, y0..y5 and one result per reduction.
        per_client = 1 + ELEMENTWISE + REDUCES
        f.check(buffers == {c: per_client for c in CLIENTS}, f"buffers per client {buffers}")
        f.check(scalar('sum(gpucompute_buffer_bytes)') ==
                len(CLIENTS) * (8 * N * (1 + ELEMENTWISE) + 8 * REDUCES), "buffer bytes")
        f.check(scalar('gpucompute_memory_limit_bytes') == 256 * 2**20, "memory limit")
        f.check(scalar('gpucompute_pool_used_bytes{device="0"}') is not None, "pool usage per device")
        f.check(scalar('gpucompute_operations_queued{device="0"}') == 0 and
                scalar('gpucompute_operations_running{device="0"}') == 0, "nothing queued or running when idle")
        f.check(scalar('gpucompute_build_info{backend="cpu",api="gpucompute.v1"}') == 1, "build info")
        f.check((scalar('gpucompute_uptime_seconds') or 0) > 0, "uptime")
        f.check((scalar('process_resident_memory_bytes') or 0) > 2**20, "process resident memory")
        f.check((scalar('increase(gpucompute_operations_total{kind="elementwise",outcome="succeeded"}[1m])')
                 or 0) > 0, "increase() over the scrapes")
        meta = http_json(f"http://127.0.0.1:{prom_port}/api/v1/metadata?metric=gpucompute_operation_device_seconds")
        entries = meta["data"].get("gpucompute_operation_device_seconds", [])
        f.check(len(entries) == 1 and entries[0]["type"] == "histogram" and entries[0]["help"],
                f"metadata: type and help of gpucompute_operation_device_seconds ({entries})")
        print(f"{f.passed} passed, {len(f.failed)} failed")
        return 1 if f.failed else 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
